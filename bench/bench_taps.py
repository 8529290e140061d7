"""What a usage tap costs beside relaying the same bytes.

Prints one JSON object. For each format and mode, a realistic response (text
deltas of one token each, usage where the provider puts it) is generated, cut
into the chunks a proxy reads (one SSE event / frame per chunk for streams, as
upstreams flush them; 16 KiB for bodies), and timed:

- ``relay``: iterating the chunks and appending each to a list (the issue's
  baseline: the cheapest possible relay);
- ``relay_socket``: sending each chunk through a local socket pair and reading
  it back (closer to what a proxy pays per chunk, still no TLS or HTTP);
- ``python_floor``: one Python function call per chunk that only counts its bytes:
  the least any tap written in Python costs (the floor under ``tap``);
- ``tap``: ``open_tap`` + ``feed`` of every chunk + ``finish``.

They are interleaved in each repeat (a load spike hits all alike). Each
figure is the median over repeats of process CPU time (user + system), in
microseconds per response and per MiB of decoded bytes; ``ratio`` is
tap / relay and ``ratio_socket`` tap / relay_socket.
Both ``delta_text`` modes of the estimator are measured on streams ("parsed",
the default, parses each delta for its exact text; "payload_bytes" does not).

``relay_aiohttp`` is the issue's measure, the tap in place (``PairedRelay``): two
identical aiohttp relays side by side, one tapping and one not, the same paced
streams through both at once, roles swapped every round; ``tap_added_ratio`` is
what the tap adds to the relay's CPU (target: under 0.05). ``--relay-only`` runs
only that; ``--null-check`` (no tap on either side: should read 0) and
``--spin-us`` (a known cost instead of a tap) check the method.

    python bench/bench_taps.py [--tokens 500] [--repeats 31] [--relay-only]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import math
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web

from ingest.taps import EstimatorConfig, open_tap
from ingest.taps.eventstream import encode_message

MIB = 1 << 20
PAIR_TIMEOUT_S = 60.0
SPIN_CALIBRATION = 5_000_000
PHASES = 7  # start offsets of the upstream streams, in sevenths of the pace
SETTLE_S = 0.05
WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def _sse(event: str | None, obj: object, *, crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    head = f"event: {event}{nl}" if event else ""
    return f"{head}data: {json.dumps(obj, separators=(',', ':'))}{nl}{nl}".encode()


def anthropic(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    model = "claude-sonnet-4-5-20250929"
    usage = {"input_tokens": 1200, "cache_read_input_tokens": 0, "output_tokens": n}
    events = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        ),
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for i in range(n):
        events.append(
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": WORDS[i % 10]},
                },
            )
        )
        if i % 50 == 0:
            events.append(_sse("ping", {"type": "ping"}))
    events += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    body = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "".join(WORDS[i % 10] for i in range(n))}],
        "stop_reason": "end_turn",
        "usage": usage,
    }
    request: dict[str, object] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    return request, events, json.dumps(body).encode()


def openai_chat(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    base = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1741569952,
        "model": "gpt-4o-2024-08-06",
        "service_tier": "default",
        "system_fingerprint": "fp_f9f4fb6dbf",
    }
    events = [
        _sse(
            None,
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": "", "refusal": None},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "usage": None,
            },
        )
    ]
    for i in range(n):
        events.append(
            _sse(
                None,
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": WORDS[i % 10]},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    "usage": None,
                    "obfuscation": "xQ3",
                },
            )
        )
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": n,
        "total_tokens": 1200 + n,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    events += [
        _sse(
            None,
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                "usage": None,
            },
        ),
        _sse(None, {**base, "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]
    body = {
        **base,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "".join(WORDS[i % 10] for i in range(n)),
                },
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }
    request: dict[str, object] = {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    return request, events, json.dumps(body).encode()


def openai_responses(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    resp = {
        "id": "resp_67c9fdcecf488190bdd9a0409de3a1ec",
        "object": "response",
        "created_at": 1741290958,
        "status": "in_progress",
        "model": "gpt-4.1-2025-04-14",
        "output": [],
        "usage": None,
    }
    text = "".join(WORDS[i % 10] for i in range(n))
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1200 + n,
    }
    item = {
        "id": "msg_67c9fdcf37fc8190ba82116e33fb28c5",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    events = [
        _sse(
            "response.created", {"type": "response.created", "sequence_number": 0, "response": resp}
        ),
        _sse(
            "response.in_progress",
            {"type": "response.in_progress", "sequence_number": 1, "response": resp},
        ),
    ]
    for i in range(n):
        events.append(
            _sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 2,
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": WORDS[i % 10],
                    "logprobs": [],
                    "obfuscation": "k3Xq9a",
                },
            )
        )
    done = {**resp, "status": "completed", "output": [item], "usage": usage}
    events += [
        _sse(
            "response.output_text.done",
            {"type": "response.output_text.done", "item_id": item["id"], "text": text},
        ),
        _sse("response.output_item.done", {"type": "response.output_item.done", "item": item}),
        _sse("response.completed", {"type": "response.completed", "response": done}),
    ]
    request: dict[str, object] = {"model": "gpt-4.1", "stream": True, "input": "Tell me a story."}
    return request, events, json.dumps(done).encode()


def gemini(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    events = []
    step = 8  # Gemini streams several tokens per chunk
    for i in range(0, n, step):
        text = "".join(WORDS[k % 10] for k in range(i, min(n, i + step)))
        last = i + step >= n
        chunk: dict[str, object] = {
            "candidates": [
                {
                    "content": {"parts": [{"text": text}], "role": "model"},
                    "index": 0,
                    **({"finishReason": "STOP"} if last else {}),
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 1200,
                "candidatesTokenCount": min(n, i + step),
                "totalTokenCount": 1200 + min(n, i + step),
            },
            "modelVersion": "gemini-2.5-flash",
            "responseId": "mGpAaO2tG4SnqtsP_4qB8Q4",
        }
        events.append(_sse(None, chunk, crlf=True))
    body = {
        "candidates": [
            {
                "content": {
                    "parts": [{"text": "".join(WORDS[i % 10] for i in range(n))}],
                    "role": "model",
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 1200,
            "candidatesTokenCount": n,
            "totalTokenCount": 1200 + n,
        },
        "modelVersion": "gemini-2.5-flash",
    }
    request: dict[str, object] = {
        "contents": [{"role": "user", "parts": [{"text": "Tell me a story."}]}]
    }
    return request, events, json.dumps(body).encode()


def bedrock(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    def frame(event: str, payload: dict[str, object]) -> bytes:
        return encode_message(
            {":event-type": event, ":content-type": "application/json", ":message-type": "event"},
            json.dumps({**payload, "p": "abcdefghijkl"}).encode(),
        )

    usage = {"inputTokens": 1200, "outputTokens": n, "totalTokens": 1200 + n}
    events = [frame("messageStart", {"role": "assistant"})]
    for i in range(n):
        events.append(
            frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": WORDS[i % 10]}})
        )
    events += [
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("messageStop", {"stopReason": "end_turn"}),
        frame("metadata", {"usage": usage, "metrics": {"latencyMs": 1500}}),
    ]
    body = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [{"text": "".join(WORDS[i % 10] for i in range(n))}],
            }
        },
        "stopReason": "end_turn",
        "usage": usage,
        "metrics": {"latencyMs": 1500},
    }
    request: dict[str, object] = {
        "messages": [{"role": "user", "content": [{"text": "Tell me a story."}]}],
        "inferenceConfig": {"maxTokens": 4096},
    }
    return request, events, json.dumps(body).encode()


BUILDERS: dict[str, Callable[[int], tuple[dict[str, object], list[bytes], bytes]]] = {
    "anthropic-messages": anthropic,
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "gemini": gemini,
    "bedrock-converse": bedrock,
}


def _relay(chunks: list[bytes]) -> None:
    out: list[bytes] = []
    for chunk in chunks:
        out.append(chunk)


def _relay_socket(chunks: list[bytes], pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    for chunk in chunks:
        a.sendall(chunk)
        remaining = len(chunk)
        while remaining:
            remaining -= len(b.recv(65536))


def _python_floor(chunks: list[bytes]) -> None:
    seen = [0]

    def feed(chunk: bytes) -> None:
        seen[0] += len(chunk)

    for chunk in chunks:
        feed(chunk)


def _tap(
    fmt: str,
    request: dict[str, object] | bytes,
    chunks: list[bytes],
    streaming: bool,
    config: EstimatorConfig,
    encoding: str | None = None,
) -> None:
    tap = open_tap(fmt, request, streaming=streaming, content_encoding=encoding, estimator=config)
    for chunk in chunks:
        tap.feed(chunk)
    result = tap.finish()
    assert result.usage_source == "reported", result


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process in ns, read from outside (``schedstat``): the
    relay spends nothing on being measured, and the clock is exact, not in 10 ms ticks."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as stat:
            total += int(stat.read().split()[0])
    return total


def _may_run_realtime() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except (PermissionError, AttributeError):
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def _spread(values: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {
        "min": round(min(values), 4),
        "q1": round(quartiles[0], 4),
        "median": round(statistics.median(values), 4),
        "q3": round(quartiles[2], 4),
        "max": round(max(values), 4),
    }


class PairedRelay:
    """The tap where a proxy runs it: inside an aiohttp pass-through, measured in pairs.

    Two identical relays (forked processes: aiohttp server + ClientSession forwarding each
    response with ``iter_any``/``write``, feeding a tap per request path or not) run at
    the same time. The upstream (an aiohttp server in this process) answers the two
    relays' requests of one stream with one loop that writes each chunk to both, then
    sleeps (``pace``), so both relays get the same chunks at the same instants. Each round
    one relay taps and the other does not; the roles swap the next round. A round's ratio
    is CPU(tapping relay) / CPU(plain relay) over that round, both read from
    ``/proc/<pid>/task/*/schedstat`` (ns, from outside: the relays spend nothing on it);
    the figure is the median over swapped round pairs of the geometric mean of their two
    ratios, minus 1 (``tap_added_ratio``): whatever makes one relay cheaper than the other
    (its core, its process) cancels.

    Layout (``relay_cores``): ``split`` (default) puts each relay on a core of its own,
    the client with the first; ``same`` puts both relays on the last core, the client on
    the others. On one core the relays share its caches: the tapping relay's working set
    (the held chunks, the tap's code) evicts the plain relay's, part of the tap's cost is
    billed to the plain relay, and on a quiet machine the tap read 3-7 % *cheaper* than no
    tap; split, each pays for its own misses, and the fixed difference between the two
    cores cancels in the pairs. The relays run SCHED_RR alike where allowed (the one woken
    first runs first, and other processes do not delay them: under normal scheduling the
    relay with less CPU so far ran first, and the other one batched more reads).

    ``chunks_per_read`` (per role: they must match, or one relay batched more than the
    other) and ``core_busy`` show the pacing held about one event per read without
    saturating a core. 127.0.0.1 only; bounded by count.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[int], tuple[dict[str, object], list[bytes], bytes]]],
        tokens: int,
        pace_s: float,
        round_chunks: int,
    ) -> None:
        self.responses: dict[str, tuple[dict[str, object], list[bytes]]] = {}
        for fmt, build in builders.items():
            request, events, _ = build(tokens)
            self.responses[fmt] = (request, events)
        self.request_bodies = {
            fmt: json.dumps(request).encode() for fmt, (request, _) in self.responses.items()
        }
        self.pace_s = pace_s
        self._pairs: dict[str, tuple[web.StreamResponse, asyncio.Future[None]]] = {}
        # responses one after another on each stream, so every format's round relays about
        # as many chunks (Gemini's 63-chunk responses would make short, noisy rounds)
        self.responses_per_stream = {
            fmt: max(1, round(round_chunks / len(events)))
            for fmt, (_, events) in self.responses.items()
        }

    # -- the upstream (this process) ----------------------------------------------------------------
    async def _upstream(self, request: web.Request) -> web.StreamResponse:
        """One stream of a pair: the two relays' requests for the same pair are answered by
        one loop that writes each chunk to both, then sleeps: both relays get every chunk
        at the same instant (the same reads), for half the upstream's timers and steps."""
        _, events = self.responses[request.match_info["fmt"]]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pair = request.match_info["pair"]
        waiting = self._pairs.pop(pair, None)
        if waiting is None:  # the first of the two: the second one streams to both
            done = asyncio.get_running_loop().create_future()
            self._pairs[pair] = (response, done)
            await asyncio.wait_for(done, PAIR_TIMEOUT_S)
            return response
        other, done = waiting
        # streams start at spread phases, as a proxy's streams do (not all in one burst);
        # which relay is written first alternates chunk by chunk
        order = itertools.cycle(((response, other), (other, response)))
        try:
            await asyncio.sleep(self.pace_s * (int(pair) % PHASES) / PHASES)
            for chunk in events:
                for target in next(order):
                    await target.write(chunk)
                await asyncio.sleep(self.pace_s)
            await response.write_eof()
            await other.write_eof()
        finally:
            done.set_result(None)
        return response

    # -- a relay (a process of its own) -------------------------------------------------------------
    def _serve_relay(
        self,
        upstream_url: str,
        core: int | None,
        realtime: bool,
        spin_us: float,
        ports: multiprocessing.SimpleQueue[int],
    ) -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})
        if realtime:  # both alike: the one woken first runs first, whatever its CPU so far
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        spin_loops = 0
        if spin_us:  # empty loop turns costing spin_us of CPU (user space only, no calls)
            started = time.process_time()
            for _ in range(SPIN_CALIBRATION):
                pass
            spin_loops = round(spin_us / 1e6 * SPIN_CALIBRATION / (time.process_time() - started))

        async def main() -> None:
            taps_reported = 0
            reads = 0
            session = aiohttp.ClientSession()

            async def relay(request: web.Request) -> web.StreamResponse:
                nonlocal taps_reported, reads
                fmt, mode = request.match_info["fmt"], request.match_info["mode"]
                tap = None
                if mode == "tap" and not spin_us:
                    # the request body as the proxy has it (bytes), read by the tap
                    tap = open_tap(fmt, self.request_bodies[fmt], streaming=True)
                spin = mode == "tap" and spin_us > 0
                count = 0
                pair = request.query["pair"]
                async with session.get(f"{upstream_url}/{fmt}/{pair}") as upstream:
                    response = web.StreamResponse(
                        headers={"Content-Type": upstream.headers["Content-Type"]}
                    )
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        count += 1
                        if tap is not None:
                            tap.feed(chunk)
                        elif spin:  # a known cost instead of a tap, to check the method
                            for _ in range(spin_loops):
                                pass
                        await response.write(chunk)
                    await response.write_eof()
                if tap is not None and tap.finish().usage_source == "reported":
                    taps_reported += 1
                reads += count
                return response

            async def stats(_: web.Request) -> web.Response:
                return web.json_response({"taps": taps_reported, "reads": reads})

            app = web.Application()
            app.router.add_get("/stats", stats)
            app.router.add_get("/{mode}/{fmt}", relay)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            ports.put(runner.addresses[0][1])
            await asyncio.Event().wait()  # until terminated

        asyncio.run(main())

    # -- the client (this process) ------------------------------------------------------------------
    async def measure(
        self,
        rounds: int,
        streams: int,
        *,
        pin: bool = True,
        split: bool = True,
        realtime: bool = True,
        null_check: bool = False,
        spin_us: float = 0.0,
    ) -> dict[str, object]:
        cpus = sorted(os.sched_getaffinity(0))
        realtime = realtime and _may_run_realtime()
        relay_cores: list[int | None] = [None, None]
        client_cores = set(cpus)
        if pin and split and len(cpus) > 1:
            relay_cores = [cpus[-2], cpus[-1]]
            client_cores = set(cpus[:-2]) or {cpus[0]}
        elif pin and len(cpus) > 1:
            relay_cores = [cpus[-1], cpus[-1]]
            client_cores = set(cpus[:-1])
        os.sched_setaffinity(0, client_cores)  # before forking: the relays set their own
        upstream = web.Application()
        upstream.router.add_get("/{fmt}/{pair}", self._upstream)
        runner = web.AppRunner(upstream, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        upstream_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        context = multiprocessing.get_context("fork")
        ports: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
        relays = [
            context.Process(
                target=self._serve_relay,
                args=(upstream_url, core, realtime, spin_us, ports),
                daemon=True,
            )
            for core in relay_cores
        ]
        for process in relays:
            process.start()
        loop = asyncio.get_running_loop()
        urls = [f"http://127.0.0.1:{await loop.run_in_executor(None, ports.get)}" for _ in relays]
        pids = [process.pid or 0 for process in relays]
        ratios: dict[str, list[float]] = {fmt: [] for fmt in self.responses}
        cpu_us: dict[str, dict[str, list[float]]] = {
            fmt: {"plain": [], "tap": []} for fmt in self.responses
        }
        busy: dict[str, list[float]] = {"relays": [], "client": []}
        reads = {fmt: {"plain": 0, "tap": 0} for fmt in self.responses}
        taps_asked = 0
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as client:

                async def relay_stats(url: str) -> dict[str, Any]:
                    async with client.get(f"{url}/stats") as r:
                        state: dict[str, Any] = await r.json()
                        return state

                serials = itertools.count()

                async def fetch(url: str, mode: str, fmt: str, pair: int) -> int:
                    async with client.get(f"{url}/{mode}/{fmt}", params={"pair": pair}) as r:
                        return len(await r.read())

                async def pair_stream(modes: tuple[str, str], fmt: str) -> list[int]:
                    """One stream through each relay, fed by the same upstream loop."""
                    sizes: list[int] = []
                    for _ in range(self.responses_per_stream[fmt]):
                        pair = next(serials)
                        sizes += await asyncio.gather(
                            *(
                                fetch(url, mode, fmt, pair)
                                for url, mode in zip(urls, modes, strict=True)
                            )
                        )
                    return sizes

                async def run(pairs: list[tuple[str, str]], fmt: str) -> None:
                    nonlocal taps_asked
                    expected = sum(map(len, self.responses[fmt][1]))
                    sizes = await asyncio.gather(*(pair_stream(modes, fmt) for modes in pairs))
                    assert all(n == expected for one in sizes for n in one), "relayed bytes differ"
                    if not spin_us:
                        taps_asked += sum(m.count("tap") for m in pairs) * len(sizes[0]) // 2

                # warm-up, not counted: imports, first taps, connections, both relays both ways
                for fmt in self.responses:
                    await run(
                        [(("tap", "plain"), ("plain", "tap"))[i % 2] for i in range(streams)], fmt
                    )
                reads_seen = [(await relay_stats(url))["reads"] for url in urls]
                for r in range(rounds):  # interleaved formats: a slow spell hits all of them
                    tapping = r % 2  # the roles swap every round
                    modes = (
                        ("plain", "plain")
                        if null_check
                        else (("tap", "plain"), ("plain", "tap"))[tapping]
                    )
                    for fmt in self.responses:
                        jobs = [modes] * streams
                        before = [_cpu_ns(pid) for pid in pids]
                        wall, client_cpu = time.perf_counter(), time.process_time()
                        await run(jobs, fmt)
                        # the client has the last bytes before a relay's handler returns:
                        # let both finish their taps and requests (an idle relay costs nothing)
                        await asyncio.sleep(SETTLE_S)
                        after = [_cpu_ns(pid) for pid in pids]
                        wall = time.perf_counter() - wall
                        client_cpu = time.process_time() - client_cpu
                        spent = [(b - a) / 1e9 for a, b in zip(before, after, strict=True)]
                        states = [await relay_stats(url) for url in urls]  # outside the window
                        reads_now = [state["reads"] for state in states]
                        reads[fmt]["tap"] += reads_now[tapping] - reads_seen[tapping]
                        reads[fmt]["plain"] += reads_now[1 - tapping] - reads_seen[1 - tapping]
                        reads_seen = reads_now
                        tap_s, plain_s = spent[tapping], spent[1 - tapping]
                        ratios[fmt].append(tap_s / plain_s)
                        responses = streams * self.responses_per_stream[fmt]
                        cpu_us[fmt]["tap"].append(tap_s / responses * 1e6)
                        cpu_us[fmt]["plain"].append(plain_s / responses * 1e6)
                        busy["relays"].append(sum(spent) / wall)
                        busy["client"].append(client_cpu / wall)
                end = [await relay_stats(url) for url in urls]
        finally:
            for process in relays:
                process.terminate()
            for process in relays:
                process.join(10)
            await runner.cleanup()
            os.sched_setaffinity(0, set(cpus))
        taps_reported = sum(state["taps"] for state in end)
        assert taps_reported == taps_asked, (taps_reported, taps_asked)  # every tap read usage
        out: dict[str, object] = {}
        responses_per_round = {fmt: streams * n for fmt, n in self.responses_per_stream.items()}
        for fmt, events in ((fmt, len(ev)) for fmt, (_, ev) in self.responses.items()):
            chunks = rounds * responses_per_round[fmt] * events
            # two rounds with the roles swapped: their geometric mean cancels whatever
            # makes one relay (its core, its process) cheaper than the other
            swapped = zip(ratios[fmt][0::2], ratios[fmt][1::2], strict=False)
            pairs = [math.sqrt(a * b) for a, b in swapped]
            row: dict[str, object] = {
                "tap_added_ratio": round(statistics.median(pairs) - 1, 4),
                "pair_spread": _spread(pairs),
                # all rounds' CPU together: sum(tapping) / sum(plain) - 1
                "tap_added_ratio_pooled": round(
                    sum(cpu_us[fmt]["tap"]) / sum(cpu_us[fmt]["plain"]) - 1, 4
                ),
                "ratio_spread": _spread(ratios[fmt]),
                "ratios": [round(x, 3) for x in ratios[fmt]],
                "relay_us": round(statistics.median(cpu_us[fmt]["plain"]), 1),
                "relay_tap_us": round(statistics.median(cpu_us[fmt]["tap"]), 1),
                "chunks_per_read": {
                    role: round(chunks / max(1, n), 3) for role, n in reads[fmt].items()
                },
                "events": events,
                "responses_per_stream": self.responses_per_stream[fmt],
            }
            if spin_us:
                plain_s = sum(cpu_us[fmt]["plain"]) * responses_per_round[fmt] / 1e6
                row["spin_expected_ratio"] = round(spin_us / 1e6 * reads[fmt]["tap"] / plain_s, 4)
            out[fmt] = row
        return {
            "relay_cores": relay_cores,
            "client_cores": sorted(client_cores),
            "relay_policy": "SCHED_RR" if realtime else "SCHED_OTHER",
            "core_busy": {name: _spread(values) for name, values in busy.items()},
            "formats": out,
        }


def _taps_compiled() -> bool:
    import ingest.taps.tap

    return Path(ingest.taps.tap.__file__ or "").suffix == ".so"


def _timed(fn: Callable[[], object]) -> float:
    """CPU seconds (user + system) of this process: the issue's target is CPU,
    and time spent descheduled on a busy machine is not the tap's cost."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, default=500, help="output tokens per response")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument(
        "--relay-rounds", type=int, default=12, help="rounds per format (even: roles swap)"
    )
    parser.add_argument(
        "--relay-streams", type=int, default=12, help="concurrent streams per relay, per round"
    )
    parser.add_argument("--pace-ms", type=float, default=2.0, help="upstream pause per chunk")
    parser.add_argument(
        "--round-chunks",
        type=int,
        default=500,
        help="chunks per stream and round (short responses run one after another)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="pin neither the relays nor the client to cores",
    )
    parser.add_argument("--relay-only", action="store_true", help="only the in-place relay measure")
    parser.add_argument(
        "--relay-cores",
        choices=("split", "same"),
        default="split",
        help="the two relays on a core each (default), or both on the last one",
    )
    parser.add_argument(
        "--no-realtime",
        action="store_true",
        help="run the relays at normal priority (default: SCHED_RR, both alike, where allowed)",
    )
    parser.add_argument(
        "--spin-us",
        type=float,
        default=0.0,
        help="check the method: the tapping relay spins this many CPU us per read instead of "
        "tapping; spin_expected_ratio says what tap_added_ratio should then be",
    )
    parser.add_argument(
        "--relay-formats", nargs="+", choices=sorted(BUILDERS), help="in place: only these"
    )
    parser.add_argument(
        "--null-check",
        action="store_true",
        help="the in-place measure with no tap on either side: its tap_added_ratio should be 0, "
        "its spread is what the method resolves",
    )
    parser.add_argument(
        "--work",
        choices=sorted(BUILDERS),
        help="run --work-responses streamed responses of this format through taps, untimed "
        "(for instruction counts that do not move with the machine's load: run under "
        "`valgrind --tool=cachegrind --cache-sim=no` with 1 and N+1 responses, "
        "PYTHONHASHSEED=0, and divide the difference by N x events)",
    )
    parser.add_argument("--work-responses", type=int, default=4)
    args = parser.parse_args()
    if args.work:
        request, events, _ = BUILDERS[args.work](args.tokens)
        body = json.dumps(request).encode()  # the request as a proxy has it, as in the relay
        for _ in range(args.work_responses):
            _tap(args.work, body, events, True, EstimatorConfig())
        print(
            json.dumps(
                {"format": args.work, "responses": args.work_responses, "events": len(events)}
            )
        )
        return
    relay_builders = {fmt: BUILDERS[fmt] for fmt in args.relay_formats or BUILDERS}
    relay = PairedRelay(relay_builders, args.tokens, args.pace_ms / 1000, args.round_chunks)
    in_relay = asyncio.run(
        relay.measure(
            args.relay_rounds,
            args.relay_streams,
            pin=not args.no_pin,
            split=args.relay_cores == "split",
            realtime=not args.no_realtime,
            null_check=args.null_check,
            spin_us=args.spin_us,
        )
    )
    relay_report = {
        "unit": "relay process CPU per response (us), medians of paired rounds; "
        "tap_added_ratio = median over rounds of CPU(tapping relay) / CPU(plain relay) - 1",
        "rounds": args.relay_rounds,
        "streams_per_relay": args.relay_streams,
        "pace_ms": args.pace_ms,
        "target_tap_added_ratio": 0.05,
        # the taps' modules run as mypyc extensions (pyproject [tool.spendbus.compiled]) or not
        "taps_compiled": _taps_compiled(),
        **in_relay,
    }
    if args.relay_only:
        relay_report["cpus"] = os.cpu_count()
        relay_report["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps({"relay_aiohttp": relay_report}, separators=(",", ":")))
        return
    pair = socket.socketpair()
    configs = {
        "parsed": EstimatorConfig(),
        "payload_bytes": EstimatorConfig(delta_text="payload_bytes"),
    }
    formats: dict[str, object] = {}
    for fmt, build in BUILDERS.items():
        request, events, body = build(args.tokens)
        gz = gzip.compress(b"".join(events))
        cases = {
            "stream": (events, True, None),
            "stream_gzip": ([gz[i : i + 4096] for i in range(0, len(gz), 4096)], True, "gzip"),
            "body": ([body[i : i + 16384] for i in range(0, len(body), 16384)], False, None),
        }
        entry: dict[str, object] = {}
        for case, (chunks, streaming, encoding) in cases.items():
            modes = configs if streaming else {"parsed": configs["parsed"]}
            samples: dict[str, list[float]] = {"relay": [], "relay_socket": [], "python_floor": []}
            samples.update({mode: [] for mode in modes})
            for _ in range(args.repeats):  # interleaved: a load spike hits all alike
                samples["relay"].append(_timed(partial(_relay, chunks)))
                samples["relay_socket"].append(_timed(partial(_relay_socket, chunks, pair)))
                samples["python_floor"].append(_timed(partial(_python_floor, chunks)))
                for mode, config in modes.items():
                    run = partial(_tap, fmt, request, chunks, streaming, config, encoding)
                    samples[mode].append(_timed(run))
            med = {name: statistics.median(values) for name, values in samples.items()}
            size = sum(len(c) for c in chunks)
            decoded = len(b"".join(events)) if encoding else size
            row: dict[str, object] = {
                "wire_bytes": size,
                "decoded_bytes": decoded,
                "chunks": len(chunks),
                "relay_us": round(med["relay"] * 1e6, 1),
                "relay_us_per_mib": round(med["relay"] / decoded * MIB * 1e6),
                "relay_socket_us": round(med["relay_socket"] * 1e6, 1),
                "python_floor_us": round(med["python_floor"] * 1e6, 1),
                "python_floor_ratio_socket": round(med["python_floor"] / med["relay_socket"], 3),
            }
            for mode in modes:
                row[mode] = {
                    "tap_us": round(med[mode] * 1e6, 1),
                    "tap_us_per_mib": round(med[mode] / decoded * MIB * 1e6),
                    "ratio": round(med[mode] / med["relay"], 1),
                    "ratio_socket": round(med[mode] / med["relay_socket"], 3),
                }
            entry[case] = row
        formats[fmt] = entry
    summary = {
        fmt: {
            mode: entry["stream"][mode]["ratio_socket"]  # type: ignore[index]
            for mode in configs
        }
        for fmt, entry in formats.items()
    }
    report = {
        "python": sys.version.split()[0],
        "tokens_per_response": args.tokens,
        "repeats": args.repeats,
        "unit": "process CPU microseconds, median of interleaved repeats; per_mib over decoded bytes",
        "summary": {
            "stream_tap_added_in_aiohttp_relay": {
                fmt: row["tap_added_ratio"]  # type: ignore[index]
                for fmt, row in in_relay["formats"].items()  # type: ignore[attr-defined]
            },
            "stream_ratio_socket": summary,
        },
        "relay_aiohttp": relay_report,
        "formats": formats,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()

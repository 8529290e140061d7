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
tap / relay and ``ratio_socket`` tap / relay_socket: what the tap adds to the
CPU of moving the bytes through a socket (the issue's target: under 0.05).
Both ``delta_text`` modes of the estimator are measured on streams ("parsed",
the default, parses each delta for its exact text; "payload_bytes" does not).
``summary`` lists ``ratio_socket`` of every streamed case side by side.

    python bench/bench_taps.py [--tokens 500] [--repeats 31]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
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
    request: dict[str, object],
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


class AiohttpRelay:
    """The tap where a proxy runs it: inside an aiohttp pass-through (server + client).

    An upstream (aiohttp server, this process) paces each response chunk by chunk, as
    providers flush tokens, so the relay reads about one event per chunk. The relay is
    a process of its own (forked: no interpreter lock shared with the upstream and the
    client) that forwards each response with ``iter_any``/``write``, feeding a tap or
    not, and reports its process CPU time on ``/cpu``. Its CPU per response is the
    measure: ``relay_aiohttp`` without a tap, ``relay_aiohttp_tap`` with one, the same
    streams in interleaved rounds. 127.0.0.1 only; bounded by count.
    """

    def __init__(
        self,
        builders: Mapping[str, Callable[[int], tuple[dict[str, object], list[bytes], bytes]]],
        tokens: int,
        pace_s: float,
    ) -> None:
        self.responses: dict[str, tuple[dict[str, object], list[bytes]]] = {}
        for fmt, build in builders.items():
            request, events, _ = build(tokens)
            self.responses[fmt] = (request, events)
        self.pace_s = pace_s

    # -- the upstream and the client (this process) ----------------------------------------------
    async def _upstream(self, request: web.Request) -> web.StreamResponse:
        _, events = self.responses[request.match_info["fmt"]]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in events:
            await response.write(chunk)
            await asyncio.sleep(self.pace_s)
        await response.write_eof()
        return response

    # -- the relay (its own process) --------------------------------------------------------------
    def _serve_relay(self, upstream_url: str, ports: multiprocessing.SimpleQueue[int]) -> None:
        async def main() -> None:
            taps_reported = 0
            session = aiohttp.ClientSession()

            async def relay(request: web.Request) -> web.StreamResponse:
                nonlocal taps_reported
                fmt = request.match_info["fmt"]
                tap = None
                if request.match_info["mode"] == "tap":
                    tap = open_tap(fmt, self.responses[fmt][0], streaming=True)
                async with session.get(f"{upstream_url}/{fmt}") as upstream:
                    response = web.StreamResponse(
                        headers={"Content-Type": upstream.headers["Content-Type"]}
                    )
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        if tap is not None:
                            tap.feed(chunk)
                        await response.write(chunk)
                    await response.write_eof()
                if tap is not None and tap.finish().usage_source == "reported":
                    taps_reported += 1
                return response

            async def cpu(_: web.Request) -> web.Response:
                return web.json_response({"cpu_s": time.process_time(), "taps": taps_reported})

            app = web.Application()
            app.router.add_get("/cpu", cpu)
            app.router.add_get("/{mode}/{fmt}", relay)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            ports.put(runner.addresses[0][1])
            await asyncio.Event().wait()  # until terminated

        asyncio.run(main())

    async def measure(self, rounds: int, streams: int) -> dict[str, object]:
        upstream = web.Application()
        upstream.router.add_get("/{fmt}", self._upstream)
        runner = web.AppRunner(upstream, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        upstream_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        context = multiprocessing.get_context("fork")
        ports: multiprocessing.SimpleQueue[int] = context.SimpleQueue()
        relay = context.Process(target=self._serve_relay, args=(upstream_url, ports), daemon=True)
        relay.start()
        loop = asyncio.get_running_loop()
        relay_url = f"http://127.0.0.1:{await loop.run_in_executor(None, ports.get)}"
        per_response: dict[str, dict[str, list[float]]] = {
            fmt: {"plain": [], "tap": []} for fmt in self.responses
        }
        try:
            async with aiohttp.ClientSession() as client:

                async def relay_state() -> dict[str, Any]:
                    async with client.get(f"{relay_url}/cpu") as r:
                        state: dict[str, Any] = await r.json()
                        return state

                async def one(mode: str, fmt: str) -> int:
                    async with client.get(f"{relay_url}/{mode}/{fmt}") as r:
                        return len(await r.read())

                for _ in range(rounds):  # interleaved: a load spike hits both alike
                    for fmt in self.responses:
                        expected = sum(map(len, self.responses[fmt][1]))
                        for mode in ("plain", "tap"):
                            before = await relay_state()
                            sizes = await asyncio.gather(*(one(mode, fmt) for _ in range(streams)))
                            after = await relay_state()
                            assert all(n == expected for n in sizes)
                            spent = after["cpu_s"] - before["cpu_s"]
                            per_response[fmt][mode].append(spent / streams)
                taps = (await relay_state())["taps"]
        finally:
            relay.terminate()
            relay.join(10)
            await runner.cleanup()
        assert taps == rounds * streams * len(self.responses), taps  # every tap read usage
        out: dict[str, object] = {}
        for fmt, modes in per_response.items():
            plain = statistics.median(modes["plain"])
            tapped = statistics.median(modes["tap"])
            out[fmt] = {
                "relay_aiohttp_us": round(plain * 1e6, 1),
                "relay_aiohttp_tap_us": round(tapped * 1e6, 1),
                "tap_added_ratio": round((tapped - plain) / plain, 3),
                "events": len(self.responses[fmt][1]),
            }
        return out


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
    parser.add_argument("--relay-rounds", type=int, default=5)
    parser.add_argument("--relay-streams", type=int, default=20, help="concurrent, per round")
    parser.add_argument("--pace-ms", type=float, default=2.0, help="upstream pause per chunk")
    parser.add_argument("--relay-only", action="store_true", help="only the aiohttp relay measure")
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
        for _ in range(args.work_responses):
            _tap(args.work, request, events, True, EstimatorConfig())
        print(
            json.dumps(
                {"format": args.work, "responses": args.work_responses, "events": len(events)}
            )
        )
        return
    relay = AiohttpRelay(BUILDERS, args.tokens, args.pace_ms / 1000)
    in_relay = asyncio.run(relay.measure(args.relay_rounds, args.relay_streams))
    relay_report = {
        "unit": "CPU microseconds of the relay's thread per response, median of rounds",
        "rounds": args.relay_rounds,
        "streams_per_round": args.relay_streams,
        "pace_ms": args.pace_ms,
        "target_tap_added_ratio": 0.05,
        # the taps' modules run as mypyc extensions (pyproject [tool.spendbus.compiled]) or not
        "taps_compiled": _taps_compiled(),
        "formats": in_relay,
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
        "target_ratio_socket": 0.05,
        "summary": {
            "stream_tap_added_in_aiohttp_relay": {
                fmt: row["tap_added_ratio"]  # type: ignore[index]
                for fmt, row in in_relay.items()
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

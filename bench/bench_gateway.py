"""What the reference gateway adds to a streamed LLM call, beside a bare aiohttp pass-through.

Prints one JSON object (and writes bench/results/gateway.json). Five processes:
the fake providers (``spendbus fake-upstream``, Anthropic SSE streams paced
chunk by chunk), a bare aiohttp pass-through proxy (``--role passthrough``:
forward the POST, relay the body with ``readany``/``write``, nothing else) and
its twin (below), the real gateway (``spendbus gateway run``: virtual key, enforcer check
against a real budget followed from Kafka, tap, publish to usage.raw, settle),
and this process as the client. The proxies share one pinned CPU; the client,
the fake providers and the Kafka broker the others (``--no-pin``: no pinning).

The paths are measured in interleaved rounds (a load spike hits all alike):
``direct`` (client -> upstream), ``passthrough``, ``twin`` and ``gateway``; each
round runs the same load on each path in turn, while a probe measures the direct
path's TTFB one stream at a time (``direct_probe_ttfb_*``: how slow the load side
itself was during that path's rounds). Per request: time to the first body
byte (TTFB) and to the last. Per round: CPU time (user + system, from /proc)
of the proxy process over the bytes it streamed. Figures are medians over
rounds of each round's percentile; ``added_ms`` compares a proxy's percentiles
with the direct ones of the same round, and ``gateway_vs_passthrough`` is the
comparison issue #6's targets are about (≤ 1.5x the pass-through's CPU per
MiB, ≤ 2 ms added TTFB p99 at ``--concurrency`` streams).

The load shape, and why. The target is the latency the gateway adds *at* 200
concurrent streams, i.e. to a request that arrives while 199 others stream.
So the main figures are a steady state: ``--concurrency`` workers, each
starting its next stream when its last one ends, their first starts spread
over one stream's length (``steady_state.ramp_s``, the direct path's median
stream time in the warm-up) so that arrivals and ends are continuous. The
TTFB percentiles count only the streams started after the ramp, when every
worker is running (``steady_state.open_at_start_min``: the fewest streams
open as a measured one began; ``measured_per_round``: how many were
measured); the ramp's streams are the warm-up. Total times and CPU cover
every stream of the round. A round's p99 over ~200 measured TTFBs is its
second-worst, so one stall moves it; ``ttfb_p99_pooled`` (and
``added_ttfb_p99_pooled_ms``) is the p99 of every round's measured TTFBs together.

How fine the latency figures are. ``twin`` is a second pass-through, the same
code in a process of its own on the same core, measured like the others (the
proxies' order turns each round): ``twin_vs_passthrough`` is what this bench
reports as "added" between two identical proxies, an A/A test. An added figure
of the gateway within that spread is not resolved by the run (``--no-twin``
skips it).

Starting all 200 at the same instant measures something else: each of the
first 200 TTFBs queues behind up to 199 admissions (accept, parse, check,
upstream connect) on one core, so its p99 is the time to admit the whole
herd. That figure is kept, apart and named: ``burst_ms`` (``--no-burst``
skips it), the TTFB of ``--concurrency`` streams started at once, one per
worker, per path and round, after the steady-state waves.

    python bench/bench_gateway.py [--concurrency 200] [--requests 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml
from aiohttp import web

from schemas.kafka import PLAINTEXT, KafkaSecurity
from spendbus.settings import load_settings

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
VIRTUAL_KEY = "vk-bench-0123456789abcdef"
PROMPT = "Summarise the retention policy of usage.raw for the finance team. " * 30


# -- the bare pass-through (its own process) ------------------------------------------------
def burn(seconds: float) -> None:
    """Spin on the CPU for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def passthrough_app(upstream: str, burn_us: float = 0.0) -> web.Application:
    """The least an aiohttp proxy can do: forward and relay, chunk by chunk.

    ``burn_us`` > 0 makes it a calibrated stand-in: it also spins that much CPU per
    request, half before forwarding and half once the response ended, where the
    gateway does its admission (check, hold) and its accounting (usage, settle)."""
    drop = {"host", "content-length", "transfer-encoding", "connection"}
    state: dict[str, aiohttp.ClientSession] = {}
    half_burn_s = burn_us / 2e6

    async def startup(_: web.Application) -> None:
        state["client"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

    async def cleanup(_: web.Application) -> None:
        await state["client"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if half_burn_s:
            burn(half_burn_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
        async with state["client"].post(
            upstream + request.path_qs, data=body, headers=headers
        ) as up:
            response = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in drop},
            )
            await response.prepare(request)
            while chunk := await up.content.readany():
                await response.write(chunk)
            await response.write_eof()
        if half_burn_s:
            burn(half_burn_s)
        return response

    app = web.Application(client_max_size=32 * MIB)
    app.router.add_post("/{tail:.*}", relay)
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    return app


# -- processes --------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer")
            await asyncio.sleep(0.2)


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


# -- the load ---------------------------------------------------------------------------------
async def one(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> tuple[float, float, int]:
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
        first = await resp.content.readany()
        ttfb = time.perf_counter() - started
        size = len(first)
        while chunk := await resp.content.readany():
            size += len(chunk)
    return ttfb * 1000, (time.perf_counter() - started) * 1000, size


async def first_byte(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> float:
    """The TTFB of one stream, in ms; the rest of the stream is not read (closed)."""
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.content.readany()
        ttfb = time.perf_counter() - started
        resp.close()
    return ttfb * 1000


async def wave(
    url: str, concurrency: int, requests: int, ramp_s: float = 0.0, probe_url: str = ""
) -> dict[str, Any]:
    """``requests`` streams, ``concurrency`` at a time, each worker starting its next
    stream as its last one ends.

    The workers start spread over ``ramp_s`` (0: all at once, the burst); with
    ``ramp_s`` about one stream's length, starts and ends are continuous and,
    once every worker has started, each new stream finds ``concurrency - 1``
    others open. Only those (started at or after ``ramp_s``) are the steady
    state's TTFB percentiles; the ramp's streams are its warm-up, left out.
    ``open_at_start`` says how many streams were open as each measured one began.

    With ``probe_url`` (the upstream), one stream at a time also goes straight to the
    upstream all through the steady state: its TTFB is the load side's own delay
    (client, upstream, whatever else runs on their cores) during this wave, the same
    measure for every path, so a path that makes the load side slower shows it.
    """
    body = json.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
        }
    ).encode()
    headers = {
        "x-api-key": VIRTUAL_KEY,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    queue = list(range(requests))
    #: (started, streams open then, ttfb ms, total ms, bytes)
    results: list[tuple[float, int, float, float, int]] = []
    open_streams = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()

        async def worker(index: int) -> None:
            nonlocal open_streams
            await asyncio.sleep(ramp_s * index / concurrency)
            while queue:
                queue.pop()
                started, open_then = time.perf_counter() - began, open_streams
                open_streams += 1
                try:
                    ttfb, total, size = await one(session, url + "/v1/messages", headers, body)
                finally:
                    open_streams -= 1
                results.append((started, open_then, ttfb, total, size))

        probes: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            await asyncio.sleep(ramp_s)
            while not done.is_set():
                probes.append(await first_byte(session, probe_url + "/v1/messages", headers, body))
                await asyncio.sleep(0.02)

        prober = asyncio.ensure_future(probe()) if probe_url else None
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        done.set()
        if prober is not None:
            await prober
    measured = [r for r in results if r[0] >= ramp_s] if ramp_s else results
    ttfb = sorted(r[2] for r in measured)
    total = sorted(r[3] for r in results)
    return {
        "ttfb_p50": pct(ttfb, 50),
        "ttfb_p99": pct(ttfb, 99),
        "ttfb_ms": ttfb,  # every measured TTFB, pooled over the rounds (not printed)
        "total_p50": pct(total, 50),
        "total_p99": pct(total, 99),
        "measured": len(measured),
        "open_at_start_min": min(r[1] for r in measured),
        "bytes": sum(r[4] for r in results),
        **({"probe_ttfb_ms": sorted(probes)} if probe_url else {}),
    }


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    index = min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))
    return values[index]


async def count_events(bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT) -> int:
    from aiokafka import AIOKafkaConsumer

    from schemas.kafka import topic_partitions

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, **security.client_kwargs()
    )
    await consumer.start()
    try:
        partitions = await topic_partitions(bootstrap, topic, security=security)
        ends = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def setup_topics(bootstrap: str, *, security: KafkaSecurity = PLAINTEXT) -> Any:
    import uuid
    from datetime import UTC, datetime

    from schemas.budgets import budgets_from_yaml
    from schemas.codec import BUDGET_POLICY, PRICE_TABLE
    from schemas.pricing import default_price_file, load_price_file
    from schemas.topics import Topics
    from spendbus.stack.compacted import publish
    from spendbus.stack.topics import ensure_topics

    topics = Topics(prefix=f"bench-gw-{uuid.uuid4().hex[:6]}.")
    await ensure_topics(bootstrap, topics, partitions=4, security=security)
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
        security=security,
    )
    # real budgets on the request's path: an org budget and a per-job ceiling
    budgets = budgets_from_yaml(
        [
            {"id": "bench-org", "scope": "org", "window": "month", "limit_usd": "1000000"},
            {"id": "bench-job", "scope": "session", "window": "total", "limit_requests": 10**9},
        ]
    )
    now = datetime.now(UTC)
    await publish(
        bootstrap,
        topics.budget_policies,
        [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets],
        security=security,
    )
    return topics


async def measure(
    args: argparse.Namespace,
    bootstrap: str,
    work: Path,
    broker_pid: int | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    from spendbus.stack.kafka import free_port

    topics = await setup_topics(bootstrap, security=security)
    up_port, pass_port, twin_port, gw_port = free_port(), free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    config = {
        "gateway_id": "bench-gateway",
        "listen": {"host": "127.0.0.1", "port": gw_port},
        "upstreams": {"anthropic": {"api": "anthropic", "base_url": upstream_url}},
        "secrets": {"sk-bench": {"upstream": "anthropic", "api_key": "bench-credential"}},
        "keys": [
            {
                "name": "bench",
                "key": VIRTUAL_KEY,
                "principal": {"org_id": "bench-org", "secret_id": "sk-bench", "user_id": "b@x.io"},
            }
        ],
        "kafka": {"bootstrap": bootstrap, "topic_prefix": topics.prefix},
        "publisher": {"spool_dir": str(work / "spool")},
    }
    config_path = work / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    procs = {
        "upstream": spawn(
            [
                "-m",
                "spendbus",
                "fake-upstream",
                "--port",
                str(up_port),
                "--chunk-latency-ms",
                str(args.chunk_latency_ms),
                "--output-tokens",
                str(args.output_tokens),
                str(args.output_tokens),
            ]
        ),
        **{
            name: spawn(
                [
                    str(Path(__file__)),
                    "--role",
                    "passthrough",
                    "--port",
                    str(port),
                    "--upstream",
                    upstream_url,
                    *(["--burn-us", str(args.twin_burn_us)] if name == "twin" else []),
                ]
            )
            for name, port in (("passthrough", pass_port), ("twin", twin_port))
            if name == "passthrough" or args.twin
        },
        "gateway": spawn(
            [
                *(["-m", "cProfile", "-o", args.profile_gateway] if args.profile_gateway else []),
                "-m",
                "spendbus",
                "gateway",
                "run",
                "--config",
                str(config_path),
                "--log-level",
                "WARNING",
            ]
        ),
    }
    pinning = pin(procs, args.pin, broker_pid)
    try:
        urls = {
            "direct": upstream_url,
            "passthrough": f"http://127.0.0.1:{pass_port}",
            **({"twin": f"http://127.0.0.1:{twin_port}"} if args.twin else {}),
            "gateway": f"http://127.0.0.1:{gw_port}",
        }
        for url in urls.values():
            await wait_http(url + "/healthz")
        pids = {path: procs[path].pid for path in urls if path != "direct"}
        side_pids = {"upstream": procs["upstream"].pid, "load": os.getpid()}
        if broker_pid is not None:
            side_pids["kafka_broker"] = broker_pid
        warm = {}
        for path, url in urls.items():  # warm up connections, imports, caches
            warm[path] = await wave(url, min(args.concurrency, 20), 40)
        rounds: dict[str, list[dict[str, Any]]] = {path: [] for path in urls}
        bursts: dict[str, list[dict[str, Any]]] = {path: [] for path in urls}
        # spreading the starts over one stream's length keeps ``concurrency`` streams
        # open with arrivals and ends all along
        ramp = warm["direct"]["total_p50"] / 1000
        proxies = [path for path in urls if path != "direct"]
        for index in range(args.rounds):
            # the proxies' order turns each round: none is always the one after another
            turn = index % len(proxies)
            for path in ["direct", *proxies[turn:], *proxies[:turn]]:
                url = urls[path]
                before = cpu_seconds(pids[path]) if path in pids else 0.0
                # the other processes' CPU in the round, on the load's cores: a busier
                # load core delays every path's client and upstream
                others_before = {name: cpu_seconds(pid) for name, pid in side_pids.items()}
                result = await wave(url, args.concurrency, args.requests, ramp, upstream_url)
                result["side_cpu_s"] = {
                    name: cpu_seconds(pid) - others_before[name] for name, pid in side_pids.items()
                }
                if path in pids:
                    cpu = cpu_seconds(pids[path]) - before
                    result["cpu_s"] = cpu
                    result["cpu_ms_per_mib"] = 1000 * cpu / (result["bytes"] / MIB)
                    result["cpu_us_per_request"] = 1e6 * cpu / args.requests
                rounds[path].append(result)
            if args.burst:
                for path, url in urls.items():
                    bursts[path].append(await wave(url, args.concurrency, args.concurrency))
        await asyncio.sleep(1.0)  # the gateway's publisher sends its last events
        events = await count_events(bootstrap, topics.usage_raw, security=security)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"{name} did not stop in 30 s: killed\n")
                proc.kill()
                proc.wait()
            if proc.returncode not in (0, -signal.SIGTERM) and proc.stderr is not None:
                sys.stderr.write(
                    f"{name} exited {proc.returncode}: {proc.stderr.read()[-2000:]!r}\n"
                )
    return {**summarise(args, rounds, bursts, events, ramp), "pinning": pinning}


def pin(
    procs: dict[str, subprocess.Popen[bytes]], enabled: bool, broker_pid: int | None
) -> dict[str, Any] | None:
    """The proxy under test on the last CPU; the load (this process), the fake provider and
    the Kafka broker on the others: on a small machine their CPU would otherwise queue the
    proxies' requests, and that queueing, not the proxy, would dominate the latency
    percentiles. The broker matters for the gateway alone (the pass-through never talks to
    it): on the gateway's CPU, every produce request woke a broker thread that preempted
    the gateway mid-send. Every thread of the broker is moved (a JVM's threads keep the
    affinity they were created with); a broker given by KAFKA_BOOTSTRAP is not ours to pin."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not enabled or len(cpus) < 2:
        return None
    proxy_cpus, load_cpus = {cpus[-1]}, set(cpus[:-1])
    for name in ("passthrough", "twin", "gateway"):
        if name in procs:
            os.sched_setaffinity(procs[name].pid, proxy_cpus)
    os.sched_setaffinity(procs["upstream"].pid, load_cpus)
    os.sched_setaffinity(0, load_cpus)
    broker = "external, not pinned"
    if broker_pid is not None:
        for task in Path(f"/proc/{broker_pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(task.name), load_cpus)
        broker = "with the load"
    return {
        "proxies": sorted(proxy_cpus),
        "load_and_upstream": sorted(load_cpus),
        "kafka_broker": broker,
    }


def summarise(
    args: argparse.Namespace,
    rounds: dict[str, list[dict[str, Any]]],
    bursts: dict[str, list[dict[str, Any]]],
    events: int,
    ramp_s: float,
) -> dict[str, Any]:
    def med(path: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[path])

    def added(
        path: str, base: str, of: dict[str, list[dict[str, Any]]] = rounds
    ) -> dict[str, float]:
        out = {}
        for key in ("ttfb_p50", "ttfb_p99", "total_p50", "total_p99"):
            out[key] = round(
                statistics.median(a[key] - b[key] for a, b in zip(of[path], of[base], strict=True)),
                2,
            )
        return out

    paths = {
        path: {
            key: round(med(path, key), 2)
            for key in (
                "ttfb_p50",
                "ttfb_p99",
                "total_p50",
                "total_p99",
                "cpu_ms_per_mib",
                "cpu_us_per_request",
            )
            if key in rounds[path][0]
        }
        for path in rounds
    }

    for path in paths:
        probes = sorted(t for r in rounds[path] for t in r.get("probe_ttfb_ms", ()))
        if probes:
            paths[path]["direct_probe_ttfb_p50"] = round(pct(probes, 50), 2)
            paths[path]["direct_probe_ttfb_p99"] = round(pct(probes, 99), 2)
            paths[path]["direct_probes"] = len(probes)
        paths[path]["side_cpu_ms_per_round"] = {
            name: round(1000 * statistics.median(r["side_cpu_s"][name] for r in rounds[path]))
            for name in rounds[path][0]["side_cpu_s"]
        }

    def pooled(path: str, p: float) -> float:
        return round(pct(sorted(t for r in rounds[path] for t in r["ttfb_ms"]), p), 2)

    # a round measures ~200 TTFBs, so its p99 is its second-worst; over the rounds pooled,
    # the p99 rests on more samples (one unlucky stall in one round moves it less)
    for path in paths:
        paths[path]["ttfb_p99_pooled"] = pooled(path, 99)

    def versus_passthrough(path: str, ratio_digits: int) -> dict[str, Any]:
        """``path``'s figures less the pass-through's, round by round and pooled."""
        vs = added(path, "passthrough")
        return {
            "added_ttfb_p50_ms": vs["ttfb_p50"],
            "added_ttfb_p99_ms": vs["ttfb_p99"],
            "added_total_p99_ms": vs["total_p99"],
            "added_ttfb_p99_pooled_ms": round(pooled(path, 99) - pooled("passthrough", 99), 2),
            "added_ttfb_p99_per_round_ms": [
                round(a["ttfb_p99"] - b["ttfb_p99"], 2)
                for a, b in zip(rounds[path], rounds["passthrough"], strict=True)
            ],
            "cpu_per_mib_ratio": round(
                med(path, "cpu_ms_per_mib") / med("passthrough", "cpu_ms_per_mib"), ratio_digits
            ),
            # CPU spent per request beyond relaying it (for the gateway: check, tap,
            # publish, settle): less sensitive to a loaded machine than the latencies
            "added_cpu_us_per_request": round(
                med(path, "cpu_us_per_request") - med("passthrough", "cpu_us_per_request")
            ),
        }

    mib_per_round = round(statistics.median(r["bytes"] for r in rounds["gateway"]) / MIB, 2)
    vs_pass = versus_passthrough("gateway", 2)
    # the twin: an A/A test (the resolution of the gateway's added latencies in this run),
    # or, with --twin-burn-us, what that much CPU per request alone adds
    twin = (
        {"twin_burn_us_per_request": args.twin_burn_us, **versus_passthrough("twin", 3)}
        if args.twin
        else {}
    )
    resolution = None
    if twin and args.twin_burn_us == 0:
        resolution = round(
            max(abs(twin["added_ttfb_p99_ms"]), abs(twin["added_ttfb_p99_pooled_ms"])), 2
        )
    burst: dict[str, Any] = {}
    if args.burst:
        burst_vs_pass = added("gateway", "passthrough", bursts)
        burst = {
            "burst_ms": {
                "what": f"{args.concurrency} streams started at once, TTFB of every one",
                **{
                    path: {
                        key: round(statistics.median(r[key] for r in bursts[path]), 2)
                        for key in ("ttfb_p50", "ttfb_p99")
                    }
                    for path in bursts
                },
                "gateway_vs_passthrough": {
                    "added_ttfb_p50_ms": burst_vs_pass["ttfb_p50"],
                    "added_ttfb_p99_ms": burst_vs_pass["ttfb_p99"],
                },
            }
        }
    requests = (args.requests + (args.concurrency if args.burst else 0)) * args.rounds + 40
    return {
        "bench": "gateway",
        "concurrency": args.concurrency,
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "steady_state": {
            "ramp_s": round(ramp_s, 2),
            "measured_per_round": min(r["measured"] for rs in rounds.values() for r in rs),
            "open_at_start_min": min(r["open_at_start_min"] for rs in rounds.values() for r in rs),
        },
        "stream": {
            "format": "anthropic-messages SSE",
            "output_tokens": args.output_tokens,
            "chunk_latency_ms": args.chunk_latency_ms,
            "mib_per_round": mib_per_round,
        },
        "paths_ms": paths,
        "added_ms": {path: added(path, "direct") for path in paths if path != "direct"},
        "gateway_vs_passthrough": {
            **vs_pass,
            "target_cpu_ratio": 1.5,
            "target_added_p99_ms": 2.0,
            "cpu_target_met": vs_pass["cpu_per_mib_ratio"] <= 1.5,
            # judged only when two identical pass-throughs differ by less than the target
            # (else the run cannot tell 2 ms from noise: None)
            "latency_resolution_ms": resolution,
            "latency_target_met": (
                vs_pass["added_ttfb_p99_ms"] <= 2.0
                if resolution is not None and resolution <= 2.0
                else None
            ),
        },
        **({"twin_vs_passthrough": twin} if twin else {}),
        **burst,
        "events_published": events,
        "events_expected": requests,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--requests", type=int, default=400, help="Requests per path per round.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output-tokens", type=int, default=100, help="Per streamed answer.")
    # ~17 SSE events a second per stream: a model streaming ~50 tokens/s
    parser.add_argument("--chunk-latency-ms", type=float, default=60.0)
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Proxies on one CPU, the load and the fake provider on the others.",
    )
    parser.add_argument(
        "--burst",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also measure --concurrency streams started at once (reported apart).",
    )
    parser.add_argument(
        "--twin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also measure a second, identical pass-through: what the bench calls added "
        "latency between two identical proxies (its resolution), reported apart.",
    )
    parser.add_argument(
        "--twin-burn-us",
        type=float,
        default=0.0,
        help="The twin also spins this much CPU per request (half at admission, half at "
        "the end): what that much added CPU alone does to the latencies.",
    )
    parser.add_argument("--role", choices=["bench", "passthrough"], default="bench")
    parser.add_argument("--burn-us", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default="")
    parser.add_argument(
        "--profile-gateway",
        default="",
        help="Run the gateway under cProfile and write its stats here (slows it down: "
        "for finding where its time goes, not for the figures).",
    )
    args = parser.parse_args()
    if args.role == "passthrough":
        app = passthrough_app(args.upstream, args.burn_us)
        app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
        web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)
        return

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
    security = load_settings().kafka_security if bootstrap else PLAINTEXT
    if not bootstrap:
        from spendbus.stack.kafka import LocalKafka, ensure_broker_jars

        ensure_broker_jars()
        broker = LocalKafka(data_dir=Path(tempfile.mkdtemp(prefix="bench-kafka-")), port=0)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gateway-") as work:
            broker_pid = broker.pid if broker is not None else None
            result = asyncio.run(
                measure(args, bootstrap, Path(work), broker_pid, security=security)
            )
    finally:
        if broker is not None:
            broker.stop()
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

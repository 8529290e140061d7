"""What the reference gateway adds to a streamed LLM call, beside a bare aiohttp pass-through.

Prints one JSON object (and writes it to bench/results/gateway.json, or --out). Five processes:
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

This script runs the rounds; the pieces: ``gateway_passthrough`` (the bare proxy),
``gateway_load`` (the streams and their timings), ``gateway_stack`` (processes, pinning,
topics) and ``gateway_report`` (the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.gateway_load import MIB, VIRTUAL_KEY, wave
from bench.gateway_passthrough import serve_passthrough
from bench.gateway_report import summarise
from bench.gateway_stack import count_events, cpu_seconds, pin, setup_topics, spawn, wait_http
from runtime.kafka import PLAINTEXT, KafkaSecurity
from spendbus.settings import load_settings


async def measure(
    args: argparse.Namespace,
    bootstrap: str,
    work: Path,
    broker_pid: int | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    from spendbus.stack.broker_probe import free_port

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
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "gateway.json",
        help="Where the JSON is also written (the smoke test's run leaves bench/results alone).",
    )
    args = parser.parse_args()
    if args.role == "passthrough":
        serve_passthrough(args.upstream, args.port, args.burn_us)
        return

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    # a cluster of your own: its KAFKA_* security settings; the bench's broker: plaintext
    security = load_settings().kafka_security if bootstrap else PLAINTEXT
    if not bootstrap:
        from spendbus.stack.broker_jars import ensure_broker_jars
        from spendbus.stack.kafka import LocalKafka

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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

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

The responses timed are built in ``taps_workloads``; the in-place measure is
``taps_paired_relay``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.taps_paired_relay import PairedRelay
from bench.taps_workloads import BUILDERS
from ingest.taps import EstimatorConfig, open_tap

MIB = 1 << 20


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


def _taps_compiled() -> bool:
    import ingest.taps.tap

    return Path(ingest.taps.tap.__file__ or "").suffix == ".so"


def _timed(fn: Callable[[], object]) -> float:
    """CPU seconds (user + system) of this process: the issue's target is CPU,
    and time spent descheduled on a busy machine is not the tap's cost."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def _arguments() -> argparse.Namespace:
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
        "PYTHONHASHSEED=0 and --no-gc, and divide the difference by N x events)",
    )
    parser.add_argument("--work-responses", type=int, default=4)
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="with --work: the cyclic garbage collector off (a collection lands wherever "
        "allocation counts put it, so two trees' counts would differ by where it fell)",
    )
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.work and args.no_gc:
        gc.disable()
    if args.work:
        _work(args.work, args.tokens, args.work_responses)
        return
    relay_report, in_relay = _in_relay(args)
    if args.relay_only:
        relay_report["cpus"] = os.cpu_count()
        relay_report["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps({"relay_aiohttp": relay_report}, separators=(",", ":")))
        return
    configs = {
        "parsed": EstimatorConfig(),
        "payload_bytes": EstimatorConfig(delta_text="payload_bytes"),
    }
    formats = _in_process(args.tokens, args.repeats, configs)
    summary = {
        fmt: {mode: entry["stream"][mode]["ratio_socket"] for mode in configs}
        for fmt, entry in formats.items()
    }
    report = {
        "python": sys.version.split()[0],
        "tokens_per_response": args.tokens,
        "repeats": args.repeats,
        "unit": "process CPU microseconds, median of interleaved repeats; per_mib over decoded bytes",
        "summary": {
            "stream_tap_added_in_aiohttp_relay": {
                fmt: row["tap_added_ratio"] for fmt, row in in_relay["formats"].items()
            },
            "stream_ratio_socket": summary,
        },
        "relay_aiohttp": relay_report,
        "formats": formats,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(report, separators=(",", ":")))


def _work(fmt: str, tokens: int, responses: int) -> None:
    """``responses`` streamed responses of ``fmt`` through taps, untimed (--work)."""
    request, events, _ = BUILDERS[fmt](tokens)
    body = json.dumps(request).encode()  # the request as a proxy has it, as in the relay
    for _ in range(responses):
        _tap(fmt, body, events, True, EstimatorConfig())
    print(json.dumps({"format": fmt, "responses": responses, "events": len(events)}))


def _in_relay(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tap in place (PairedRelay): the report's ``relay_aiohttp`` and what it measured."""
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
    return relay_report, in_relay


def _in_process(
    tokens: int, repeats: int, configs: dict[str, EstimatorConfig]
) -> dict[str, dict[str, Any]]:
    """Per format and case (stream, gzipped stream, body): the tap against the relays,
    timed in this process, repeats interleaved."""
    pair = socket.socketpair()
    formats: dict[str, dict[str, Any]] = {}
    for fmt, build in BUILDERS.items():
        request, events, body = build(tokens)
        gz = gzip.compress(b"".join(events))
        cases = {
            "stream": (events, True, None),
            "stream_gzip": ([gz[i : i + 4096] for i in range(0, len(gz), 4096)], True, "gzip"),
            "body": ([body[i : i + 16384] for i in range(0, len(body), 16384)], False, None),
        }
        entry: dict[str, Any] = {}
        for case, (chunks, streaming, encoding) in cases.items():
            modes = configs if streaming else {"parsed": configs["parsed"]}
            samples: dict[str, list[float]] = {"relay": [], "relay_socket": [], "python_floor": []}
            samples.update({mode: [] for mode in modes})
            for _ in range(repeats):  # interleaved: a load spike hits all alike
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
    return formats


if __name__ == "__main__":
    main()

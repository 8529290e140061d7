"""bench_gateway's figures: every path's medians over rounds, what each proxy adds to the
direct path and the gateway beside the pass-through (and the twin's A/A spread), the JSON."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from bench.gateway_load import MIB, pct


def summarise(
    args: argparse.Namespace,
    rounds: dict[str, list[dict[str, Any]]],
    bursts: dict[str, list[dict[str, Any]]],
    events: int,
    ramp_s: float,
) -> dict[str, Any]:
    paths = _paths(rounds)
    mib_per_round = round(statistics.median(r["bytes"] for r in rounds["gateway"]) / MIB, 2)
    vs_pass = _versus_passthrough(rounds, "gateway", 2)
    # the twin: an A/A test (the resolution of the gateway's added latencies in this run),
    # or, with --twin-burn-us, what that much CPU per request alone adds
    twin = (
        {"twin_burn_us_per_request": args.twin_burn_us, **_versus_passthrough(rounds, "twin", 3)}
        if args.twin
        else {}
    )
    resolution = None
    if twin and args.twin_burn_us == 0:
        resolution = round(
            max(abs(twin["added_ttfb_p99_ms"]), abs(twin["added_ttfb_p99_pooled_ms"])), 2
        )
    burst = _burst(args, bursts) if args.burst else {}
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
        "added_ms": {path: _added(rounds, path, "direct") for path in paths if path != "direct"},
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


def _med(rounds: dict[str, list[dict[str, Any]]], path: str, key: str) -> float:
    median: float = statistics.median(r[key] for r in rounds[path])
    return median


def _added(rounds: dict[str, list[dict[str, Any]]], path: str, base: str) -> dict[str, float]:
    """What ``path`` adds to ``base``: the median over rounds of their difference."""
    out = {}
    for key in ("ttfb_p50", "ttfb_p99", "total_p50", "total_p99"):
        out[key] = round(
            statistics.median(
                a[key] - b[key] for a, b in zip(rounds[path], rounds[base], strict=True)
            ),
            2,
        )
    return out


def _pooled(rounds: dict[str, list[dict[str, Any]]], path: str, p: float) -> float:
    return round(pct(sorted(t for r in rounds[path] for t in r["ttfb_ms"]), p), 2)


def _paths(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every path's medians over the rounds, its direct probes and its side processes' CPU."""
    paths: dict[str, dict[str, Any]] = {
        path: {
            key: round(_med(rounds, path, key), 2)
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
    # a round measures ~200 TTFBs, so its p99 is its second-worst; over the rounds pooled,
    # the p99 rests on more samples (one unlucky stall in one round moves it less)
    for path in paths:
        paths[path]["ttfb_p99_pooled"] = _pooled(rounds, path, 99)
    return paths


def _versus_passthrough(
    rounds: dict[str, list[dict[str, Any]]], path: str, ratio_digits: int
) -> dict[str, Any]:
    """``path``'s figures less the pass-through's, round by round and pooled."""
    vs = _added(rounds, path, "passthrough")
    return {
        "added_ttfb_p50_ms": vs["ttfb_p50"],
        "added_ttfb_p99_ms": vs["ttfb_p99"],
        "added_total_p99_ms": vs["total_p99"],
        "added_ttfb_p99_pooled_ms": round(
            _pooled(rounds, path, 99) - _pooled(rounds, "passthrough", 99), 2
        ),
        "added_ttfb_p99_per_round_ms": [
            round(a["ttfb_p99"] - b["ttfb_p99"], 2)
            for a, b in zip(rounds[path], rounds["passthrough"], strict=True)
        ],
        "cpu_per_mib_ratio": round(
            _med(rounds, path, "cpu_ms_per_mib") / _med(rounds, "passthrough", "cpu_ms_per_mib"),
            ratio_digits,
        ),
        # CPU spent per request beyond relaying it (for the gateway: check, tap,
        # publish, settle): less sensitive to a loaded machine than the latencies
        "added_cpu_us_per_request": round(
            _med(rounds, path, "cpu_us_per_request")
            - _med(rounds, "passthrough", "cpu_us_per_request")
        ),
    }


def _burst(args: argparse.Namespace, bursts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The burst: every path's TTFB when all streams start at once, the gateway's added."""
    burst_vs_pass = _added(bursts, "gateway", "passthrough")
    return {
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

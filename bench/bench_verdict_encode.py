"""Benchmark of one Verdict's encoding (``encode_verdict``), in memory: prints one JSON object.

Three counters folded by the aggregator's own fold, each encoded again and again as the
counting stage does when its verdict falls due: a month counter, a rolling:5h counter whose
spend sits in 3 of its 48 buckets, and one with spend in all 48 (Verdict v3 carries a
rolling window's buckets, issue 37). CPU ns per encode (``time.process_time``) and bytes
per verdict. ``--baseline CHECKOUT`` runs this same harness over another checkout's
``aggregator/`` and ``schemas/`` (``SPENDBUS_BENCH_ROOT``), rounds alternating between the
two, and reports both medians and their ratio.

    .venv/bin/python bench/bench_verdict_encode.py [--encodes 20000] [--rounds 5] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("SPENDBUS_BENCH_ROOT") or str(HERE.parent))

#: (counter, window, seconds its events spread over, events)
COUNTERS = (
    ("month", "month", 3600, 200),
    ("rolling_3_buckets", "rolling:5h", 3 * 375, 200),
    ("rolling_48_buckets", "rolling:5h", 5 * 3600, 400),
)


def one_round(n: int) -> dict[str, dict[str, float]]:
    """Per counter: CPU ns per encode over ``n`` encodes, and the verdict's bytes."""
    from aggregator.counting.fold import CounterState, apply
    from aggregator.counting.verdict_codec import encode_verdict
    from schemas.budgets import Budget
    from schemas.periods import parse_window, to_micros

    start = datetime(2026, 12, 7, 10, tzinfo=UTC)
    out: dict[str, dict[str, float]] = {}
    for name, window, spread_s, events in COUNTERS:
        budget = Budget(
            budget_id=f"bench-{name}",
            scope="org",
            window=parse_window(window),
            match={},
            limit_nanos=10**12,
            alert_at=(0.5, 0.8),
        )
        state = CounterState()
        for i in range(events):
            at = start + timedelta(seconds=spread_s * i / events)
            event: dict[str, Any] = {"occurred_at": at, "outcome": "allowed", "charge_of": None}
            apply(state, budget, event, 1_234_567, 0, i, occurred_us=to_micros(at), tokens=1500)
        key = f"bench-{name}|acme"
        emitted_us = to_micros(start) + 10**10
        data = encode_verdict(budget, key, ("acme",), state, emitted_us)
        started = time.process_time()
        for i in range(n):
            encode_verdict(budget, key, ("acme",), state, emitted_us + i)
        out[name] = {"ns": (time.process_time() - started) / n * 1e9, "bytes": len(data)}
    return out


def child(root: str | None, n: int) -> dict[str, dict[str, float]]:
    env = dict(os.environ)
    if root:
        env["SPENDBUS_BENCH_ROOT"] = root
    else:
        env.pop("SPENDBUS_BENCH_ROOT", None)
    out = subprocess.run(
        [sys.executable, __file__, "--encodes", str(n), "--one"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]  # this file's own JSON


def medians(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "median_cpu_ns_per_encode": round(statistics.median(r[name]["ns"] for r in rounds)),
            "bytes": rounds[0][name]["bytes"],
        }
        for name, *_ in COUNTERS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--encodes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="another checkout, measured alternately")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.encodes)))
        return
    this: list[dict[str, dict[str, float]]] = []
    base: list[dict[str, dict[str, float]]] = []
    for i in range(args.rounds):
        # which tree goes first swaps each round
        if args.baseline and i % 2 == 0:
            base.append(child(args.baseline, args.encodes))
        this.append(child(None, args.encodes))
        if args.baseline and i % 2 == 1:
            base.append(child(args.baseline, args.encodes))
    result: dict[str, object] = {
        "bench": "verdict_encode",
        "encodes": args.encodes,
        "rounds": args.rounds,
        "counters": medians(this),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.baseline:
        baseline = medians(base)
        result["baseline_counters"] = baseline
        result["ratio_medians_this_to_baseline"] = {
            name: round(
                medians(this)[name]["median_cpu_ns_per_encode"]
                / baseline[name]["median_cpu_ns_per_encode"],
                3,
            )
            for name, *_ in COUNTERS
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

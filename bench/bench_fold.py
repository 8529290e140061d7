"""Benchmark of the fold alone (``BatchProcessor.process``), in memory: prints one JSON object.

benchkit's ledger (3 counters an event: secret/month, org/day, user/rolling 1h) folded in
batches of 5000 into in-memory tables, CPU µs per event (``time.process_time``) per
round. ``--baseline CHECKOUT`` runs this same harness over another checkout's
``aggregator/`` and ``schemas/`` (``SPENDBUS_BENCH_ROOT``, its own compiled extensions),
rounds alternating between the two, and reports both medians and their ratio.

    .venv/bin/python bench/bench_fold.py [--events 60000] [--rounds 5] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("SPENDBUS_BENCH_ROOT") or str(HERE.parent))


def one_round(n: int) -> float:
    """CPU µs per event of folding ``n`` fresh events (new tables each round)."""
    sys.path.insert(1, str(HERE.parent))  # benchkit itself is this checkout's
    try:
        from aggregator.counting.process import BatchProcessor, RawRecord
        from aggregator.counting.reference import Reference
    except ImportError:  # a baseline from before the aggregator's shelves (2026-12-07)
        from aggregator.process import BatchProcessor, RawRecord  # type: ignore[no-redef, import-not-found]  # the same classes' older home
        from aggregator.reference import Reference  # type: ignore[no-redef, import-not-found]  # the same class's older home
    from bench.benchkit import BUDGETS, events
    from schemas.budgets import budgets_from_yaml
    from schemas.pricing import PriceBook, default_price_file, load_price_file

    reference = Reference()
    reference.prices = PriceBook(load_price_file(default_price_file()))
    reference.budgets = {b.budget_id: b for b in budgets_from_yaml(BUDGETS)}
    ledger = events(n)
    records = [RawRecord(i % 4, i // 4, key, value) for i, (key, value) in enumerate(ledger)]
    processor = BatchProcessor(reference, source_topic="usage.raw")
    counters: dict[tuple[int, str], object] = {}
    seen: dict[tuple[int, str], object] = {}
    now = datetime.now(UTC)
    started = time.process_time()
    for start in range(0, len(records), 5000):
        out = processor.process(
            records[start : start + 5000],
            lambda p, k: counters.get((p, k)),
            lambda p, k: seen.get((p, k)),
            now=now,
        )
        counters.update(out.counter_states)
        seen.update(out.seen_writes)
    return (time.process_time() - started) / n * 1e6


def child(root: str | None, n: int) -> float:
    env = dict(os.environ)
    if root:
        env["SPENDBUS_BENCH_ROOT"] = root
    else:
        env.pop("SPENDBUS_BENCH_ROOT", None)
    out = subprocess.run(
        [sys.executable, __file__, "--events", str(n), "--one"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="another checkout, measured alternately")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one_round(args.events))
        return
    this: list[float] = []
    base: list[float] = []
    for _ in range(args.rounds):
        if args.baseline:
            base.append(child(args.baseline, args.events))
        this.append(child(None, args.events))
    result: dict[str, object] = {
        "bench": "fold",
        "events": args.events,
        "counters_per_event": 3,
        "cpu_us_per_event": [round(v, 2) for v in this],
        "median_cpu_us_per_event": round(statistics.median(this), 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.baseline:
        result["baseline_cpu_us_per_event"] = [round(v, 2) for v in base]
        result["baseline_median_cpu_us_per_event"] = round(statistics.median(base), 2)
        result["ratio_medians_this_to_baseline"] = round(
            statistics.median(this) / statistics.median(base), 3
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

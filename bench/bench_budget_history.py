"""Budget history benchmark: one budget's history per period, read through
``budget_history WHERE budget_id = ...`` (the console's query before ddl/014) and through
``budget_history_of(budget_id = ...)`` (its query now), on events that carry counts.

bench/bench_console.py's store (bench/bench_admin.py's filler) holds events with no
``counts``: its budget page measures the scan, not the history's aggregation. Here every
event then counts in --counts-per-event of --budgets monthly budgets (its org and
project's counter in each), as a priced event carries them, so each budget holds about
events x counts / budgets counted events. Each query is asked --requests times,
alternated, after one untimed round; both must return the same rows (the page's
columns, newest period first).

Prints one JSON object.

    .venv/bin/python bench/bench_budget_history.py [--events 200000] [--requests 5]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from admin.access import Caller
from admin.console.history import history_sql
from aggregator.sink import apply_schema, open_client, run_query
from bench.bench_admin import fill_store
from bench.benchkit import pct

PLATFORM = Caller("bench", "platform-admin", None, "127.0.0.1")


def add_counts(store: Any, budgets: int, per_event: int) -> None:
    """Every event counts in ``per_event`` of ``budgets`` monthly project budgets (as
    many consecutive ones from a hash of its id: never one twice)."""
    store.command(
        "ALTER TABLE usage_events UPDATE counts = arrayMap(b -> ("
        "concat('b', toString(b), '|', org_id, '|', ifNull(project_id, '')), "
        "concat('b', toString(b)), [org_id, ifNull(project_id, '')], 'month', "
        "concat('m:', formatDateTime(occurred_at, '%Y-%m')), toInt64(0), toUInt8(1), "
        "toNullable(toInt64(100000000000)), CAST(NULL, 'Nullable(Int64)'), "
        "CAST(NULL, 'Nullable(Int64)'), [0.5, 1.0]), "
        f"arrayMap(k -> (cityHash64(event_id) + k) % {budgets}, range({per_event}))"
        ") WHERE 1 SETTINGS mutations_sync = 1"
    )


def measure(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    budget_ids = [f"b{b}" for b in range(args.budgets)]

    def queries(budget_id: str) -> dict[str, str]:
        own = history_sql(budget_id, PLATFORM)
        whole = own.replace(
            f"budget_history_of(budget_id = '{budget_id}')",
            f"budget_history WHERE budget_id = '{budget_id}'",
        )
        assert whole != own
        return {"budget_history_where": whole, "budget_history_of": own}

    timings: dict[str, list[float]] = {"budget_history_where": [], "budget_history_of": []}
    rows = 0
    for round_ in range(args.requests + 1):
        budget_id = random.choice(budget_ids)
        answers = []
        for name, sql in queries(budget_id).items():
            started = time.perf_counter()
            answers.append(run_query(store, sql)[1])
            if round_:  # the first round is untimed: the store warm
                timings[name].append((time.perf_counter() - started) * 1000)
        assert answers[0] == answers[1], f"{budget_id}: the two reads differ"
        rows = max(rows, len(answers[0]))
    return {
        "history_rows": rows,
        **{
            name: {"p50_ms": round(pct(values, 0.5), 2), "p99_ms": round(pct(values, 0.99), 2)}
            for name, values in timings.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--budgets", type=int, default=10)
    parser.add_argument("--counts-per-event", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    if not 0 < args.counts_per_event <= args.budgets:
        parser.error("--counts-per-event: between 1 and --budgets")
    random.seed(7)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_client(f"chdb://{Path(tmp) / 'clickhouse'}")
        try:
            apply_schema(store)
            fill_store(store, args.events)
            add_counts(store, args.budgets, args.counts_per_event)
            ((counted,),) = run_query(store, "SELECT sum(length(counts)) FROM usage_events")[1]
            result = measure(store, args)
        finally:
            store.close()
    print(
        json.dumps(
            {
                "bench": "budget_history",
                "events": args.events,
                "budgets": args.budgets,
                "counts_per_event": args.counts_per_event,
                "counted_events": int(counted),
                "requests": args.requests,
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()

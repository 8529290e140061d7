"""Throughput of the ClickHouse sink on the embedded engine (chdb): prints one JSON object.

Each run writes ``--batches`` batches of ``--batch`` PricedUsage records (as
decoded by schemas.codec) through ClickHouseSink.write into a fresh schema,
the way the Faust agent does; rows/s is the median over ``--runs`` runs.

    .venv/bin/python bench/bench_sink.py [--batch 10000] [--batches 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aggregator.sink import ClickHouseSink, apply_schema, open_client, rows_from_priced
from schemas.codec import PRICED_USAGE
from schemas.usage import new_usage_event

PARTITIONS = 4


def priced_records(start: int, count: int, now: datetime) -> list[dict[str, Any]]:
    """Realistic records: decoded from their Avro bytes, as the agent receives them."""
    out = []
    for i in range(start, start + count):
        event = new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model=f"claude-sonnet-4-{i % 3}",
            secret_id=f"sec-{i % 50}",
            org_id=f"org-{i % 20}",
            gateway_id=f"gw-{i % 4}",
            input_tokens=200 + i % 1000,
            output_tokens=50 + i % 400,
            cache_read_tokens=i % 700,
            occurred_at=now - timedelta(seconds=(start + count - i) % 86_400),
            project_id=f"proj-{i % 30}",
            user_id=f"user{i % 200}@example.com",
            groups=["eng", "ml"],
            tags={"team": f"t{i % 5}", "env": "prod"},
            request_id=f"req_{i}",
            latency_ms=300 + i % 900,
            stream=True,
        )
        record = {
            "event": event,
            "cost_nanos": 1_000_000 + i,
            "price_version": "2026-11-01",
            "price_match": "claude-sonnet-4",
            "unpriced": False,
            "source_partition": i % PARTITIONS,
            "source_offset": i // PARTITIONS,
            "priced_at": now,
        }
        out.append(PRICED_USAGE.decode(PRICED_USAGE.encode(record)))
    return out


def one_run(path: str, batch: int, batches: int) -> dict[str, float]:
    client = open_client(f"chdb://{path}")
    try:
        apply_schema(client)
        sink = ClickHouseSink(client)
        now = datetime.now(UTC)
        data = [priced_records(k * batch, batch, now) for k in range(batches + 1)]
        sink.write(data[0])  # warm-up: loads fences, first part
        start, cpu_start = time.perf_counter(), time.process_time()
        for records in data[1:]:
            sink.write(records)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        t0 = time.perf_counter()
        for records in data[1:]:
            rows_from_priced(records)
        rows_s = time.perf_counter() - t0
        stored = client.query("SELECT count() FROM usage_events").result_rows[0][0]
        assert stored == batch * (batches + 1), stored
        return {"seconds": elapsed, "cpu_seconds": cpu, "rows_from_priced_seconds": rows_s}
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        for run in range(args.runs):
            runs.append(one_run(os.path.join(tmp, f"run{run}"), args.batch, args.batches))
    rows = args.batch * args.batches
    per_run = [rows / r["seconds"] for r in runs]
    per_cpu = [rows / r["cpu_seconds"] for r in runs]
    print(
        json.dumps(
            {
                "bench": "clickhouse_sink_write",
                "engine": "chdb",
                "batch_rows": args.batch,
                "batches_per_run": args.batches,
                "runs": args.runs,
                "rows_per_s_median": round(statistics.median(per_run)),
                "rows_per_s_runs": [round(x) for x in per_run],
                # CPU time of this process (all its threads, the engine's included):
                # what one core sustains, whatever else the machine is running
                "rows_per_cpu_s_median": round(statistics.median(per_cpu)),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "ms_per_batch_median": round(1000 * args.batch / statistics.median(per_run), 1),
                "rows_from_priced_ms_per_batch_median": round(
                    1000
                    * statistics.median(r["rows_from_priced_seconds"] for r in runs)
                    / args.batches,
                    1,
                ),
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()

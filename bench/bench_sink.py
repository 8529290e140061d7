"""Throughput of the ClickHouse sink on the embedded engine (chdb): prints one JSON object.

Each run writes ``--batches`` batches of ``--batch`` usage.priced records into a fresh
schema three ways, side by side (the order alternates between runs):

- ``sink``: ``ClickHouseSink.write_messages`` on the records as the sink stage reads them
  from Kafka (Avro bytes with the store-row header): fenced in Python, decoded by the
  engine (aggregator/sink/avro_rows.py). What the worker does.
- ``sink_rows``: the same records decoded with fastavro and written as Python rows
  (``ClickHouseSink.write``), as the sink did before (issue 19).
- ``sink_engine_process``: ``sink``'s path with the engine in a process of its own
  (``aggregator/sink/engine_link.py``, the worker's default since issue 32): each INSERT
  and fence read is a call to that process; its CPU is not this process's.
- ``engine_raw``: the engine alone, ``INSERT ... SELECT`` of the same rows from a table
  that holds them already: the ceiling of any client format (the rollup views included).

rows/s is the median over ``--runs`` runs; CPU seconds are this process's (every thread,
the engine's too).

    .venv/bin/python bench/bench_sink.py [--batch 50000] [--batches 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from clickhouse_connect.driver.client import Client

from aggregator.sink import ClickHouseSink, apply_schema, open_client
from aggregator.sink.engine_link import EngineLink
from aggregator.sink.guard import KILL_GRACE_SECONDS
from aggregator.sink.rows import month_of
from schemas.codec import PRICED_USAGE
from schemas.records import PricedUsage
from schemas.topics import STORE_ROW_HEADER, store_row_value
from schemas.usage import new_usage_event

PARTITIONS = 4
WAYS = ("sink", "sink_engine_process", "sink_rows", "engine_raw")


def priced_records(start: int, count: int, now: datetime) -> list[PricedUsage]:
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


@dataclass(frozen=True)
class Message:
    """A usage.priced record as the sink stage reads it (value and headers)."""

    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def as_messages(records: list[PricedUsage]) -> list[Message]:
    """The records as the counting stage writes them (these ids are canonical)."""
    return [
        Message(
            PRICED_USAGE.encode(r),
            (
                (
                    STORE_ROW_HEADER,
                    store_row_value(
                        r["source_partition"],
                        r["source_offset"],
                        month_of(r["event"]["occurred_at"]),
                    ),
                ),
            ),
        )
        for r in records
    ]


def one_run(path: str, way: str, batches: list[list[Message]]) -> dict[str, float]:
    os.makedirs(path + "-spool", exist_ok=True)
    link = None
    if way == "sink_engine_process":
        link = EngineLink(f"chdb://{path}", path, path + "-spool", kill_grace=KILL_GRACE_SECONDS)
        client = cast(Client, link.client())
    else:
        client = open_client(f"chdb://{path}")
    try:
        apply_schema(client)
        sink = ClickHouseSink(client, spool_dir=path + "-spool", avro_inserts=True)
        rows = sum(len(b) for b in batches)
        if way == "engine_raw":  # staged untimed; the timed part is one INSERT ... SELECT
            for messages in batches:
                sink.write_messages(messages)
            client.command("CREATE TABLE staged AS usage_events")
            client.command("INSERT INTO staged SELECT * FROM usage_events")
            client.command("TRUNCATE TABLE usage_events")
            for table in ("spend_hourly", "spend_daily"):
                client.command(f"TRUNCATE TABLE {table}")
        start, cpu_start = time.perf_counter(), time.process_time()
        if way in ("sink", "sink_engine_process"):
            for messages in batches:
                sink.write_messages(messages)
        elif way == "sink_rows":
            for messages in batches:
                sink.write([PRICED_USAGE.decode(m.value) for m in messages])
        else:
            client.command("INSERT INTO usage_events SELECT * FROM staged")
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        stored = client.query(
            "SELECT count(), uniqExact(source_partition, source_offset) FROM usage_events"
        ).result_rows[0]
        assert tuple(stored) == (rows, rows), stored
        return {"seconds": elapsed, "cpu_seconds": cpu}
    finally:
        client.close()
        if link is not None:
            link.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    now = datetime.now(UTC)
    batches = [
        as_messages(priced_records(k * args.batch, args.batch, now)) for k in range(args.batches)
    ]
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        for run in range(args.runs):
            order = WAYS if run % 2 == 0 else tuple(reversed(WAYS))
            for way in order:
                results[way].append(one_run(os.path.join(tmp, f"{way}{run}"), way, batches))
    rows = args.batch * args.batches
    ways: dict[str, Any] = {}
    for way, runs in results.items():
        ways[way] = {
            "rows_per_s_median": round(statistics.median(rows / r["seconds"] for r in runs)),
            "rows_per_s_runs": [round(rows / r["seconds"]) for r in runs],
            # CPU time of this process (all its threads, the engine's included)
            "rows_per_cpu_s_median": round(
                statistics.median(rows / r["cpu_seconds"] for r in runs)
            ),
        }
    sink = ways["sink"]["rows_per_s_median"]
    print(
        json.dumps(
            {
                "bench": "clickhouse_sink_write",
                "engine": "chdb",
                "batch_rows": args.batch,
                "batches_per_run": args.batches,
                "runs": args.runs,
                # the worker's path, at the top where `make bench` reads it
                "rows_per_s_median": sink,
                "ways": ways,
                "sink_over_rows": round(sink / ways["sink_rows"]["rows_per_s_median"], 2),
                "engine_process_over_sink": round(
                    ways["sink_engine_process"]["rows_per_s_median"] / sink, 3
                ),
                "sink_share_of_engine_raw": round(
                    sink / ways["engine_raw"]["rows_per_s_median"], 3
                ),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()

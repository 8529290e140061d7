"""How usage.priced records could reach ClickHouse: the insert formats side by side.

Each candidate takes the same batches of usage.priced values (the Avro single-object
bytes the sink stage receives) and ends with the same rows in a fresh ``usage_events``
table of the embedded engine (chdb). Rounds alternate the candidates, so each one sees
the same machine; the figures are medians over rounds. A candidate counts only if its
table ends equal to the reference's (row count, cost sum and a hash of every column).

- ``rows``: fastavro decode, ``rows_from_priced`` tuples, ``client.insert`` (the sink today)
- ``columns``: fastavro decode, the same values as columns, ``column_oriented=True``
- ``arrow``: fastavro decode, a pyarrow Table, ``client.insert_arrow``
- ``avro``: no decode in Python: the bodies after the 10-byte header, concatenated
  into one Avro object-container block under the writer schema, and the engine reads
  them itself (``INSERT ... SELECT ... FROM file(..., 'Avro')``, nested ``event.*``
  fields named by path). The ids are inserted as the event carries them, so it matches
  the reference only because these events' ids are already canonical; a real sink on
  this path needs them canonical in PricedUsage itself (the counting stage has them).
- ``engine_raw``: the engine alone: ``INSERT ... SELECT`` of the same rows from a
  table that already holds them (the ceiling of any client format).

    .venv/bin/python bench/bench_insert_formats.py [--batch 10000] [--batches 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, writer

from aggregator.sink import apply_schema, open_client, rows_from_priced
from aggregator.sink.rows import USAGE_COLUMN_NAMES, USAGE_COLUMN_TYPES
from schemas.avro_schemas import expanded_schemas
from schemas.codec import HEADER_LEN, PRICED_USAGE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench.bench_sink`, run as a script

from bench.bench_sink import priced_records

CANDIDATES = ("rows", "columns", "arrow", "avro", "engine_raw")
#: every stored column, in a fixed order: the equality check of a candidate's table
CHECKSUM = (
    "SELECT count(), sum(cost_nanos), "
    f"groupBitXor(cityHash64({', '.join(USAGE_COLUMN_NAMES)})) FROM usage_events"
)

Client = Any
#: a dict column is a struct to pyarrow unless told it is a map (an empty one, like
#: ``units`` of these events, a ``Tuple()`` the engine cannot cast to its Map column)
ARROW_MAPS = {
    "Map(String, String)": pa.map_(pa.string(), pa.string()),
    "Map(String, Int64)": pa.map_(pa.string(), pa.int64()),
}
MAP_TYPES = {
    name: ARROW_MAPS[kind]
    for name, kind in zip(USAGE_COLUMN_NAMES, USAGE_COLUMN_TYPES, strict=True)
    if kind.startswith("Map(")
}


def avro_select(path: str) -> str:
    """The usage_events columns read from a PricedUsage container file by the engine."""
    event_fields = {f["name"] for f in expanded_schemas()["UsageEvent"]["fields"]}
    exprs = [
        f"`event.{name}` AS {name}" if name in event_fields else name for name in USAGE_COLUMN_NAMES
    ]
    return (
        f"INSERT INTO usage_events ({', '.join(USAGE_COLUMN_NAMES)}) "
        f"SELECT {', '.join(exprs)} FROM file('{path}', 'Avro')"
    )


def container(bodies: list[bytes], schema: dict[str, Any]) -> bytes:
    """One Avro object-container file holding ``bodies`` (already-encoded records) as one
    block: fastavro writes the header, the block is the bodies as they are."""
    import io

    head = io.BytesIO()
    writer(head, parse_schema(schema), [], sync_marker=b"S" * 16)
    count, size = len(bodies), sum(len(b) for b in bodies)
    return head.getvalue() + _zigzag(count) + _zigzag(size) + b"".join(bodies) + b"S" * 16


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def insert_rows(client: Client, values: list[bytes], _tmp: str) -> None:
    rows = rows_from_priced([PRICED_USAGE.decode(v) for v in values])
    client.insert(
        "usage_events", rows, column_names=USAGE_COLUMN_NAMES, column_type_names=USAGE_COLUMN_TYPES
    )


def insert_columns(client: Client, values: list[bytes], _tmp: str) -> None:
    rows = rows_from_priced([PRICED_USAGE.decode(v) for v in values])
    columns = [list(c) for c in zip(*rows, strict=True)]
    client.insert(
        "usage_events",
        columns,
        column_names=USAGE_COLUMN_NAMES,
        column_type_names=USAGE_COLUMN_TYPES,
        column_oriented=True,
    )


def insert_arrow(client: Client, values: list[bytes], _tmp: str) -> None:
    rows = rows_from_priced([PRICED_USAGE.decode(v) for v in values])
    columns = dict(zip(USAGE_COLUMN_NAMES, (list(c) for c in zip(*rows, strict=True)), strict=True))
    arrays = {
        name: pa.array([list(m.items()) for m in col], type=MAP_TYPES[name])
        if name in MAP_TYPES
        else pa.array(col)
        for name, col in columns.items()
    }
    client.insert_arrow("usage_events", pa.table(arrays))


def insert_avro(client: Client, values: list[bytes], tmp: str) -> None:
    path = os.path.join(tmp, f"batch-{time.monotonic_ns()}.avro")
    with open(path, "wb") as handle:
        handle.write(container([v[HEADER_LEN:] for v in values], expanded_schemas()["PricedUsage"]))
    try:
        client.command(avro_select(path))
    finally:
        os.unlink(path)


def insert_engine_raw(client: Client, values: list[bytes], _tmp: str) -> None:
    # the rows are staged once (untimed, see one_round); this copies them in the engine
    client.command("INSERT INTO usage_events SELECT * FROM usage_events_staged")


INSERTS: dict[str, Callable[[Client, list[bytes], str], None]] = {
    "rows": insert_rows,
    "columns": insert_columns,
    "arrow": insert_arrow,
    "avro": insert_avro,
    "engine_raw": insert_engine_raw,
}


def one_round(name: str, batches: list[list[bytes]], tmp: str) -> dict[str, Any]:
    client = open_client(f"chdb://{os.path.join(tmp, f'{name}-{time.monotonic_ns()}')}")
    try:
        apply_schema(client)
        if name == "engine_raw":
            client.command("CREATE TABLE usage_events_staged AS usage_events")
            insert_rows(client, [v for batch in batches for v in batch], tmp)
            client.command("INSERT INTO usage_events_staged SELECT * FROM usage_events")
            client.command("TRUNCATE TABLE usage_events")
            batches = [[]]  # one INSERT ... SELECT of every row
        start, cpu = time.perf_counter(), time.process_time()
        for values in batches:
            INSERTS[name](client, values, tmp)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        checksum = list(client.query(CHECKSUM).result_rows[0])
        return {"seconds": seconds, "cpu_seconds": cpu_seconds, "checksum": checksum}
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    batches = [
        [PRICED_USAGE.encode(r) for r in priced_records(k * args.batch, args.batch, now)]
        for k in range(args.batches)
    ]
    rows = args.batch * args.batches
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in CANDIDATES}
    with tempfile.TemporaryDirectory(prefix="bench-insert-") as tmp:
        for _ in range(args.rounds):
            for name in CANDIDATES:
                results[name].append(one_round(name, batches, tmp))
    reference = results["rows"][0]["checksum"]
    out: dict[str, Any] = {
        "bench": "clickhouse_insert_formats",
        "engine": "chdb",
        "batch_rows": args.batch,
        "batches": args.batches,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "candidates": {},
    }
    for name, runs in results.items():
        out["candidates"][name] = {
            "rows_per_s_median": round(statistics.median(rows / r["seconds"] for r in runs)),
            "rows_per_cpu_s_median": round(
                statistics.median(rows / r["cpu_seconds"] for r in runs)
            ),
            "exact": all(r["checksum"] == reference for r in runs),
        }
    base = out["candidates"]["rows"]["rows_per_s_median"]
    for figures in out["candidates"].values():
        figures["vs_rows"] = round(figures["rows_per_s_median"] / base, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""What the ClickHouse sink's tests share: records as the sink receives them, a client that
fails on cue, the two insert paths, a fresh database on the module's engine.

chdb hosts one engine per process, on one data path: each test module opens one path
for all its tests (``engine`` in conftest.py; each test gets its own database on it) and
closes every client when it ends, so another module may then open another path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.exceptions import OperationalError

from aggregator.sink import (
    ClickHouseSink,
    apply_schema,
    open_client,
)
from aggregator.sink.rows import month_of
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.ids import ids_are_canonical
from schemas.records import PricedUsage, Verdict
from schemas.topics import STORE_ROW_HEADER, store_row_value
from schemas.usage import new_usage_event

REPO = Path(__file__).resolve().parents[3]
NOW = datetime.now(UTC).replace(microsecond=123456)
#: default event times are T0 minus up to 10 hours, all in T0's month
T0 = max(NOW, NOW.replace(day=1, hour=11, minute=0, second=0))
_db_numbers = itertools.count()


def priced(
    offset: int,
    *,
    partition: int = 0,
    occurred_at: datetime | None = None,
    cost_nanos: int | None = None,
    **event: Any,
) -> PricedUsage:
    """A PricedUsage record as the sink receives it (decoded from its Avro bytes)."""
    fields: dict[str, Any] = {
        "provider": "anthropic",
        "api": "anthropic-messages",
        "model": "claude-sonnet-4",
        "secret_id": f"sec-{offset % 5}",
        "org_id": f"org-{offset % 3}",
        "gateway_id": "gw-1",
        "input_tokens": 100 + offset % 97,
        "output_tokens": 10 + offset % 13,
        "occurred_at": occurred_at or T0 - timedelta(minutes=offset % 600),
        "event_id": f"ev-{partition}-{offset}",
    }
    fields.update(event)
    record = {
        "event": new_usage_event(**fields),
        "cost_nanos": 1_000 + offset * 7 if cost_nanos is None else cost_nanos,
        "price_version": "2026-11-01",
        "price_match": "claude-sonnet-4",
        "unpriced": False,
        "source_partition": partition,
        "source_offset": offset,
        "priced_at": NOW,
    }
    return PRICED_USAGE.decode(PRICED_USAGE.encode(record))


def batch(offsets: range, partitions: int = 1, **kw: Any) -> list[PricedUsage]:
    """Records of ``partitions`` partitions, interleaved, each in offset order."""
    return [priced(o, partition=p, **kw) for o in offsets for p in range(partitions)]


def scalar(client: Any, sql: str) -> Any:
    return client.query(sql).result_rows[0][0]


def totals(client: Any) -> tuple[int, int, int]:
    """count, sum(cost_nanos), distinct (partition, offset) of usage_events."""
    return tuple(
        client.query(
            "SELECT count(), sum(cost_nanos), uniqExact(source_partition, source_offset) "
            "FROM usage_events"
        ).result_rows[0]
    )


class FlakyClient:
    """A real client whose next insert fails: ``before`` it reaches ClickHouse or ``after``.

    An insert is ``insert`` (Python rows) or an ``INSERT`` through ``command`` (the Avro
    path, ``aggregator/sink/avro_rows.py``); both go through ``write``."""

    def __init__(self, real: Any, fail: str | None = None) -> None:
        self.real = real
        self.fail = fail
        self.inserts = 0

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.query(*args, **kwargs)

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        return self.write(self.real.insert, *args, **kwargs)

    def command(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if not sql.startswith("INSERT"):
            return self.real.command(sql, *args, **kwargs)
        return self.write(self.real.command, sql, *args, **kwargs)

    def write(self, send: Any, *args: Any, **kwargs: Any) -> Any:
        self.inserts += 1
        fail, self.fail = self.fail, None
        if fail == "before":
            raise OperationalError("connection refused (injected)")
        result = send(*args, **kwargs)
        if fail == "after":
            raise OperationalError("read timeout after sending the insert (injected)")
        return result


@dataclass(frozen=True)
class Message:
    """A usage.priced record as the sink stage reads it from Kafka."""

    value: bytes | None  # None: a tombstone
    headers: tuple[tuple[str, bytes], ...] = ()


def as_message(record: PricedUsage) -> Message:
    """The record as the counting stage writes it: with the store-row header when its ids
    are canonical (aggregator/counting/process.py)."""
    event = record["event"]
    headers: tuple[tuple[str, bytes], ...] = ()
    if ids_are_canonical(event):
        position = store_row_value(
            record["source_partition"], record["source_offset"], month_of(event["occurred_at"])
        )
        headers = ((STORE_ROW_HEADER, position),)
    return Message(PRICED_USAGE.encode(record), headers)


@dataclass(frozen=True)
class WritePath:
    """How a test's batches reach the sink: decoded records (``write``), or Kafka records
    (``write_messages``) whose bodies the engine decodes itself."""

    avro: bool

    def sink(self, client: Any, **kwargs: Any) -> ClickHouseSink:
        return ClickHouseSink(client, avro_inserts=self.avro, **kwargs)

    def write(self, sink: ClickHouseSink, records: list[PricedUsage]) -> int:
        if self.avro:
            return sink.write_messages([as_message(r) for r in records])
        return sink.write(records)


def fresh_database(engine: str) -> Any:
    """A client on a new database of the module's engine, holding the shipped DDL."""
    admin = open_client(engine)
    name = f"t{next(_db_numbers)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    ch = open_client(engine, database=name)
    apply_schema(ch)
    return ch


def verdict(counter: str, seq: int, period: str = "m:2026-11", spent: int = 0) -> Verdict:
    record = {
        "counter_key": counter,
        "budget_id": counter.split(",")[0],
        "scope": "org",
        "scope_values": ["org-1"],
        "period": period,
        "state": "exceeded" if spent >= 1_000 else "ok",
        "spent_nanos": spent,
        "spent_tokens": spent // 10,
        "spent_requests": seq,
        "limit_nanos": 1_000,
        "limit_tokens": None,
        "limit_requests": None,
        "action": "enforce",
        "refusal": "budget_exceeded",
        "reset_at": datetime(2026, 12, 1, tzinfo=UTC),
        "as_of": NOW + timedelta(seconds=seq),
        "seq": seq,
        "emitted_at": NOW,
    }
    return VERDICT.decode(VERDICT.encode(record))

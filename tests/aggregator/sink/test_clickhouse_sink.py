"""The ClickHouse sink against the real engine (chdb, embedded ClickHouse 26.x).

chdb hosts one engine per process, on one data path: this module opens one
path for all its tests (each test gets its own database on it) and closes
every client when it ends, so another module may then open another path.
"""

from __future__ import annotations

import ast
import itertools
import random
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aggregator.sink as sink_pkg
from aggregator.sink import (
    EXAMPLE_QUERIES,
    ROLLUP_DRIFT,
    USAGE_COLUMNS,
    VERDICT_COLUMNS,
    ClickHouseSink,
    DataPathInUse,
    SinkRejected,
    SinkUnavailable,
    apply_schema,
    open_client,
    rebuild_rollups,
    rows_from_priced,
    run_query,
    split_statements,
)
from aggregator.sink.clickhouse import USAGE_COLUMN_NAMES, VERDICT_COLUMN_NAMES, month_of
from aggregator.sink.query import LATEST_BUDGET_STATE
from aggregator.sink.store import DDL_DIR
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.errors import ConfigError, SpendbusError
from schemas.ids import ids_are_canonical
from schemas.topics import STORE_ROW, STORE_ROW_HEADER, store_row_value
from schemas.usage import MAX_TOKENS_PER_EVENT, new_usage_event

REPO = Path(__file__).resolve().parents[3]
NOW = datetime.now(UTC).replace(microsecond=123456)
#: default event times are T0 minus up to 10 hours, all in T0's month
T0 = max(NOW, NOW.replace(day=1, hour=11, minute=0, second=0))
_db_numbers = itertools.count()


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's chdb data path (DSN), open for the whole module, closed after it."""
    dsn = f"chdb://{tmp_path_factory.mktemp('chdb')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


@pytest.fixture
def client(engine: str) -> Iterator[Any]:
    """A client on a fresh database holding the shipped DDL (aggregator/sink/ddl)."""
    ch = _fresh_database(engine)
    yield ch
    ch.close()


def priced(
    offset: int,
    *,
    partition: int = 0,
    occurred_at: datetime | None = None,
    cost_nanos: int | None = None,
    **event: Any,
) -> dict[str, Any]:
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


def batch(offsets: range, partitions: int = 1, **kw: Any) -> list[dict[str, Any]]:
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

    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


def as_message(record: dict[str, Any]) -> Message:
    """The record as the counting stage writes it: with the store-row header when its ids
    are canonical (aggregator/process.py)."""
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

    def write(self, sink: ClickHouseSink, records: list[dict[str, Any]]) -> int:
        if self.avro:
            return sink.write_messages([as_message(r) for r in records])
        return sink.write(records)


@pytest.fixture(params=[False, True], ids=["rows", "avro"])
def path(request: pytest.FixtureRequest) -> WritePath:
    """Each flush-order and exactness test runs on both insert paths."""
    return WritePath(avro=request.param)


# -- DDL ----------------------------------------------------------------------------


def test_ddl_is_idempotent_and_creates_each_table_with_its_engine(client: Any) -> None:
    assert apply_schema(client) == [p.name for p in sorted(DDL_DIR.glob("0*.sql"))]
    engines = dict(
        client.query(
            "SELECT name, engine FROM system.tables WHERE database = currentDatabase()"
        ).result_rows
    )
    assert engines == {
        "usage_events": "MergeTree",
        "spend_hourly": "SummingMergeTree",
        "spend_hourly_mv": "MaterializedView",
        "spend_daily": "SummingMergeTree",
        "spend_daily_mv": "MaterializedView",
        "budget_state": "ReplacingMergeTree",
        "decisions": "View",
        "budget_counts": "View",
        "budget_history": "View",
        "alerts": "View",
        "unit_usage": "View",
        "alert_deliveries": "ReplacingMergeTree",
        "budget_raises": "ReplacingMergeTree",
    }


def test_sink_columns_match_the_ddl(client: Any) -> None:
    def described(table: str) -> list[tuple[str, str]]:
        rows = client.query(f"DESCRIBE TABLE {table}").result_rows
        # a named tuple is described over several lines: compare its one-line form
        one_line = [(r[0], re.sub(r"\(\s+", "(", re.sub(r"\s*\n\s*", " ", r[1]))) for r in rows]
        return [column for column, r in zip(one_line, rows, strict=True) if r[2] != "DEFAULT"]

    assert described("usage_events") == list(USAGE_COLUMNS)
    assert described("budget_state") == list(VERDICT_COLUMNS)


def test_split_statements_keeps_semicolons_in_strings_and_drops_comments() -> None:
    sql = textwrap.dedent(
        """\
        -- a comment; with a semicolon
        CREATE TABLE a (s String DEFAULT 'x;y', t String DEFAULT 'it''s;') ENGINE = Memory;
        /* block; comment */ SELECT "col;umn", `b;c` FROM a ;
        ;
        SELECT 'back\\\\slash\\';'
        """
    )
    assert split_statements(sql) == [
        "CREATE TABLE a (s String DEFAULT 'x;y', t String DEFAULT 'it''s;') ENGINE = Memory",
        'SELECT "col;umn", `b;c` FROM a',
        "SELECT 'back\\\\slash\\';'",
    ]


# -- rows ---------------------------------------------------------------------------


def test_priced_usage_round_trips_through_usage_events(client: Any, path: WritePath) -> None:
    full = priced(
        7,
        partition=2,
        cost_nanos=123_456_789_012,
        project_id="proj-1",
        grant_id="grant-1",
        permission_id="perm-1",
        user_id="alice@example.com",
        groups=["eng", "ml"],
        session_id="job-42",
        tags={"team": "search", "env": "prod"},
        cache_read_tokens=900,
        cache_write_tokens=300,
        cache_write_1h_tokens=100,
        output_tokens=500,
        reasoning_tokens=200,
        usage_source="estimated",
        estimate_reason="client_disconnected",
        outcome="refused",
        decision="budget_exceeded",
        decision_budget_id="monthly-org",
        status_code=429,
        stream=True,
        request_id="msg_01",
        latency_ms=1234,
    )
    bare = priced(8, partition=2)
    bare["unpriced"], bare["price_version"], bare["price_match"] = True, None, None
    records = [full, bare]
    assert path.write(path.sink(client), records) == 2

    got = client.query(
        f"SELECT {', '.join(USAGE_COLUMN_NAMES)} FROM usage_events ORDER BY source_offset"
    ).result_rows
    assert got == rows_from_priced(records)
    row = dict(zip(USAGE_COLUMN_NAMES, got[0], strict=True))
    ev = full["event"]
    assert row["occurred_at"] == ev["occurred_at"] and row["occurred_at"].microsecond == 123456
    assert row["tags"] == {"team": "search", "env": "prod"}
    assert row["groups"] == ["eng", "ml"]
    assert row["cost_nanos"] == 123_456_789_012
    assert (row["source_partition"], row["source_offset"]) == (2, 7)
    assert got[1][USAGE_COLUMN_NAMES.index("project_id")] is None
    assert got[1][USAGE_COLUMN_NAMES.index("price_version")] is None
    assert scalar(
        client, "SELECT max(inserted_at) > now64(3, 'UTC') - INTERVAL 1 MINUTE FROM usage_events"
    )


def test_ids_are_stored_canonical_as_the_counters_use_them(client: Any, path: WritePath) -> None:
    record = priced(
        1,
        org_id=" acme ",
        secret_id="sec-1 ",
        user_id=" Alice@Example.COM ",
        project_id="   ",
        groups=[" Eng "],
    )
    path.write(path.sink(client), [record])
    assert client.query(
        "SELECT org_id, secret_id, user_id, project_id, groups FROM usage_events"
    ).result_rows == [("acme", "sec-1", "alice@example.com", None, ["Eng"])]
    assert client.query("SELECT org_id, user_id, project_id FROM spend_daily").result_rows == [
        ("acme", "alice@example.com", "")
    ]


# -- the Avro path: bodies the engine decodes ------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_optional_id = st.none() | _text.filter(lambda t: t == t.strip())


@st.composite
def _events(draw: st.DrawFn, offset: int) -> dict[str, Any]:
    """A priced record with every column's kind of value (nulls, maps, unicode, extremes)."""
    tokens = st.integers(0, MAX_TOKENS_PER_EVENT)
    output = draw(tokens)
    record = priced(
        offset,
        partition=draw(st.integers(0, 3)),
        cost_nanos=draw(st.integers(0, 2**62)),
        occurred_at=T0 - timedelta(microseconds=draw(st.integers(0, 10**11))),
        secret_id=draw(_text.filter(lambda t: t == t.strip())),
        org_id=draw(_text.filter(lambda t: t == t.strip())),
        project_id=draw(_optional_id),
        grant_id=draw(_optional_id),
        permission_id=draw(_optional_id),
        user_id=draw(_optional_id.map(lambda t: t if t is None else t.lower())),
        session_id=draw(_optional_id),
        groups=draw(st.lists(_text.filter(lambda t: t == t.strip()), max_size=3)),
        tags=draw(st.dictionaries(_text, _text, max_size=3)),
        input_tokens=draw(tokens),
        cache_read_tokens=draw(tokens),
        output_tokens=output,
        reasoning_tokens=draw(st.integers(0, output)),
        stream=draw(st.booleans()),
        status_code=draw(st.sampled_from([200, 400, 402, 429, 500, 529])),
        latency_ms=draw(st.none() | st.integers(0, 2**31 - 1)),
        request_id=draw(st.none() | _text),
    )
    if draw(st.booleans()):
        record["unpriced"], record["price_version"], record["price_match"] = True, None, None
    record["event"]["units"] = draw(st.dictionaries(_text, st.integers(0, 2**62), max_size=3))
    record["event"]["service_tier"] = draw(st.none() | st.sampled_from(["batch", "priority"]))
    record["counts"] = draw(st.lists(_counts(), max_size=3))
    return PRICED_USAGE.decode(PRICED_USAGE.encode(record))


@st.composite
def _counts(draw: st.DrawFn) -> dict[str, Any]:
    """One PricedUsage.counts item: the counter an event counts in, with its policy."""
    limit = st.none() | st.integers(0, 2**62)
    return {
        "counter_key": draw(_text),
        "budget_id": draw(_text),
        "scope_values": draw(st.lists(_text, max_size=3)),
        "window": draw(st.sampled_from(["day", "month", "total", "rolling:5h"])),
        "period": draw(_text),
        "bucket": draw(st.integers(0, 2**40)),
        "requests": draw(st.integers(0, 1)),
        "limit_nanos": draw(limit),
        "limit_tokens": draw(limit),
        "limit_requests": draw(limit),
        "alert_at": draw(st.lists(st.floats(0, 1), max_size=3)),
    }


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_engine_stores_avro_bodies_exactly_as_python_rows(engine: str, data: Any) -> None:
    """The same records through both paths, into two databases: every column equal."""
    records = [data.draw(_events(offset)) for offset in range(data.draw(st.integers(1, 40)))]
    messages = [as_message(r) for r in records]
    assert all(m.headers for m in messages)  # the ids are canonical: every one goes as bytes
    tables = []
    for avro in (False, True):
        ch = _fresh_database(engine)
        try:
            sink = ClickHouseSink(ch, avro_inserts=avro)
            written = sink.write_messages(messages) if avro else sink.write(records)
            assert written == len({(r["source_partition"], r["source_offset"]) for r in records})
            tables.append(
                ch.query(
                    f"SELECT {', '.join(USAGE_COLUMN_NAMES)} FROM usage_events "
                    "ORDER BY source_partition, source_offset"
                ).result_rows
            )
        finally:
            ch.close()
    assert tables[0] == tables[1]


@st.composite
def _verdicts(draw: st.DrawFn, seq: int) -> dict[str, Any]:
    """A Verdict with every column's kind of value (nulls, unicode, both enums, extremes)."""
    limit = st.none() | st.integers(0, 2**62)
    instant = st.integers(0, 10**11).map(lambda us: T0 - timedelta(microseconds=us))
    return VERDICT.decode(
        VERDICT.encode(
            {
                "counter_key": draw(_text),
                "budget_id": draw(_text),
                "scope": draw(st.sampled_from(["org", "secret", "user"])),
                "scope_values": draw(st.lists(_text, max_size=3)),
                "period": draw(_text),
                "state": draw(st.sampled_from(["ok", "alert", "exceeded"])),
                "spent_nanos": draw(st.integers(0, 2**62)),
                "spent_tokens": draw(st.integers(0, 2**62)),
                "spent_requests": draw(st.integers(0, 2**62)),
                "limit_nanos": draw(limit),
                "limit_tokens": draw(limit),
                "limit_requests": draw(limit),
                "action": draw(st.sampled_from(["enforce", "warn"])),
                "refusal": draw(st.sampled_from(["budget_exceeded", "throttled", ""])),
                "reset_at": draw(st.none() | instant),
                "as_of": draw(instant),
                "seq": seq,
                "emitted_at": draw(instant),
            }
        )
    )


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_engine_stores_verdict_bodies_exactly_as_python_rows(engine: str, data: Any) -> None:
    records = [data.draw(_verdicts(seq)) for seq in range(data.draw(st.integers(1, 30)))]
    tables = []
    for avro in (False, True):
        ch = _fresh_database(engine)
        try:
            sink = ClickHouseSink(ch, avro_inserts=avro)
            if avro:
                written = sink.write_verdict_messages([Message(VERDICT.encode(r)) for r in records])
            else:
                written = sink.write_verdicts(records)
            assert written == len(records)
            tables.append(
                ch.query(
                    f"SELECT {', '.join(VERDICT_COLUMN_NAMES)} FROM budget_state ORDER BY seq"
                ).result_rows
            )
        finally:
            ch.close()
    assert tables[0] == tables[1]


def test_verdicts_go_as_avro_bytes_unless_one_is_not_a_current_verdict(client: Any) -> None:
    spy: Any = FlakyClient(client)
    sent: list[str] = []
    spy.write = lambda send, *a, **k: (sent.append(send.__name__), send(*a, **k))[1]
    sink = ClickHouseSink(spy, avro_inserts=True)
    current = [Message(VERDICT.encode(verdict(key, 1))) for key in ("a,", "b,")]
    assert sink.write_verdict_messages(current) == 2
    assert sent == ["command"]  # one INSERT ... SELECT FROM file(): the engine decoded them
    with pytest.raises(SinkRejected, match="does not decode"):
        sink.write_verdict_messages([*current, Message(b"\xc3\x01garbage")])
    assert sent == ["command"]  # the batch went the decoded way, and stopped at decoding
    assert scalar(client, "SELECT count() FROM budget_state") == 2


def test_records_without_the_header_are_decoded_in_order_between_avro_inserts(
    client: Any,
) -> None:
    """A record whose ids are not canonical (no header) is decoded and canonicalised; the
    batch goes in as three INSERTs in its order, the fences see every row."""
    spy: Any = FlakyClient(client)
    sink = ClickHouseSink(spy, avro_inserts=True)
    sent: list[str] = []
    spy.write = lambda send, *a, **k: (sent.append(send.__name__), send(*a, **k))[1]
    records = [priced(o) for o in range(0, 10)]
    records += [priced(10, org_id=" acme ", user_id="Bob@Example.com")]
    records += [priced(o) for o in range(11, 20)]
    assert sink.write_messages([as_message(r) for r in records]) == 20
    assert sent == ["command", "insert", "command"]
    assert client.query(
        "SELECT org_id, user_id FROM usage_events WHERE source_offset = 10"
    ).result_rows == [("acme", "bob@example.com")]
    assert sink.fences == {(0, month_of(T0)): 19}
    # re-delivered: nothing again, whichever path each record takes
    assert sink.write_messages([as_message(r) for r in records]) == 0
    assert totals(client)[0::2] == (20, 20)


def test_a_store_row_header_that_is_not_one_sends_the_record_the_decoded_way(
    client: Any,
) -> None:
    spy: Any = FlakyClient(client)
    sent: list[str] = []
    spy.write = lambda send, *a, **k: (sent.append(send.__name__), send(*a, **k))[1]
    good = as_message(priced(1))
    bad_values = (b"", b"1:2:202601", b"\x00" * 15, b"\x00" * 17)
    bad_values += (STORE_ROW.pack(-1, 1, 202601), STORE_ROW.pack(0, -1, 202601))
    bad_values += (STORE_ROW.pack(0, 1, 0), STORE_ROW.pack(0, 1, 2026011))
    for bad in bad_values:
        message = Message(good.value, ((STORE_ROW_HEADER, bad),))
        assert ClickHouseSink(spy, avro_inserts=True).write_messages([message]) in (0, 1)
    assert set(sent) == {"insert"} and totals(client)[0::2] == (1, 1)


def test_a_usage_priced_record_that_does_not_decode_is_rejected_not_skipped(
    client: Any,
) -> None:
    sink = ClickHouseSink(client, avro_inserts=True)
    with pytest.raises(SinkRejected, match="does not decode"):
        sink.write_messages([as_message(priced(0)), Message(b"\xc3\x01garbage")])
    assert totals(client)[0] == 0  # nothing of the batch went in: the caller retries it whole


def _fresh_database(engine: str) -> Any:
    """A client on a new database of the module's engine, holding the shipped DDL."""
    admin = open_client(engine)
    name = f"t{next(_db_numbers)}"
    admin.command(f"CREATE DATABASE {name}")
    admin.close()
    ch = open_client(engine, database=name)
    apply_schema(ch)
    return ch


# -- exactness ----------------------------------------------------------------------


def test_sums_are_exact_over_50k_rows_in_10k_batches(client: Any, path: WritePath) -> None:
    rng = random.Random(7)
    sink = path.sink(client)
    expected_cost: Counter[str] = Counter()
    expected_tokens = 0
    offsets = [0] * 4
    for _ in range(5):
        records = []
        for _ in range(10_000):
            p = rng.randrange(4)
            cost = rng.randrange(0, 5_000_000_000)
            rec = priced(offsets[p], partition=p, cost_nanos=cost, org_id=f"org-{rng.randrange(7)}")
            offsets[p] += 1
            expected_cost[rec["event"]["org_id"]] += cost
            expected_tokens += rec["event"]["input_tokens"] + rec["event"]["output_tokens"]
            records.append(rec)
        assert path.write(sink, records) == 10_000
    assert totals(client) == (50_000, sum(expected_cost.values()), 50_000)
    by_org = dict(
        client.query("SELECT org_id, sum(cost_nanos) FROM usage_events GROUP BY org_id").result_rows
    )
    assert by_org == dict(expected_cost)
    assert scalar(client, "SELECT sum(billed_tokens) FROM spend_hourly") == expected_tokens
    _assert_rollups_equal_usage_events(client)
    # the same with every part merged: merges change the storage, never the answers
    for table in ("usage_events", "spend_hourly", "spend_daily"):
        client.command(f"OPTIMIZE TABLE {table} FINAL")
    assert totals(client) == (50_000, sum(expected_cost.values()), 50_000)
    _assert_rollups_equal_usage_events(client)


def _assert_rollups_equal_usage_events(client: Any) -> None:
    measures = (
        "count() AS events",
        "countIf(outcome IN ('refused', 'failed_closed'))",
        "countIf(usage_source = 'estimated')",
        "countIf(unpriced)",
        "sum(input_tokens)",
        "sum(cache_read_tokens)",
        "sum(cache_write_tokens)",
        "sum(cache_write_1h_tokens)",
        "sum(output_tokens)",
        "sum(reasoning_tokens)",
        "sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens)",
        "sum(cost_nanos)",
    )
    sums = (
        "sum(events)",
        "sum(refused_events)",
        "sum(estimated_events)",
        "sum(unpriced_events)",
        "sum(input_tokens)",
        "sum(cache_read_tokens)",
        "sum(cache_write_tokens)",
        "sum(cache_write_1h_tokens)",
        "sum(output_tokens)",
        "sum(reasoning_tokens)",
        "sum(billed_tokens)",
        "sum(cost_nanos)",
    )
    dims = "org_id, secret_id, ifNull(project_id, ''), ifNull(grant_id, ''), ifNull(user_id, '')"
    dims += ", provider, model"
    roll_dims = "org_id, secret_id, project_id, grant_id, user_id, provider, model"
    for bucket, source, table in (
        ("toStartOfHour(toDateTime(occurred_at, 'UTC'))", "hour", "spend_hourly"),
        ("toDate(occurred_at, 'UTC')", "day", "spend_daily"),
    ):
        base = client.query(
            f"SELECT {bucket} AS b, {dims}, {', '.join(measures)} FROM usage_events "
            f"GROUP BY b, {dims} ORDER BY ALL"
        ).result_rows
        rolled = client.query(
            f"SELECT {source} AS b, {roll_dims}, {', '.join(sums)} FROM {table} "
            f"GROUP BY b, {roll_dims} ORDER BY ALL"
        ).result_rows
        assert rolled == base, table
    assert run_query(client, ROLLUP_DRIFT)[1] == []


def test_a_redelivered_overlapping_batch_lands_once(client: Any, path: WritePath) -> None:
    sink = path.sink(client)
    assert path.write(sink, batch(range(0, 6_000), partitions=2)) == 12_000
    # after a crash the consumer re-reads a suffix of each partition, then goes on
    again = batch(range(4_000, 10_000), partitions=2)
    assert path.write(sink, again) == 8_000
    assert totals(client)[0::2] == (20_000, 20_000)
    # a restarted sink reads its fences from ClickHouse and skips the same way
    restarted = path.sink(client)
    assert path.write(restarted, again) == 0
    assert restarted.fences == sink.fences == {(0, month_of(T0)): 9_999, (1, month_of(T0)): 9_999}
    # repeats inside one batch (the producer published a record twice) count once
    twice = batch(range(10_000, 10_010)) * 2
    assert path.write(restarted, twice) == 10
    assert totals(client)[0::2] == (20_010, 20_010)
    _assert_rollups_equal_usage_events(client)


def test_fences_are_per_month_so_a_half_committed_insert_is_completed(
    client: Any, path: WritePath
) -> None:
    """One INSERT spanning two months is two parts, committed one after the other.

    Simulate a crash between the two commits: only the January rows (which carry
    the highest offsets) are stored. A per-partition max would skip the February
    rows; the per-(partition, month) fences store them.
    """
    jan = datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    feb = datetime(2026, 2, 1, 0, 30, tzinfo=UTC)
    records = [priced(o, occurred_at=feb if o < 50 else jan) for o in range(100)]
    path.write(path.sink(client), [r for r in records if r["source_offset"] >= 50])
    restarted = path.sink(client)
    assert path.write(restarted, records) == 50
    assert totals(client)[0::2] == (100, 100)
    assert restarted.fences == {(0, 202601): 99, (0, 202602): 49}


# -- the flush order (aggregator/sink/README.md) ------------------------------------


def test_a_failed_insert_leaves_the_fences_and_the_retried_batch_lands_once(
    client: Any, path: WritePath
) -> None:
    flaky: Any = FlakyClient(client)
    sink = path.sink(flaky)
    path.write(sink, batch(range(0, 100)))
    fences_before = sink.fences
    flaky.fail = "before"  # e.g. connection refused

    with pytest.raises(SinkUnavailable) as info:
        path.write(sink, batch(range(100, 200)))
    assert info.value.retriable and isinstance(info.value, SpendbusError)
    assert sink.fences == fences_before  # step 2 did not happen
    assert sink.pending == 100
    assert totals(client)[0] == 100

    assert path.write(sink, batch(range(100, 200))) == 100  # the caller retries the same batch
    assert sink.fences == {(0, month_of(T0)): 199}
    assert sink.pending == 0
    assert totals(client)[0::2] == (200, 200)


def test_an_insert_that_failed_after_landing_is_retried_once_down_to_the_rollups(
    client: Any, path: WritePath
) -> None:
    flaky: Any = FlakyClient(client, fail="after")  # e.g. an HTTP timeout after the commit
    sink = path.sink(flaky)
    with pytest.raises(SinkUnavailable):
        path.write(sink, batch(range(0, 500), partitions=2))
    assert sink.fences == {} and sink.pending == 1_000
    assert totals(client)[0] == 1_000  # it did land
    assert path.write(sink, batch(range(0, 500), partitions=2)) == 1_000  # sent again, same token
    assert totals(client)[0::2] == (1_000, 1_000)
    assert scalar(client, "SELECT sum(events) FROM spend_hourly") == 1_000
    _assert_rollups_equal_usage_events(client)


def test_a_view_failing_after_the_table_part_committed_is_completed_by_the_retry(
    client: Any, path: WritePath
) -> None:
    """ClickHouse commits the usage_events part before the views: a failing view
    leaves the table written and the rollups not. The retry (same rows, same
    token) is dropped by the table and fills the views, once."""
    client.command("ALTER TABLE spend_daily ADD CONSTRAINT broken CHECK events < 0")
    sink = path.sink(client)
    with pytest.raises(SinkRejected) as info:
        path.write(sink, batch(range(0, 300)))
    assert not info.value.retriable
    assert totals(client)[0] == 300
    assert scalar(client, "SELECT count() FROM spend_daily") == 0
    client.command("ALTER TABLE spend_daily DROP CONSTRAINT broken")
    assert path.write(sink, batch(range(0, 300))) == 300
    assert totals(client)[0::2] == (300, 300)
    assert scalar(client, "SELECT sum(events) FROM spend_daily") == 300
    assert scalar(client, "SELECT sum(events) FROM spend_hourly") == 300
    _assert_rollups_equal_usage_events(client)


@pytest.mark.parametrize("crash_after_step", [0, 1, 2])
def test_a_crash_at_any_flush_step_then_redelivery_stores_each_event_once(
    client: Any, path: WritePath, crash_after_step: int
) -> None:
    """Steps: 1. insert rows, 2. advance the fences, 3. commit the Kafka offsets.

    A crash (the process dies: the in-memory fences and pending insert are lost)
    after step 0, 1 or 2 means the offsets were not committed, so Kafka
    redelivers from the last commit. Whatever the step, each event is stored once.
    """
    records = batch(range(0, 1_000), partitions=2)
    committed = 0  # Kafka: the position the next consumer starts from (as a list index)
    order: list[str] = []

    class Spy(FlakyClient):
        def write(self, send: Any, *args: Any, **kwargs: Any) -> Any:
            # step 1 runs while the fences are still where they were
            assert sink.fences == {}
            order.append("insert")
            if crash_after_step == 0:
                raise SystemExit("killed before the insert")
            result = send(*args, **kwargs)
            if crash_after_step == 1:
                raise SystemExit("killed between insert and fences")
            return result

    spy: Any = Spy(client)
    sink = path.sink(spy)
    try:
        path.write(sink, records)
        order.append("fences")
        assert sink.fences == {(0, month_of(T0)): 999, (1, month_of(T0)): 999}
        if crash_after_step == 2:
            raise SystemExit("killed between fences and commit")
        committed = len(records)
        order.append("commit")
    except SystemExit:
        pass
    assert order == ["insert", "fences"][: max(1, crash_after_step)]
    assert committed == 0

    # a new process: fresh sink, Kafka redelivers everything after the commit
    restarted = path.sink(client)
    path.write(restarted, records[committed:])
    assert totals(client)[0::2] == (2_000, 2_000)
    _assert_rollups_equal_usage_events(client)


def test_forget_makes_a_reassigned_partition_read_its_fences_again(
    client: Any, path: WritePath
) -> None:
    """Rebalance: partition 0 moves from worker A to B and back. B's fences were
    read before A wrote more; A's before B did. forget() on revocation makes
    each read the fences again when the partition comes back."""
    a, b = path.sink(client), path.sink(client)
    path.write(a, batch(range(0, 100)))
    path.write(b, batch(range(0, 100)))  # B held it once: fence 99
    path.write(a, batch(range(100, 300)))  # A wrote up to 299, committed Kafka up to 200
    b.forget([0])  # ...B was told when it lost it
    assert path.write(b, batch(range(200, 400))) == 100  # B resumes from the commit at 200
    a.forget([0])
    assert path.write(a, batch(range(350, 450))) == 50
    assert totals(client)[0::2] == (450, 450)


def test_a_rollup_that_missed_rows_is_seen_and_rebuilt_from_usage_events(
    client: Any, path: WritePath
) -> None:
    sink = path.sink(client)
    path.write(sink, batch(range(0, 200), partitions=3))
    client.command(
        "ALTER TABLE spend_daily DELETE WHERE org_id = 'org-1' SETTINGS mutations_sync = 1"
    )
    drift = run_query(client, ROLLUP_DRIFT)[1]
    assert drift and all(table > rollup for _, table, rollup, *_ in drift)
    assert rebuild_rollups(client) == ["spend_hourly", "spend_daily"]
    assert rebuild_rollups(client) == ["spend_hourly", "spend_daily"]  # twice: same result
    _assert_rollups_equal_usage_events(client)
    path.write(sink, batch(range(200, 300), partitions=3))  # the views go on from there
    _assert_rollups_equal_usage_events(client)


def test_an_unknown_table_is_not_retriable(client: Any, path: WritePath) -> None:
    client.command("DROP TABLE usage_events")
    with pytest.raises(SinkRejected):
        path.write(path.sink(client), batch(range(3)))


# -- budget_state -------------------------------------------------------------------


def verdict(counter: str, seq: int, period: str = "m:2026-11", spent: int = 0) -> dict[str, Any]:
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


def test_latest_budget_state_takes_argmax_by_seq_without_merges(client: Any) -> None:
    client.command("SYSTEM STOP MERGES budget_state")  # the worst case: merges never run
    sink = ClickHouseSink(client)
    # out of order, across batches (so across parts), with a duplicate and a new period
    sink.write_verdicts([verdict("a,", 3, spent=300), verdict("b,", 1, spent=10)])
    sink.write_verdicts([verdict("a,", 5, spent=500), verdict("a,", 4, spent=400)])
    sink.write_verdicts([verdict("a,", 5, spent=500), verdict("b,", 2, "m:2026-12", spent=1_000)])
    sink.write_verdicts([verdict("a,", 1, spent=100)])
    # 7 verdicts, 3 keys: only the two of one insert collapsed (optimize_on_insert)
    assert scalar(client, "SELECT count() FROM budget_state") == 6
    names, rows = run_query(client, LATEST_BUDGET_STATE)
    latest = [dict(zip(names, row, strict=True)) for row in rows]
    assert [(r["counter_key"], r["last_seq"], r["spent_nanos"], r["period"]) for r in latest] == [
        ("a,", 5, 500, "m:2026-11"),
        ("b,", 2, 1_000, "m:2026-12"),
    ]
    assert latest[1]["state"] == "exceeded"
    assert latest[0]["limit_tokens"] is None
    client.command("SYSTEM START MERGES budget_state")
    client.command("OPTIMIZE TABLE budget_state FINAL")
    assert scalar(client, "SELECT count() FROM budget_state") == 3  # (counter, period) keys
    assert run_query(client, LATEST_BUDGET_STATE)[1] == rows


# -- analyst queries ----------------------------------------------------------------


def test_every_example_query_runs_and_answers_from_the_data(client: Any) -> None:
    sink = ClickHouseSink(client)
    records = batch(range(0, 300), partitions=2, cache_read_tokens=40)
    unpriced = priced(300, model="mystery-1")
    unpriced["unpriced"], unpriced["cost_nanos"] = True, 0
    refused = [
        priced(301 + i, outcome="refused", decision=d, decision_budget_id="b1", status_code=429)
        for i, d in enumerate(["budget_exceeded", "budget_exceeded", "throttled"])
    ]
    failed_open = priced(304, outcome="failed_open", decision="failed_open")
    everything = [*records, unpriced, *refused, failed_open]
    sink.write(everything)
    sink.write_verdicts([verdict("a,", 1), verdict("a,", 2, spent=2_000)])

    results = {}
    for name, sql in EXAMPLE_QUERIES.items():
        names, rows = run_query(client, sql)
        assert rows, name
        results[name] = [dict(zip(names, row, strict=True)) for row in rows]

    # every event is within the last 30 days (T0 - 10 hours)
    assert sum(r["cost_nanos"] for r in results["spend_by_org_per_day"]) == sum(
        r["cost_nanos"] for r in everything
    )
    assert all(r["cost_usd"] * 10**9 == r["cost_nanos"] for r in results["spend_by_org_per_day"])
    assert results["unpriced_usage"] == [
        {
            "org_id": unpriced["event"]["org_id"],
            "provider": "anthropic",
            "model": "mystery-1",
            "events": 1,
            "billed_tokens": 100 + 300 % 97 + 10 + 300 % 13,
            "first_seen": unpriced["event"]["occurred_at"],
            "last_seen": unpriced["event"]["occurred_at"],
        }
    ]
    refusals = {(r["decision"], r["refusals"]) for r in results["refusals_by_decision"]}
    assert refusals == {("budget_exceeded", 2), ("throttled", 1)}
    assert results["latest_budget_state"][0]["last_seq"] == 2
    month_start = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    this_month = [r for r in everything if r["event"]["occurred_at"] >= month_start]
    by_secret: defaultdict[tuple[str, str], int] = defaultdict(int)
    for r in this_month:
        by_secret[(r["event"]["org_id"], r["event"]["secret_id"])] += r["cost_nanos"]
    top = results["top_secrets_this_month"]
    assert {(r["org_id"], r["secret_id"]): r["cost_nanos"] for r in top} == dict(by_secret)
    assert [r["cost_nanos"] for r in top] == sorted(by_secret.values(), reverse=True)
    cache = results["cache_savings_this_month"]
    assert sum(r["cached_tokens"] for r in cache) == 40 * len(
        [r for r in this_month if r["event"]["cache_read_tokens"]]
    )


def test_an_empty_result_still_names_its_columns(client: Any) -> None:
    names, rows = run_query(client, EXAMPLE_QUERIES["unpriced_usage"])
    assert rows == []
    assert names[:3] == ["org_id", "provider", "model"]


def test_readme_shows_every_example_query_verbatim() -> None:
    readme = (REPO / "infra" / "clickhouse" / "README.md").read_text()
    for name, sql in {**EXAMPLE_QUERIES, "rollup_drift": ROLLUP_DRIFT}.items():
        assert sql in readme, f"{name} is not in infra/clickhouse/README.md as in query.py"


# -- connecting ---------------------------------------------------------------------


def test_two_clients_on_one_path_in_one_process_share_the_engine(engine: str, client: Any) -> None:
    database = scalar(client, "SELECT currentDatabase()")
    other = open_client(engine, database=database)
    try:
        ClickHouseSink(other).write(batch(range(5)))
        assert totals(client)[0] == 5
    finally:
        other.close()
    assert totals(client)[0] == 5  # closing one client leaves the engine to the others


@pytest.mark.parametrize(
    "dsn", ["chdb://relative/path", "chdb:///abs?opt=1", "ftp://host/db", "http:///db"]
)
def test_a_malformed_dsn_is_a_config_error(dsn: str) -> None:
    with pytest.raises(ConfigError):
        open_client(dsn)


def test_an_unreachable_server_is_retriable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SinkUnavailable) as info:
        open_client(f"http://default:secret@127.0.0.1:{port}/default")
    assert info.value.retriable
    assert "secret" not in str(info.value)


def test_a_data_path_held_by_another_process_names_it_until_it_dies(tmp_path: Path) -> None:
    """chdb hides why it cannot start; open_client finds the lock and its holder."""
    dsn = f"chdb://{tmp_path}/held"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from aggregator.sink import open_client\n"
            f"client = open_client({dsn!r})\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    probe = (
        "from aggregator.sink import open_client, DataPathInUse\n"
        "try:\n"
        f"    open_client({dsn!r})\n"
        "    print('opened')\n"
        "except DataPathInUse as exc:\n"
        "    print('in use', exc.retriable, exc.holder)\n"
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        ).stdout
        assert out.strip() == f"in use True pid {holder.pid}"
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    deadline = time.monotonic() + 30
    out = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        ).stdout
        if out.strip() == "opened":
            break
    assert out.strip() == "opened"
    assert issubclass(DataPathInUse, SinkUnavailable)


# -- the package --------------------------------------------------------------------


def test_public_names() -> None:
    assert sorted(sink_pkg.__all__) == sorted(
        [
            "DDL_DIR",
            "EXAMPLE_QUERIES",
            "ROLLUP_DRIFT",
            "USAGE_COLUMNS",
            "VERDICT_COLUMNS",
            "ClickHouseSink",
            "DataPathInUse",
            "SinkError",
            "SinkRejected",
            "SinkUnavailable",
            "apply_schema",
            "open_client",
            "rebuild_rollups",
            "rows_from_priced",
            "rows_from_verdicts",
            "run_query",
            "split_statements",
        ]
    )


def test_the_sink_imports_neither_ingest_nor_enforcer() -> None:
    for path in (REPO / "aggregator" / "sink").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in {"ingest", "enforcer"}, (path.name, name)

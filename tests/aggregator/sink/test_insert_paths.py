"""What the sink stores, on both insert paths: rows exactly as Python builds them, Avro
bodies the engine decodes itself, canonical ids, records it must reject."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.sink import (
    ClickHouseSink,
    SinkRejected,
    rows_from_priced,
)
from aggregator.sink.avro_rows import insert_select
from aggregator.sink.rows import USAGE_COLUMN_NAMES, VERDICT_COLUMN_NAMES, month_of
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.records import CounterCount, PricedUsage, Verdict
from schemas.topics import STORE_ROW, STORE_ROW_HEADER
from schemas.usage import MAX_TOKENS_PER_EVENT
from tests.aggregator.sink.kit import (
    T0,
    FlakyClient,
    Message,
    WritePath,
    as_message,
    fresh_database,
    priced,
    scalar,
    totals,
    verdict,
)


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

_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
_optional_id = st.none() | _text.filter(lambda t: t == t.strip())


@st.composite
def _events(draw: st.DrawFn, offset: int) -> PricedUsage:
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
def _counts(draw: st.DrawFn) -> CounterCount:
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
        ch = fresh_database(engine)
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
def _verdicts(draw: st.DrawFn, seq: int) -> Verdict:
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
                "burn_nanos": draw(limit),
                "burn_tokens": draw(limit),
                "burn_requests": draw(limit),
                "burn_span_us": draw(limit),
                "exhausts_at": draw(st.none() | instant),
            }
        )
    )


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_engine_stores_verdict_bodies_exactly_as_python_rows(engine: str, data: Any) -> None:
    records = [data.draw(_verdicts(seq)) for seq in range(data.draw(st.integers(1, 30)))]
    tables = []
    for avro in (False, True):
        ch = fresh_database(engine)
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


def record_sends(spy: Any) -> list[str]:
    """Replaces the spy's ``write``: each insert goes as it is, its method's name noted."""
    sent: list[str] = []

    def write(send: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(send.__name__)
        return send(*args, **kwargs)

    spy.write = write
    return sent


def test_verdicts_go_as_avro_bytes_unless_one_is_not_a_current_verdict(client: Any) -> None:
    spy: Any = FlakyClient(client)
    sent = record_sends(spy)
    sink = ClickHouseSink(spy, avro_inserts=True)
    current = [Message(VERDICT.encode(verdict(key, 1))) for key in ("a,", "b,")]
    assert sink.write_verdict_messages(current) == 2
    assert sent == ["command"]  # one INSERT ... SELECT FROM file(): the engine decoded them
    with pytest.raises(SinkRejected, match="does not decode"):
        sink.write_verdict_messages([*current, Message(b"\xc3\x01garbage")])
    assert sent == ["command"]  # the batch went the decoded way, and stopped at decoding
    assert scalar(client, "SELECT count() FROM budget_state") == 2


def test_the_avro_inserts_carry_their_settings_in_the_statement(client: Any) -> None:
    """Per-call settings cost a dozen engine queries on the embedded client (SET each, SET
    it back): the Avro INSERTs name theirs in the statement, and they take effect there."""
    #: per INSERT: its statement, its per-call arguments, its container file and the bytes
    #: the file held (it is removed after the INSERT)
    calls: list[tuple[str, dict[str, Any], Path, bytes]] = []

    class Recording(FlakyClient):
        def command(self, sql: str, *args: Any, **kwargs: Any) -> Any:
            if sql.startswith("INSERT"):
                path = Path(sql.split("FROM file('", 1)[1].split("'", 1)[0])
                calls.append((sql, kwargs, path, path.read_bytes()))
            return super().command(sql, *args, **kwargs)

    recording: Any = Recording(client)
    sink = ClickHouseSink(recording, avro_inserts=True)
    assert sink.write_messages([as_message(priced(o)) for o in range(5)]) == 5
    assert sink.write_verdict_messages([Message(VERDICT.encode(verdict("a,", 1)))]) == 1
    (usage_sql, usage_kwargs, usage_file, usage_bytes), (verdict_sql, verdict_kwargs, *_) = calls
    assert usage_kwargs == {} and verdict_kwargs == {}
    head = usage_sql.split(" SELECT ", 1)[0]
    assert "max_insert_threads = 1" in head and "insert_deduplicate = 1" in head
    token = head.split("insert_deduplication_token = '", 1)[1].split("'", 1)[0]
    assert token.startswith("spendbus-")
    assert "async_insert = 0" in verdict_sql.split(" SELECT ", 1)[0]
    # the token in the statement is the one ClickHouse deduplicates by: the same INSERT
    # sent again (an unknown outcome retried) is dropped, down to the rollups
    usage_file.write_bytes(usage_bytes)
    try:
        client.command(usage_sql)
    finally:
        usage_file.unlink()
    assert totals(client)[0::2] == (5, 5)
    assert scalar(client, "SELECT sum(events) FROM spend_hourly") == 5


def test_a_setting_value_is_quoted_in_the_statement() -> None:
    sql = insert_select(
        "usage_events",
        [("event_id", "String")],
        "/tmp/x.avro",
        settings={"insert_deduplication_token": "a'b\\c", "max_insert_threads": 1},
    )
    assert (
        "SETTINGS insert_deduplication_token = 'a\\'b\\\\c', max_insert_threads = 1 SELECT" in sql
    )


def test_records_without_the_header_are_decoded_in_order_between_avro_inserts(
    client: Any,
) -> None:
    """A record whose ids are not canonical (no header) is decoded and canonicalised; the
    batch goes in as three INSERTs in its order, the fences see every row."""
    spy: Any = FlakyClient(client)
    sink = ClickHouseSink(spy, avro_inserts=True)
    sent = record_sends(spy)
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
    sent = record_sends(spy)
    good = as_message(priced(1))
    bad_values: tuple[bytes, ...] = (b"", b"1:2:202601", b"\x00" * 15, b"\x00" * 17)
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

"""The counting stage's pure pieces: hot-path encoders equal the codec, the verdict
coalescer's rule, the incremental rolling sums, the applicable() memo, and the live
state store (objects updated in place, recovered from a changelog after a crash)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.applicable import ApplicableCache
from aggregator.counting.batch_output import VerdictChange
from aggregator.counting.counter_codec import decode_counter, encode_counter
from aggregator.counting.decode import decode_usage_event, read_usage_event
from aggregator.counting.fold import CounterState, PeriodTotals, apply
from aggregator.counting.priced import TAIL_IS_KNOWN, PricedWriter, zigzag_varint
from aggregator.counting.process import BatchProcessor
from aggregator.counting.verdicts import VerdictCoalescer
from schemas.budgets import applicable, budgets_from_yaml
from schemas.codec import PRICED_USAGE, USAGE_EVENT, VERDICT, priced_usage_from_raw
from schemas.errors import DecodeError, InvalidRecord
from schemas.periods import ROLLING_BUCKETS
from schemas.usage import new_usage_event, validate_decoded_usage_event, validate_usage_event
from tests.aggregator.test_process import BUDGETS, T0, event, records, reference
from tests.schemas.test_units import _EDGES as EDGES
from tests.schemas.test_units import event as unit_event

# --- PricedUsage tail ------------------------------------------------------------------


def test_the_tail_writer_knows_the_current_schema() -> None:
    assert TAIL_IS_KNOWN  # else it silently defers to the codec: update priced.KNOWN_TAIL


@settings(max_examples=200, deadline=None)
@given(
    cost=st.integers(0, 2**62),
    version=st.one_of(st.none(), st.text(max_size=20)),
    match=st.one_of(st.none(), st.text(max_size=20)),
    unpriced=st.booleans(),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**62),
    micros=st.integers(0, 10**17),
)
def test_priced_bytes_equal_the_codec(
    cost: int,
    version: str | None,
    match: str | None,
    unpriced: bool,
    partition: int,
    offset: int,
    micros: int,
) -> None:
    raw = USAGE_EVENT.encode(event(1))
    priced_at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    tail = {
        "cost_nanos": cost,
        "price_version": version,
        "price_match": match,
        "unpriced": unpriced,
        "source_partition": partition,
        "source_offset": offset,
        "priced_at": priced_at,
    }
    mine = PricedWriter(priced_at).write(
        raw,
        cost_nanos=cost,
        price_version=version,
        price_match=match,
        unpriced=unpriced,
        source_partition=partition,
        source_offset=offset,
    )
    assert mine == priced_usage_from_raw(raw, tail)
    assert PRICED_USAGE.decode(mine)["source_offset"] == offset  # type: ignore[arg-type]  # the writer's bytes, never None here


def test_a_raw_event_of_another_schema_version_is_left_to_the_codec() -> None:
    raw = b"\xc3\x01" + b"\x00" * 8 + USAGE_EVENT.encode(event(1))[10:]
    written = PricedWriter(T0).write(
        raw,
        cost_nanos=1,
        price_version=None,
        price_match=None,
        unpriced=True,
        source_partition=0,
        source_offset=0,
    )
    assert written is None


@pytest.mark.parametrize(
    "n", [0, 1, 63, 64, -1, -64, -65, 127, 128, 2**13, 2**14, 2**31, -(2**63), 2**63 - 1]
)
def test_zigzag_matches_avro(n: int) -> None:
    buf = io.BytesIO()
    schemaless_writer(buf, {"type": "long"}, n)
    assert zigzag_varint(n) == buf.getvalue()


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_zigzag_matches_avro_for_any_long(n: int) -> None:
    buf = io.BytesIO()
    schemaless_writer(buf, {"type": "long"}, n)
    assert zigzag_varint(n) == buf.getvalue()


# --- UsageEvent hot decode ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    seconds=st.integers(0, 10**9),
    tokens=st.integers(0, 10**6),
    user=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    tags=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)
def test_hot_decode_equals_the_codec(
    seconds: int, tokens: int, user: str | None, tags: dict[str, str]
) -> None:
    e = new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o",
        secret_id="sk",
        org_id="acme",
        gateway_id="gw",
        input_tokens=tokens,
        output_tokens=tokens // 2,
        user_id=user,
        tags=tags,
        occurred_at=datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds, microseconds=7),
    )
    raw = USAGE_EVENT.encode(e)
    assert decode_usage_event(raw) == USAGE_EVENT.decode(raw) == e


def _raw_with(**fields: Any) -> bytes:
    buf = io.BytesIO()
    buf.write(USAGE_EVENT.header)
    record = {**event(1), **fields}
    plain = {
        **USAGE_EVENT.schema,
        "fields": [
            {**f, "type": "long"} if f["name"] == "occurred_at" else f
            for f in USAGE_EVENT.schema["fields"]
        ],
    }
    schemaless_writer(buf, plain, record)
    return buf.getvalue()


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"not avro",
        USAGE_EVENT.header + b"\x02\x41",
        USAGE_EVENT.encode(event(1)) + b"\x00",  # trailing bytes
        VERDICT.header + b"\x00",
        _raw_with(occurred_at=2**62),  # a time no datetime can hold
    ],
)
def test_hot_decode_fails_exactly_like_the_codec(value: bytes | None) -> None:
    with pytest.raises(DecodeError) as codec:
        USAGE_EVENT.decode(value)  # type: ignore[arg-type]  # a null record must be refused as one
    with pytest.raises(DecodeError) as hot:
        decode_usage_event(value)
    assert (hot.value.reason, str(hot.value)) == (codec.value.reason, str(codec.value))


# --- verdict coalescing ------------------------------------------------------------------

PER_SECRET = next(b for b in BUDGETS if b.budget_id == "per-secret")  # $0.05, alert at 50 %


def _change(nanos: int, period: str = "m:2026-11") -> VerdictChange:
    state = CounterState(period=period, seq=1, periods={period: PeriodTotals(nanos=nanos)})
    return VerdictChange(PER_SECRET, ("acme", "sk-a"), state)


def test_a_counter_sends_at_once_then_at_most_once_per_interval() -> None:
    c = VerdictCoalescer(0.05)
    assert c.offer("k", _change(1), now=10.0)  # first: at once
    assert not c.offer("k", _change(2), now=10.01)  # spend moved, same state: held
    assert not c.offer("k", _change(3), now=10.02)
    assert c.next_due() == pytest.approx(10.05)
    assert c.due(10.04) == []
    (key, change), *rest = c.due(10.05)
    assert key == "k" and not rest
    assert change.state.periods["m:2026-11"].nanos == 3  # the newest totals go out
    assert c.offer("k", _change(4), now=10.2)  # quiet for longer than the interval: at once


def test_a_state_or_period_change_is_never_held() -> None:
    c = VerdictCoalescer(0.05)
    assert c.offer("k", _change(1), now=1.0)
    assert c.offer("k", _change(30_000_000), now=1.001)  # ok -> alert (50 % of $0.05)
    assert c.offer("k", _change(50_000_000), now=1.002)  # alert -> exceeded
    assert c.offer("k", _change(1, period="m:2026-12"), now=1.003)  # a new period
    assert not c.offer("k", _change(2, period="m:2026-12"), now=1.004)
    assert len(c) == 1


def test_force_sends_everything_held_before_a_commit() -> None:
    c = VerdictCoalescer(0.1)
    for key in ("a", "b"):
        c.offer(key, _change(1), now=0.0)
        c.offer(key, _change(2), now=0.01)
    assert sorted(k for k, _ in c.due(0.02, force=True)) == ["a", "b"]
    assert len(c) == 0 and c.next_due() is None


def test_the_interval_is_bounded_by_the_issue() -> None:
    with pytest.raises(ValueError, match="interval"):
        VerdictCoalescer(0.5)


# --- rolling windows: incremental sums equal the reference sum ---------------------------

ROLLING = budgets_from_yaml(
    yaml.safe_load('- {id: r, scope: org, window: "rolling:1h", limit_usd: "100"}')
)[0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-7200, 7200), st.integers(0, 1000)), max_size=80))
def test_rolling_sums_equal_the_live_buckets(steps: list[tuple[int, int]]) -> None:
    state = CounterState()
    width = ROLLING.window.rolling_us // ROLLING_BUCKETS
    for offset, (seconds, cost) in enumerate(steps):
        e = event(offset, occurred_at=T0 + timedelta(seconds=seconds))
        apply(state, ROLLING, e, cost, 0, offset)
        totals = state.periods[state.period]
        start = totals.as_of_us // width - ROLLING_BUCKETS + 1
        assert all(b >= start for b in totals.buckets)
        assert totals.nanos == sum(b[0] for b in totals.buckets.values())
        assert totals.tokens == sum(b[1] for b in totals.buckets.values())
        assert totals.requests == sum(b[2] for b in totals.buckets.values())


# --- apply's shortcuts: what the caller passes equals what apply reads itself ------------

ALERTED = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: a, scope: org, window: day, limit_usd: "0.5", alert_at: [0.5, 0.9], count_denied: true}
- {id: n, scope: org, window: month, limit_usd: "1"}
"""
    )
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3 * 86_400),
            st.sampled_from(["allowed", "refused", "failed_open", "failed_closed"]),
            st.booleans(),
            st.integers(0, 200_000_000),
        ),
        max_size=30,
    )
)
def test_apply_with_the_callers_shortcuts_equals_apply_alone(
    steps: list[tuple[int, str, bool, int]],
) -> None:
    """The fold passes ``counted`` and ``charge`` it read once per event; a Change that
    crossed no threshold is shared: both leave every state and every answer as before."""
    for budget in ALERTED:
        alone, shortcut = CounterState(), CounterState()
        for offset, (seconds, outcome, is_charge, cost) in enumerate(steps):
            e = event(
                offset,
                occurred_at=T0 + timedelta(seconds=seconds),
                outcome=outcome,
                charge_of="ev-first" if is_charge else None,
            )
            expected = apply(alone, budget, e, cost, 0, offset)
            got = apply(
                shortcut,
                budget,
                e,
                cost,
                0,
                offset,
                counted=outcome in ("allowed", "failed_open"),
                charge=is_charge,
            )
            assert got == expected
            assert shortcut == alone
            # a re-delivery is fenced either way
            assert apply(shortcut, budget, e, cost, 0, offset, counted=True, charge=False) is None


# --- the applicable() memo ---------------------------------------------------------------

MEMO_BUDGETS = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: s, scope: secret, window: month, limit_usd: "1"}
- {id: u, scope: user, window: day, limit_usd: "1", match: {model: [gpt-4o]}}
- {id: g, scope: group, window: total, limit_usd: "1"}
- {id: t, scope: "tag:team", window: total, limit_usd: "1"}
- {id: j, scope: session, window: total, limit_usd: "1"}
- {id: p, scope: project, window: week, limit_usd: "1", match: {"tag:env": [prod]}}
"""
    )
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "org_id": st.sampled_from(["acme", " ACME ", "globex"]),
                "secret_id": st.sampled_from(["sk-1", "sk-2"]),
                "user_id": st.sampled_from([None, "Bob@x.io", "bob@x.io ", "eve"]),
                "session_id": st.sampled_from([None, "job-1"]),
                "project_id": st.sampled_from([None, "p1"]),
                "model": st.sampled_from(["gpt-4o", "claude-sonnet-4-5"]),
                "groups": st.lists(st.sampled_from(["eng", "ops"]), max_size=2),
                "tags": st.dictionaries(
                    st.sampled_from(["team", "env"]), st.sampled_from(["a", "prod"])
                ),
            }
        ),
        max_size=30,
    ),
    st.sampled_from([1, 3, 100_000]),
)
def test_the_memo_answers_what_applicable_answers(attrs: list[dict[str, Any]], limit: int) -> None:
    # a small limit forgets mid-stream (the whole memo and each budget's)
    memo = ApplicableCache(limit=limit)
    memo.reset(MEMO_BUDGETS)
    for a in attrs + attrs:
        assert [found[:3] for found in memo.lookup(a)] == applicable(MEMO_BUDGETS, a)


# --- the live store: objects updated in place, a crash restores the changelog ------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=1, max_size=40), st.integers(1, 6), st.data())
def test_live_states_with_crashes_equal_one_clean_pass(
    ids: list[int], batch_size: int, data: st.DataObject
) -> None:
    """The stage's store: counters are live objects; the changelog gets their JSON per batch;
    a crash loses memory and what was not flushed, then the chunk is delivered again."""
    evs = [event(i, secret_id=f"sk-{i % 3}") for i in ids]
    batch = records(evs)
    processor = BatchProcessor(reference(), source_topic="usage.raw")
    live: dict[str, CounterState] = {}
    seen: dict[str, str] = {}
    changelog: dict[str, bytes] = {}
    seen_log: dict[str, str] = {}

    def read_live(_: int, key: str) -> CounterState | None:
        return live.get(key)

    def read_seen(_: int, key: str) -> str | None:
        return seen.get(key)

    for start in range(0, len(batch), batch_size):
        chunk = batch[start : start + batch_size]
        for attempt in range(2):
            out = processor.process(chunk, read_live, read_seen)
            for (_, key), state in out.counter_states.items():
                live[key] = state
            seen.update({k: v for (_, k), v in out.seen_writes.items()})
            flushed = data.draw(st.sampled_from(["all", "some", "none"]))
            writes = list(out.counter_states.items())
            if flushed == "some":
                writes = writes[: len(writes) // 2]
            if flushed != "none":
                changelog.update({k: encode_counter(s) for (_, k), s in writes})
            if data.draw(st.booleans()):  # the two changelogs land independently
                seen_log.update({k: v for (_, k), v in out.seen_writes.items()})
            if attempt == 0 and data.draw(st.booleans()):  # crash before the commit
                live.clear()
                live.update({k: decode_counter(v) for k, v in changelog.items()})
                seen.clear()
                seen.update(seen_log)
                continue
            changelog.update({k: encode_counter(s) for k, s in live.items()})
            seen_log.update(seen)
            break
    clean = BatchProcessor(reference(), source_topic="usage.raw")
    expected: dict[str, CounterState] = {}
    clean_seen: dict[str, str] = {}
    out = clean.process(batch, lambda _, k: expected.get(k), lambda _, k: clean_seen.get(k))
    for (_, key), state in out.counter_states.items():
        expected[key] = state
    assert {k: s.to_json() for k, s in live.items()} == {
        k: s.to_json() for k, s in expected.items()
    }


# --- decoded events: validation that trusts the reader ------------------------------------


def _decoded_agrees(candidate: dict[str, Any]) -> None:
    """Written as Avro and read back as the fold reads it, the candidate is refused by
    validate_decoded_usage_event exactly when validate_usage_event refuses it, naming the
    same field."""
    buf = io.BytesIO()
    buf.write(USAGE_EVENT.header)
    try:
        schemaless_writer(buf, USAGE_EVENT.parsed, candidate)
        decoded, occurred_us = read_usage_event(buf.getvalue())
    except Exception:  # not writable as a UsageEvent, or not read back: no decoded event
        return
    try:
        validate_usage_event(decoded)
    except InvalidRecord as refused:
        with pytest.raises(InvalidRecord) as info:
            validate_decoded_usage_event(decoded, occurred_us)
        assert info.value.field == refused.field
    else:
        validate_decoded_usage_event(decoded, occurred_us)


def test_the_decoded_validation_agrees_on_every_edge_of_every_field() -> None:
    valid = unit_event(cache_write_tokens=3, cache_write_1h_tokens=1, reasoning_tokens=2)
    for name in valid:
        for value in EDGES:
            _decoded_agrees({**valid, name: value})
    for units in ({"image": 1}, {"Bad Name": 1}, {"image": -1}, {"image": 2**40}):
        _decoded_agrees({**valid, "units": units})
    for tier in ("flex", "no such tier!", ""):
        _decoded_agrees({**valid, "service_tier": tier})


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(unit_event().keys())),
        st.sampled_from(EDGES),
        min_size=2,
        max_size=5,
    )
)
def test_the_decoded_validation_agrees_on_combined_edges(changes: dict[str, Any]) -> None:
    _decoded_agrees({**unit_event(), **changes})

"""Money, periods, counter keys, canonical ids, UsageEvent validation."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import ContractError, InvalidRecord
from schemas.ids import MAX_ID_LENGTH, canonical_id, compose, counter_key, decompose
from schemas.money import format_usd, line_cost, round_nanos, usd_to_nanos
from schemas.periods import (
    ROLLING_BUCKETS,
    parse_window,
    period_end,
    period_key,
    period_start,
    rolling_bucket,
    rolling_live_buckets,
)
from schemas.records import UsageEvent
from schemas.usage import (
    MAX_OCCURRED_AT,
    MAX_TOKENS_PER_EVENT,
    MIN_OCCURRED_AT,
    billed_tokens,
    new_usage_event,
    usage_event_from_json,
    usage_event_to_json,
)


def test_money_is_exact_and_rounds_half_even() -> None:
    assert usd_to_nanos("500") == 500_000_000_000
    assert usd_to_nanos("0.000000001") == 1
    with pytest.raises(ContractError):
        usd_to_nanos("0.0000000001")
    with pytest.raises(ContractError):
        usd_to_nanos(0.1)  # type: ignore[arg-type]  # a float is what is refused
    # 1 token at $0.0005/Mtok = 0.5 nanos -> ties to even: 0; 3 tokens = 1.5 -> 2
    assert round_nanos(line_cost(1, Decimal("0.0005"))) == 0
    assert round_nanos(line_cost(3, Decimal("0.0005"))) == 2
    assert round_nanos(line_cost(5, Decimal("0.0005"))) == 2
    assert format_usd(1_234_567_890) == "$1.2346"
    # a few nanos read in fixed point, as every other amount (never "$5E-9")
    assert format_usd(5, 9) == "$0.000000005"
    assert format_usd(50, 8) == "$0.00000005"
    # ties to even, negatives (a -0 keeps its sign, as Decimal's), no decimals
    assert [format_usd(n) for n in (50_000, 150_000, 250_001, -150_000, -1)] == [
        "$0.0000",
        "$0.0002",
        "$0.0003",
        "$-0.0002",
        "$-0.0000",
    ]
    assert (format_usd(1_500_000_000, 0), format_usd(10**21, 2)) == ("$2", "$1000000000000.00")


@pytest.mark.parametrize(
    ("window", "ts", "key", "end"),
    [
        ("day", "2026-11-30T23:59:59.999999", "d:2026-11-30", "2026-12-01T00:00:00"),
        ("month", "2026-12-31T10:00:00", "m:2026-12", "2027-01-01T00:00:00"),
        ("week", "2026-11-30T00:00:00", "w:2026-W49", "2026-12-07T00:00:00"),  # a Monday
        (
            "week",
            "2027-01-01T00:00:00",
            "w:2026-W53",
            "2027-01-04T00:00:00",
        ),  # ISO year != calendar
        ("total", "2026-11-30T00:00:00", "t", None),
        ("rolling:5h", "2026-11-30T00:00:00", "r:5h", None),
    ],
)
def test_period_keys_and_resets(window: str, ts: str, key: str, end: str | None) -> None:
    when = datetime.fromisoformat(ts).replace(tzinfo=UTC)
    w = parse_window(window)
    assert period_key(w, when) == key
    expected_end = None if end is None else datetime.fromisoformat(end).replace(tzinfo=UTC)
    assert period_end(w, when) == expected_end
    start = period_start(w, when)
    if start is not None:
        assert start <= when < period_end(w, when)  # type: ignore[operator]  # a period with a start has an end


def test_rolling_windows_keep_48_buckets() -> None:
    w = parse_window("rolling:24h")
    assert w.bucket_us == 30 * 60 * 1_000_000
    live = rolling_live_buckets(w, 10**15)
    assert len(live) == ROLLING_BUCKETS and live[-1] == rolling_bucket(w, 10**15)
    assert parse_window("rolling:1440m").spec == "rolling:1d"


@pytest.mark.parametrize("bad", ["hour", "rolling:", "rolling:0h", "rolling:5", "rolling:5s", ""])
def test_bad_windows_are_refused(bad: str) -> None:
    with pytest.raises(ContractError):
        parse_window(bad)


def test_counter_keys_cannot_collide_across_separators() -> None:
    assert counter_key("b", ["a|b", "c"]) != counter_key("b", ["a", "b|c"])
    assert counter_key("b", ["a,1:", "c"]) != counter_key("b", ["a", "1:c"])


@given(st.lists(st.text(), max_size=6))
def test_compose_is_injective(parts: list[str]) -> None:
    assert decompose(compose(parts)) == parts


def test_canonical_ids() -> None:
    assert canonical_id(" Alice@Example.COM ", "user_id") == "alice@example.com"
    assert canonical_id(" Org-A ", "org_id") == "Org-A"


def event(**over: Any) -> UsageEvent:
    base = dict(
        provider="openai",
        api="openai-chat",
        model="gpt-4o",
        secret_id="s",
        org_id="o",
        gateway_id="g",
        input_tokens=10,
        output_tokens=5,
    )
    base.update(over)
    return new_usage_event(**base)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input_tokens", -1),
        ("output_tokens", "12"),
        ("output_tokens", True),
        ("input_tokens", 10**12),
        ("org_id", ""),
        ("org_id", "   "),
        ("status_code", 42),
        ("occurred_at", datetime(1999, 1, 1, tzinfo=UTC)),
        ("occurred_at", datetime(2026, 1, 1)),  # naive
        ("cache_write_1h_tokens", 1),  # > cache_write_tokens (0)
        ("reasoning_tokens", 6),  # > output_tokens (5)
        ("tags", {"a": 1}),
        ("user_id", "x" * 600),
        ("event_id", "\x00unpriced\x00gpt-4o"),
    ],
)
def test_invalid_events_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidRecord) as info:
        event(**{field: value})
    assert info.value.field == field
    assert field in str(info.value)


def test_json_round_trip_and_billed_tokens() -> None:
    e = event(cache_read_tokens=3, cache_write_tokens=2, user_id="bob")
    assert usage_event_from_json(usage_event_to_json(e)) == e
    assert billed_tokens(e) == 10 + 3 + 2 + 5


def test_json_events_need_an_event_id_and_a_zoned_time() -> None:
    raw = usage_event_to_json(event())
    no_id = {k: v for k, v in raw.items() if k != "event_id"}
    with pytest.raises(InvalidRecord, match="event_id"):
        usage_event_from_json(no_id)
    with pytest.raises(InvalidRecord, match="occurred_at"):
        usage_event_from_json({**raw, "occurred_at": "2026-11-30T10:00:00"})
    with pytest.raises(InvalidRecord, match="input_tokens"):
        usage_event_from_json({k: v for k, v in raw.items() if k != "input_tokens"})


class _Text(str):
    """A str subclass: valid for the contract, not 'plain' for the quick test."""


#: the edges: blank and over-long ids, small counts that break the token sums, the
#: bounds of counts, statuses and times, and values of the wrong type
_EDGES: list[object] = [
    *["", " ", "\t\n", "\u2003", "x" * MAX_ID_LENGTH, "x" * (MAX_ID_LENGTH + 1), "a\x00"],
    *[-1, 0, 1, 5, 6, 99, 100, 599, 600, MAX_TOKENS_PER_EVENT, MAX_TOKENS_PER_EVENT + 1],
    *[MIN_OCCURRED_AT, MAX_OCCURRED_AT, datetime(1999, 12, 31, tzinfo=UTC), datetime(2026, 1, 1)],
    *[None, True, False, 1.5, _Text("t"), [], ["a"], ["a", 1], {}, {"a": "b"}, {"a": 1}],
    *["reported", "estimated", "none", "allowed", "refused", "failed_open"],
]


def _agrees(candidate: dict[str, Any]) -> None:
    """The quick test never passes what the field-by-field reading refuses, and
    validate_usage_event names the same field as that reading."""
    from schemas.usage import _explain_invalid, _plainly_valid, validate_usage_event

    try:
        _explain_invalid(candidate)
    except InvalidRecord as refused:
        assert not _plainly_valid(candidate), candidate
        with pytest.raises(InvalidRecord) as info:
            validate_usage_event(candidate)
        assert info.value.field == refused.field
    else:
        validate_usage_event(candidate)


def test_the_quick_validity_test_agrees_on_every_edge_of_every_field() -> None:
    valid = event(cache_write_tokens=3, cache_write_1h_tokens=1, reasoning_tokens=2)
    assert __import__("schemas.usage").usage._plainly_valid(valid)
    for name in valid:
        for value in _EDGES:
            _agrees({**valid, name: value})
        _agrees({k: v for k, v in valid.items() if k != name})  # missing


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from(sorted(event().keys())), st.sampled_from(_EDGES), min_size=2, max_size=5
    )
)
def test_the_quick_validity_test_agrees_on_combined_edges(changes: dict[str, Any]) -> None:
    _agrees({**event(), **changes})

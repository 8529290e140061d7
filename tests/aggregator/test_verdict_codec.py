"""The hot-path Verdict writer equals the codec: same bytes for every counter, window and
limit, and the codec's own error for a value neither can write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.fold import CounterState, PeriodTotals, verdict_record
from aggregator.counting.verdict_codec import encode_verdict
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import VERDICT
from schemas.periods import from_micros, period_key, to_micros

WINDOWS = ("day", "week", "month", "total", "rolling:1h", "rolling:7d")
LIMITS = ({"limit_usd": "12.5"}, {"limit_tokens": 1000}, {"limit_requests": 3})


def _budget(window: str, limit: int, action: str, scope: str, alert_at: list[float]) -> Budget:
    spec = {
        "id": f"b-{window}",
        "scope": scope,
        "window": window,
        "action": action,
        "alert_at": alert_at,
        **LIMITS[limit],
    }
    return budgets_from_yaml([spec])[0]


@settings(max_examples=300, deadline=None)
@given(
    window=st.sampled_from(WINDOWS),
    limit=st.integers(0, len(LIMITS) - 1),
    action=st.sampled_from(["enforce", "warn"]),
    scope=st.sampled_from(["org", "secret", "session", "tag:team"]),
    alert_at=st.sampled_from([[], [0.5], [0.8, 1.0]]),
    scope_values=st.lists(st.text(max_size=12), max_size=3),
    as_of_us=st.integers(0, 4 * 10**15),  # 1970 .. 2096
    emitted_us=st.integers(0, 4 * 10**15),
    totals=st.tuples(st.integers(0, 2**62), st.integers(0, 2**40), st.integers(0, 2**31)),
    seq=st.integers(0, 2**62),
)
def test_verdict_bytes_equal_the_codec(
    window: str,
    limit: int,
    action: str,
    scope: str,
    alert_at: list[float],
    scope_values: list[str],
    as_of_us: int,
    emitted_us: int,
    totals: tuple[int, int, int],
    seq: int,
) -> None:
    budget = _budget(window, limit, action, scope, alert_at)
    period = period_key(budget.window, from_micros(as_of_us))
    nanos, tokens, requests = totals
    state = CounterState(
        period=period,
        seq=seq,
        periods={period: PeriodTotals(nanos, tokens, requests, as_of_us)},
    )
    emitted = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=emitted_us)
    expected = VERDICT.encode(verdict_record(budget, "k|1", tuple(scope_values), state, emitted))
    assert encode_verdict(budget, "k|1", tuple(scope_values), state, emitted_us) == expected
    # the same period twice (its end is remembered): still the same bytes
    assert encode_verdict(budget, "k|1", tuple(scope_values), state, emitted_us) == expected


def test_a_value_neither_writer_takes_raises_the_codecs_error() -> None:
    budget = _budget("month", 0, "enforce", "org", [])
    period = period_key(budget.window, datetime(2026, 11, 30, tzinfo=UTC))
    as_of = 1_795_000_000_000_000
    state = CounterState(period=period, seq=1, periods={period: PeriodTotals(2**64, 0, 0, as_of)})
    emitted = datetime(2026, 11, 30, tzinfo=UTC)
    with pytest.raises(Exception) as codec:
        VERDICT.encode(verdict_record(budget, "k", ("acme",), state, emitted))
    with pytest.raises(Exception) as hot:
        encode_verdict(budget, "k", ("acme",), state, to_micros(emitted))
    assert (type(hot.value), str(hot.value)) == (type(codec.value), str(codec.value))

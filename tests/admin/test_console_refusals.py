"""A counter's refusal in plain words (admin/console/refusals.py): why, by the refused
event's decision and the live counter; and when a counter counts as refusing now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from admin.console.refusals import REFUSING_WITHIN, Refusal, refusal_reason, refusing_now
from schemas.budgets import parse_budget
from schemas.periods import period_key
from schemas.usage import BUDGET_EXCEEDED, IN_FLIGHT_BUDGET_EXCEEDED, THROTTLED

NOW = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
BUDGET, _ = parse_budget({"id": "acme.day", "scope": "org", "window": "day", "limit_usd": "2"})


def counter(spent_nanos: int, state: str = "ok", **fields: Any) -> dict[str, Any]:
    assert BUDGET is not None
    return {
        "budget_id": "acme.day",
        "scope_values": ["acme"],
        "period": period_key(BUDGET.window, NOW),
        "state": state,
        "action": "enforce",
        "spent_nanos": spent_nanos,
        "spent_tokens": 0,
        "spent_requests": 0,
        "limit_nanos": 2_000_000_000,
        "limit_tokens": None,
        "limit_requests": None,
        **fields,
    }


def refusal(decision: str, ago: timedelta) -> Refusal:
    return Refusal(decision, NOW - ago, "sk-acme", "gpt-4o", 1)


@pytest.mark.parametrize(
    ("row", "decision", "reason"),
    [
        (counter(2_100_000_000, "exceeded"), BUDGET_EXCEEDED, "exhausted: $2.10 of $2.00 spent"),
        (
            counter(1_996_000_000),
            BUDGET_EXCEEDED,
            "a call's worst-case estimate does not fit the $0.0040 left",
        ),
        (
            counter(1_990_000_000),
            IN_FLIGHT_BUDGET_EXCEEDED,
            "calls in flight could use the $0.0100",
        ),
        (counter(10), THROTTLED, "over its rate limit"),
        (
            counter(0, "exceeded", limit_nanos=None, spent_requests=12, limit_requests=10),
            BUDGET_EXCEEDED,
            "exhausted: 12 of 10 requests spent",
        ),
    ],
)
def test_the_reason_is_the_refused_decision_read_with_the_live_counter(
    row: dict[str, Any], decision: str, reason: str
) -> None:
    assert reason in refusal_reason(row, refusal(decision, timedelta(minutes=1)))


def test_refusing_now_is_exhausted_and_enforced_or_a_recent_refusal_of_this_period() -> None:
    under = counter(1_996_000_000)
    assert refusing_now(counter(2_000_000_000, "exceeded"), None, BUDGET, NOW)
    assert not refusing_now(counter(2_000_000_000, "exceeded", action="warn"), None, BUDGET, NOW)
    assert not refusing_now(under, None, BUDGET, NOW)
    assert refusing_now(under, refusal(BUDGET_EXCEEDED, REFUSING_WITHIN), BUDGET, NOW)
    late = REFUSING_WITHIN + timedelta(seconds=1)
    assert not refusing_now(under, refusal(BUDGET_EXCEEDED, late), BUDGET, NOW)
    # refused yesterday, a minute before the day's counter began: not this period's
    yesterday = NOW.replace(hour=0, minute=0) - timedelta(minutes=1)
    at_midnight = NOW.replace(hour=0, minute=0)
    old = Refusal(BUDGET_EXCEEDED, yesterday, "sk-acme", "gpt-4o", 1)
    assert not refusing_now(under, old, BUDGET, at_midnight + timedelta(minutes=1))

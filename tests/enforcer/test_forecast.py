"""Forecasts in the enforcer (issue 23): ``usage`` (and so ``/v1/spend``) projects the
verdict's trailing-window burn onto the limits the enforcer checks, a raise included;
Verdict v1 records (no burn) still read, with no forecast."""

from __future__ import annotations

from datetime import timedelta

from schemas.codec import VERDICT
from schemas.periods import to_micros
from schemas.raises import BudgetRaise
from schemas.records import Verdict
from tests.enforcer.kit import NOW, FakeClock, budget, ctx, loaded_enforcer, raise_record, verdict
from tests.verdict_v1_kit import AS_OF, DAILY_KEY, DAILY_V1

USD = 1_000_000_000
HOUR = 3_600_000_000
DAY = budget("org-daily", window="day", limit_usd=10, limit_requests=1000)


def with_burn(record: Verdict, nanos: int, requests: int, span_us: int) -> Verdict:
    """``record`` as a v2 verdict: the trailing window's burn (its exhausts_at is the
    aggregator's; the enforcer projects on its own limits)."""
    return VERDICT.decode(
        VERDICT.encode(
            {
                **record,
                "burn_nanos": nanos,
                "burn_tokens": 0,
                "burn_requests": requests,
                "burn_span_us": span_us,
                "exhausts_at": None,
            }
        )
    )


def test_usage_projects_the_burn_on_the_limits_checked() -> None:
    at = NOW - timedelta(minutes=10)
    spent = verdict(DAY, ["acme"], spent_nanos=4 * USD, spent_requests=10, at=at)
    # $3 and 5 requests over the last 30 minutes: $6 left last an hour, 990 requests far more
    e, _ = loaded_enforcer([DAY], [with_burn(spent, 3 * USD, 5, HOUR // 2)])
    shown = e.usage(ctx())[0].to_json()
    assert shown["burn_per_hour"] == {"nanos": 6 * USD, "tokens": 0, "requests": 10}
    assert shown["exhausts_at"] == (at + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    # a raise of $6 while it lasts: the $12 left last two hours
    granted = BudgetRaise(
        raise_id="r-1",
        budget_id=DAY.budget_id,
        scope_values=(),
        mode="by",
        raise_nanos=6 * USD,
        raise_tokens=None,
        raise_requests=None,
        starts_at_us=to_micros(NOW - timedelta(hours=1)),
        until_us=to_micros(NOW + timedelta(hours=1)),
        reason="demo day",
    )
    e.state.apply_raise(granted.raise_id, raise_record(granted))
    shown = e.usage(ctx())[0].to_json()
    assert shown["exhausts_at"] == (at + timedelta(hours=2)).isoformat().replace("+00:00", "Z")


def test_no_forecast_without_burn_or_past_the_limit_or_in_another_period() -> None:
    at = NOW - timedelta(minutes=10)
    exhausted = verdict(DAY, ["acme"], spent_nanos=10 * USD, at=at)
    e, clock = loaded_enforcer([DAY], [with_burn(exhausted, USD, 1, HOUR)])
    shown = e.usage(ctx())[0].to_json()
    assert shown["state"] == "exceeded" and shown["exhausts_at"] is None
    assert shown["burn_per_hour"] == {"nanos": USD, "tokens": 0, "requests": 1}
    # the next day by the enforcer's clock: yesterday's burn says nothing of today
    clock.set(NOW + timedelta(days=1))
    shown = e.usage(ctx())[0].to_json()
    assert shown["spent_nanos"] == 0
    assert shown["burn_per_hour"] is None and shown["exhausts_at"] is None


def test_a_v1_verdict_is_read_and_shows_no_forecast() -> None:
    daily = budget("acme-daily", window="day", limit_usd=10)
    record = VERDICT.decode(DAILY_V1)
    assert record["burn_nanos"] is None and record["exhausts_at"] is None
    e, _ = loaded_enforcer([daily], [], clock=FakeClock(AS_OF + timedelta(minutes=5)))
    assert e.state.apply_verdict(DAILY_KEY, record)
    shown = e.usage(ctx())[0].to_json()
    assert shown["spent_nanos"] == 6 * USD and shown["seq"] == 3
    assert shown["burn_per_hour"] is None and shown["exhausts_at"] is None

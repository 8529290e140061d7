"""A budget on a local calendar, by the enforcer's clock (issue 23): the refusal's
Retry-After and reset_at count to local midnight across a DST change, and the counter
opens its next period at that midnight, not at UTC's."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from enforcer import Enforcer
from schemas.budgets import Budget
from schemas.periods import with_calendar
from schemas.usage import BUDGET_EXCEEDED
from tests.enforcer.kit import FakeClock, budget, ctx, loaded_enforcer, refresh, verdict

USD = 1_000_000_000


def local(b: Budget, **calendar: Any) -> Budget:
    return dataclasses.replace(b, window=with_calendar(b.window, **calendar))


NEW_YORK_DAILY = local(budget("ny-daily", window="day", limit_usd=1), timezone="America/New_York")


def exhausted_at(b: Budget, at: datetime) -> tuple[Enforcer, FakeClock]:
    e, clock = loaded_enforcer(
        [b], [verdict(b, ["acme"], spent_nanos=2 * USD, at=at)], clock=FakeClock(at)
    )
    refresh(e)
    return e, clock


def test_the_23_hour_day_resets_at_new_york_midnight() -> None:
    # 2026-03-08 00:30 EST; the clocks skip 02:00-03:00, so midnight is 22.5 hours away
    at = datetime(2026, 3, 8, 5, 30, tzinfo=UTC)
    e, clock = exhausted_at(NEW_YORK_DAILY, at)
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED
    assert d.retry_after == 22 * 3600 + 1800
    assert d.body is not None and d.body["reset_at"] == "2026-03-09T04:00:00Z"
    assert d.counters[0].period == "d:2026-03-08"
    clock.set(datetime(2026, 3, 9, 3, 59, 59, tzinfo=UTC))  # 23:59:59 EDT
    refresh(e)
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.retry_after == 1
    clock.advance(1)  # local midnight: a new day (UTC's is four hours ahead, long passed)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].period == "d:2026-03-09"
    assert d.counters[0].spent_nanos == 0


def test_the_25_hour_day_resets_an_hour_later() -> None:
    # 2026-11-01 00:30 EDT; the clocks repeat 01:00-02:00: midnight is 24.5 hours away
    e, _ = exhausted_at(NEW_YORK_DAILY, datetime(2026, 11, 1, 4, 30, tzinfo=UTC))
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.retry_after == 24 * 3600 + 1800
    assert d.body is not None and d.body["reset_at"] == "2026-11-02T05:00:00Z"


def test_a_billing_cycle_in_berlin_opens_on_the_15th_at_local_midnight() -> None:
    cycle = local(
        budget("berlin-cycle", window="month", limit_usd=1),
        timezone="Europe/Berlin",
        month_start_day=15,
    )
    e, clock = exhausted_at(cycle, datetime(2026, 3, 14, 22, 30, tzinfo=UTC))  # 23:30 CET
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.counters[0].period == "m:2026-02"
    assert (
        d.retry_after == 1800
        and d.body is not None
        and d.body["reset_at"] == "2026-03-14T23:00:00Z"
    )
    clock.advance(1800)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].period == "m:2026-03"

"""Periods by the enforcer's own clock: a verdict of another period never replaces the one
enforced (issue 17: one future-dated event lifted an exhausted budget)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.usage import BUDGET_EXCEEDED
from tests.enforcer.kit import budget, ctx, loaded_enforcer, refresh, verdict

USD = 1_000_000_000
DEC = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
MONTHLY = budget("secret-monthly", scope="secret", limit_usd=1)


def test_a_verdict_of_a_future_period_does_not_lift_an_exhausted_budget() -> None:
    # the reproduction: December spent, then one event dated 2027-03-15
    spent = verdict(MONTHLY, ["acme", "sk-1"], spent_nanos=USD, seq=10, at=DEC)
    e, clock = loaded_enforcer([MONTHLY], [spent])
    clock.set(DEC)
    refresh(e)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    future = datetime(2027, 3, 15, tzinfo=UTC)
    bogus = verdict(MONTHLY, ["acme", "sk-1"], spent_nanos=1, seq=11, at=future)
    e.state.apply_verdict(bogus["counter_key"], bogus)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    # December's later verdicts still apply (they are the period enforced)
    later = verdict(MONTHLY, ["acme", "sk-1"], spent_nanos=2 * USD, seq=12, at=DEC)
    assert e.state.apply_verdict(later["counter_key"], later)
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.counters[0].spent_nanos == 2 * USD


def test_a_current_verdict_replaces_one_held_from_the_future() -> None:
    # an enforcer that started after the bogus verdict was written holds it first
    future = datetime(2027, 3, 15, tzinfo=UTC)
    bogus = verdict(MONTHLY, ["acme", "sk-1"], spent_nanos=1, seq=11, at=future)
    e, clock = loaded_enforcer([MONTHLY], [bogus])
    clock.set(DEC)
    refresh(e)
    spent = verdict(MONTHLY, ["acme", "sk-1"], spent_nanos=USD, seq=12, at=DEC)
    assert e.state.apply_verdict(spent["counter_key"], spent)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    # the later period's verdict is kept aside, and takes over when our clock gets there
    clock.set(future)
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].period == "m:2027-03" and d.counters[0].spent_nanos == 1


def test_an_aggregator_clock_ahead_at_the_rollover_keeps_both_periods() -> None:
    daily = budget("daily", window="day", limit_usd=1)
    before_midnight = datetime(2026, 12, 10, 23, 59, 50, tzinfo=UTC)
    e, clock = loaded_enforcer([daily])
    clock.set(before_midnight)
    refresh(e)
    today = verdict(daily, ["acme"], spent_nanos=USD, seq=5, at=before_midnight)
    # an event 20 s ahead of our clock (within the aggregator's bound) opened tomorrow
    tomorrow = verdict(
        daily, ["acme"], spent_nanos=USD // 2, seq=6, at=before_midnight + timedelta(seconds=20)
    )
    for v in (today, tomorrow):
        assert e.state.apply_verdict(v["counter_key"], v)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED  # today is still enforced
    clock.advance(15)  # midnight passed on our clock: tomorrow's verdict is the one now
    refresh(e)
    d = e.check(ctx())
    assert d.allowed and d.counters[0].spent_nanos == USD // 2
    assert e.state.ahead == {}


def test_a_lagging_partition_verdict_of_yesterday_never_replaces_today() -> None:
    daily = budget("daily", window="day", limit_usd=1)
    e, clock = loaded_enforcer([daily])
    clock.set(DEC)
    refresh(e)
    today = verdict(daily, ["acme"], spent_nanos=USD, seq=7, at=DEC)
    late = verdict(daily, ["acme"], spent_nanos=10, seq=8, at=DEC - timedelta(days=1))
    assert e.state.apply_verdict(today["counter_key"], today)
    assert not e.state.apply_verdict(late["counter_key"], late)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    assert e.state.verdicts_ignored == 1

"""A temporary raise in the enforcer (issue 23): an exhausted counter is allowed while
its raise lasts and refused again at ``until``, by the enforcer's clock; the counter's
own raise, not its neighbours'; refusals and usage show base limit, raise and the limit
checked."""

from __future__ import annotations

from datetime import timedelta

from schemas.periods import to_micros
from schemas.raises import BudgetRaise
from schemas.usage import BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, budget, ctx, loaded_enforcer, raise_record, refresh, verdict

USD = 1_000_000_000
SECRET = budget("secret-monthly", scope="secret", limit_usd=10)


def a_raise(scope_values: tuple[str, ...], *, hours: int = 2, mode: str = "by") -> BudgetRaise:
    return BudgetRaise(
        raise_id=f"r-{'-'.join(scope_values) or 'all'}",
        budget_id=SECRET.budget_id,
        scope_values=scope_values,
        mode=mode,
        raise_nanos=5 * USD,
        raise_tokens=None,
        raise_requests=None,
        starts_at_us=to_micros(NOW - timedelta(minutes=1)),
        until_us=to_micros(NOW + timedelta(hours=hours)),
        reason="launch week",
    )


def test_a_raised_counter_is_allowed_until_its_raise_ends_then_refused() -> None:
    spent = [
        verdict(SECRET, ["acme", "sk-1"], spent_nanos=11 * USD),
        verdict(SECRET, ["acme", "sk-2"], spent_nanos=11 * USD),
    ]
    e, clock = loaded_enforcer([SECRET], spent)
    assert e.check(ctx()).decision == BUDGET_EXCEEDED
    r = a_raise(("acme", "sk-1"))
    e.state.apply_raise(r.raise_id, raise_record(r))
    d = e.check(ctx())
    assert d.allowed, d.body
    row = d.counters[0]
    assert (row.limit_nanos, row.granted) == (15 * USD, r)
    shown = e.usage(ctx())[0].to_json()
    assert (shown["base_limit_nanos"], shown["limit_nanos"]) == (10 * USD, 15 * USD)
    assert shown["raise"]["raise_id"] == r.raise_id and shown["raise"]["reason"] == "launch week"
    assert shown["remaining"]["nanos"] < 4 * USD  # 15 - 11 less this request's hold
    # a neighbour of the same budget is not raised
    other = e.check(ctx(secret_id="sk-2"))
    assert other.decision == BUDGET_EXCEEDED
    assert other.body is not None and "raise" not in other.body
    # the raise ends: refused again, the refusal naming the base limit
    e.release(d.hold_id)
    clock.set(NOW + timedelta(hours=2))
    refresh(e)
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.body is not None
    assert d.body["limit_nanos"] == 10 * USD


def test_a_budget_wide_raise_covers_every_counter_and_shows_in_the_refusal() -> None:
    spent = [verdict(SECRET, ["acme", "sk-1"], spent_nanos=16 * USD)]
    e, _ = loaded_enforcer([SECRET], spent)
    r = a_raise((), mode="to")  # the limit is $5 while it lasts: below the spend
    e.state.apply_raise(r.raise_id, raise_record(r))
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.body is not None
    assert (d.body["limit_nanos"], d.body["base_limit_nanos"]) == (5 * USD, 10 * USD)
    assert d.body["raise"]["mode"] == "to"
    wide = a_raise((), mode="by")
    e.state.apply_raise(r.raise_id, None)
    e.state.apply_raise(wide.raise_id, raise_record(wide))
    assert e.check(ctx(secret_id="sk-9")).allowed
    assert e.check(ctx()).decision == BUDGET_EXCEEDED  # $16 spent of $15

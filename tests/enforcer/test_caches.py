"""What check() caches between calls gives the answers it would compute afresh.

Cached: each plan's current period and its end (until the clock reaches the
end or steps back before it was computed), emptied per-counter hold totals
(reused, at most SPARE_TOTALS), the per-policy index. The fast path's counters
are held to the contract by the property test in test_check.py.
"""

from __future__ import annotations

import asyncio
import gc
from datetime import timedelta

from enforcer.holds import SPARE_TOTALS, Holds
from schemas.usage import BUDGET_EXCEEDED, JOB_BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, budget, ctx, loaded_enforcer, policy_record, refresh, verdict

USD = 1_000_000_000
MIDNIGHT = NOW.replace(hour=0) + timedelta(days=1)  # NOW is 2026-11-30 12:00Z


def test_cached_period_rolls_over_at_its_end_to_the_microsecond() -> None:
    # one budget per scope kind: org (inlined), user (inlined one value), session (general)
    per_org = budget("org-daily", window="day", limit_usd=1)
    per_user = budget("user-daily", "user", window="day", limit_usd=1)
    per_job = budget("job-daily", "session", window="day", limit_usd=1)
    spent = [
        verdict(per_org, ["acme"], spent_nanos=USD),
        verdict(per_user, ["acme", "bob"], spent_nanos=USD),
        verdict(per_job, ["acme", "bob", "run-1"], spent_nanos=USD),
    ]
    e, clock = loaded_enforcer([per_org, per_user, per_job], spent)
    request = {"user_id": "bob", "session_id": "run-1"}
    d = e.check(ctx(**request))  # computes and caches today's period for each plan
    assert not d.allowed and len(d.counters) == 3
    assert {c.state for c in d.counters} == {"exceeded"}
    clock.set(MIDNIGHT - timedelta(microseconds=1))
    refresh(e)
    d = e.check(ctx(**request))
    assert not d.allowed and {c.period for c in d.counters} == {"d:2026-11-30"}
    clock.set(MIDNIGHT)
    refresh(e)
    d = e.check(ctx(**request))
    assert d.allowed, d
    assert {c.period for c in d.counters} == {"d:2026-12-01"}
    assert all(
        c.spent_nanos == 0 and c.reset_at == MIDNIGHT + timedelta(days=1) for c in d.counters
    )
    e.release(d.hold_id)
    # the new day's verdict blocks again, through the newly cached period
    e.state.apply_verdict(
        spent[2]["counter_key"],
        verdict(per_job, ["acme", "bob", "run-1"], spent_nanos=USD, seq=2, at=MIDNIGHT),
    )
    d = e.check(ctx(**request))
    assert d.decision == JOB_BUDGET_EXCEEDED and d.refusing is not None
    assert d.refusing.period == "d:2026-12-01"


def test_a_clock_stepped_back_recomputes_the_period() -> None:
    daily = budget("daily", window="day", limit_usd=1)
    e, clock = loaded_enforcer([daily], [verdict(daily, ["acme"], spent_nanos=USD)])
    clock.set(MIDNIGHT + timedelta(hours=1))
    refresh(e)
    assert e.check(ctx()).counters[0].period == "d:2026-12-01"  # today's verdict is zero
    clock.set(NOW)  # an NTP step back: yesterday's period (and its exhaustion) again
    refresh(e)
    d = e.check(ctx())
    assert d.decision == BUDGET_EXCEEDED and d.counters[0].period == "d:2026-11-30"


def test_a_changed_window_takes_effect_at_the_next_check() -> None:
    daily = budget("b", window="day", limit_usd=1)
    e, _ = loaded_enforcer([daily], [verdict(daily, ["acme"], spent_nanos=USD)])
    assert e.check(ctx()).counters[0].period == "d:2026-11-30"
    monthly = budget("b", window="month", limit_usd=1)
    e.state.apply_policy("b", policy_record(monthly))
    d = e.check(ctx())
    # the held verdict is of a day period: for a monthly budget it is another period
    assert d.allowed and d.counters[0].period == "m:2026-11" and d.counters[0].spent_nanos == 0


def test_emptied_hold_totals_are_reused_up_to_the_bound() -> None:
    holds = Holds(timeout_us=10**9)
    counters = [(("b", "org", f"user-{i}"), "p") for i in range(SPARE_TOTALS + 50)]
    ids = [holds.reserve([cp], nanos=3, tokens=2, requests=1, now_us=0) for cp in counters]
    for hold_id in ids:
        assert holds.release(hold_id)
    assert not holds.held and len(holds) == 0
    assert len(holds._spare) == SPARE_TOTALS  # bounded: the rest were let go
    # a reused totals object starts from zero and holds only its new hold
    a, b = counters[0][0], counters[1][0]
    first = holds.reserve([(a, "p"), (b, "p")], nanos=7, tokens=5, requests=1, now_us=0)
    second = holds.reserve([(a, "p")], nanos=1, tokens=1, requests=1, now_us=0)
    totals_a, totals_b = holds.totals(a, "p"), holds.totals(b, "p")
    assert totals_a is not None and totals_b is not None
    assert (totals_a.nanos, totals_a.tokens, totals_a.requests) == (8, 6, 2)
    assert totals_a.holds == 2 and totals_b.holds == 1
    assert holds.release(first)
    assert holds.totals(b, "p") is None
    assert (totals_a.nanos, totals_a.holds) == (1, 1)
    # two were taken from the spares, b's came back, a's is still in use
    assert len(holds._spare) == SPARE_TOTALS - 1
    assert holds.release(second) and holds.totals(a, "p") is None
    assert len(holds._spare) == SPARE_TOTALS


def test_a_counter_named_twice_is_held_once() -> None:
    holds = Holds(timeout_us=10**9)
    cid = ("b", "acme")
    hold_id = holds.reserve([(cid, "p"), (cid, "p")], nanos=10, tokens=4, requests=1, now_us=0)
    totals = holds.totals(cid, "p")
    assert totals is not None and (totals.nanos, totals.tokens, totals.requests) == (10, 4, 1)
    assert holds.settle(hold_id, nanos=3, tokens=2, requests=1, occurred_us=5, now_us=6)
    assert (totals.nanos, totals.tokens) == (3, 2)
    assert holds.on_verdict(cid, "p", as_of_us=5, seq=1) == 1
    assert not holds.held and len(holds) == 0


def test_hostile_session_and_user_ids_cannot_reach_another_counter() -> None:
    per_job = budget("job", "session", limit_usd=1)
    per_user = budget("per-user", "user", limit_usd=1)
    victims = [
        verdict(per_job, ["a", "b", "c"], spent_nanos=USD),  # org a, user b, session c
        verdict(per_user, ["a", "b"], spent_nanos=USD),
    ]
    e, _ = loaded_enforcer([per_job, per_user], victims)
    keys = {v["counter_key"] for v in victims}
    d = e.check(ctx(org_id="a", user_id="b", session_id="c"))
    assert not d.allowed and {c.counter for c in d.counters} == keys
    for org, user, session in [
        ("a", "b,1:c", "x"),
        ("a,1:b", "c", "x"),
        ("a", "b,", "c"),
        ("a", "1:b,1:c,", "x"),
        ("a", "b|c", "x"),
        ("1:a,1:b", "c", "x"),
    ]:
        d = e.check(ctx(org_id=org, user_id=user, session_id=session))
        assert d.allowed, (org, user, session)
        assert not keys & {c.counter for c in d.counters}
        e.release(d.hold_id)


async def test_the_served_state_is_frozen_out_of_the_collector_once_ready() -> None:
    from enforcer.sidecar import _freeze_when_ready

    e, _ = loaded_enforcer([budget("b", limit_usd=1)])
    e.state.ready = False
    task = asyncio.create_task(_freeze_when_ready(e, poll_s=0.01))
    await asyncio.sleep(0.05)
    assert not task.done()  # not before the state is loaded
    e.state.ready = True
    try:
        await asyncio.wait_for(task, 5)
        assert gc.get_freeze_count() > 0
        assert e.check(ctx()).allowed  # frozen state still answers
    finally:
        gc.unfreeze()

"""Reserve-and-settle, in memory: estimates held, settled to the actual cost, dropped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from enforcer.holds import CounterPeriod, Holds
from schemas.usage import ALLOWED, IN_FLIGHT_BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, budget, ctx, loaded_enforcer, refresh, verdict

USD = 1_000_000_000
#: worst case of ctx(): 1000 input x $3/M + 1000 output x $15/M
ESTIMATE = 18_000_000


def usage(**tokens: Any) -> dict[str, Any]:
    event = {"model": "claude-sonnet-4-5", "occurred_at": NOW, "input_tokens": 0}
    event.update(tokens)
    return event


def test_a_burst_of_20_that_each_fit_alone_is_stopped() -> None:
    b = budget("org", limit_nanos=100_000_000)  # $0.10: room for five $0.018 estimates
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], spent_nanos=0)])
    assert all(e.peek(ctx()).allowed for _ in range(20))  # each fits alone
    decisions = [e.check(ctx()) for _ in range(20)]
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == 5  # 5 x 18M = 90M <= 100M; a sixth would pass the limit
    refused = [d for d in decisions if not d.allowed]
    assert {d.decision for d in refused} == {IN_FLIGHT_BUDGET_EXCEEDED}
    assert refused[0].status == 402 and refused[0].retry_after == 5
    assert refused[0].body is not None and refused[0].body["held_nanos"] == 5 * ESTIMATE
    held = e.holds.totals(("org", "acme"), "m:2026-11")
    assert held is not None and held.nanos == 5 * ESTIMATE


def test_settle_then_a_covering_verdict_drops_the_hold() -> None:
    b = budget("org", limit_usd=1)
    e, _clock = loaded_enforcer([b], [verdict(b, ["acme"], seq=1)])
    key = verdict(b, ["acme"])["counter_key"]
    d = e.check(ctx())
    cid = ("org", "acme")  # the counter id: decompose(counter key)
    assert e.holds.totals(cid, "m:2026-11").nanos == ESTIMATE  # type: ignore[union-attr]  # held: not None
    occurred = NOW + timedelta(seconds=1)
    assert e.settle(d.hold_id, usage(input_tokens=100, output_tokens=10, occurred_at=occurred))
    actual = 100 * 3_000 + 10 * 15_000
    assert e.holds.totals(cid, "m:2026-11").nanos == actual  # type: ignore[union-attr]  # held: not None
    assert not e.settle(d.hold_id, usage())  # settles once
    # a verdict whose as_of is before the event does not cover it
    e.state.apply_verdict(key, verdict(b, ["acme"], seq=2, at=NOW))
    assert len(e.holds) == 1
    # one that reaches the event's time does
    e.state.apply_verdict(key, verdict(b, ["acme"], seq=3, at=occurred, spent_nanos=actual))
    assert len(e.holds) == 0 and (cid, "m:2026-11") not in e.holds.held
    assert e.usage(ctx())[0].spent_nanos == actual


def test_a_verdict_already_held_at_settle_time_does_not_cover_the_event() -> None:
    b = budget("org", limit_usd=1)
    late = NOW + timedelta(minutes=5)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"], seq=7, at=late)])  # as_of already past
    key = verdict(b, ["acme"])["counter_key"]
    d = e.check(ctx())
    e.settle(d.hold_id, usage(output_tokens=10))
    e.state.apply_verdict(key, verdict(b, ["acme"], seq=7, at=late))  # re-delivery: same seq
    assert len(e.holds) == 1
    e.state.apply_verdict(key, verdict(b, ["acme"], seq=8, at=late))
    assert len(e.holds) == 0


def test_unsettled_holds_survive_verdicts_and_expire() -> None:
    b = budget("org", limit_usd=1)
    e, clock = loaded_enforcer([b], [verdict(b, ["acme"])], hold_timeout_s=60)
    key = verdict(b, ["acme"])["counter_key"]
    e.check(ctx())
    e.state.apply_verdict(key, verdict(b, ["acme"], seq=5, at=NOW + timedelta(hours=1)))
    assert len(e.holds) == 1  # still in flight: no verdict can cover it
    clock.advance(59)
    assert e.holds.expire(int(clock() * 1e6)) == 0
    clock.advance(1)
    assert e.holds.expire(int(clock() * 1e6)) == 1 and len(e.holds) == 0
    assert e.holds.dropped_by_timeout == 1


def test_release_drops_the_hold() -> None:
    b = budget("org", limit_nanos=ESTIMATE)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])])
    first = e.check(ctx())
    assert first.allowed and not e.check(ctx()).allowed
    assert e.release(first.hold_id) and not e.release(first.hold_id)
    assert e.check(ctx()).allowed


def test_token_budgets_hold_input_plus_max_output_or_the_cap() -> None:
    b = budget("tokens", limit_tokens=10_000)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])], default_max_output_tokens=4000)
    d = e.check(ctx(input_tokens=None, request_bytes=3000, max_output_tokens=None))
    assert d.allowed and d.hold_id is not None
    hold = e.holds.get(d.hold_id)
    assert hold is not None and hold.tokens == 1000 + 4000
    d2 = e.check(ctx(input_tokens=0, max_output_tokens=4999))
    assert d2.allowed  # 5000 + 4999 <= 10000
    assert e.check(ctx(input_tokens=0, max_output_tokens=1)).allowed  # reaches it exactly
    assert e.check(ctx(input_tokens=0, max_output_tokens=1)).decision == IN_FLIGHT_BUDGET_EXCEEDED


def test_warn_budgets_hold_nothing() -> None:
    b = budget("soft", action="warn", limit_nanos=1)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme"])])
    d = e.check(ctx())
    assert d.decision == ALLOWED and d.hold_id is None and len(e.holds) == 0


def test_holds_of_the_old_period_do_not_count_after_rollover() -> None:
    b = budget("daily", window="day", limit_nanos=ESTIMATE)
    e, clock = loaded_enforcer([b], [verdict(b, ["acme"])])
    assert e.check(ctx()).allowed and not e.check(ctx()).allowed
    clock.advance(12 * 3600)
    refresh(e)
    assert e.check(ctx()).allowed


def test_holds_track_each_counter_separately() -> None:
    holds = Holds(timeout_us=10**9)
    a, b = ("budget", "a"), ("budget", "b")
    h = holds.reserve([(a, "p"), (b, "p")], nanos=10, tokens=5, requests=1, now_us=0)
    holds.settle(h, nanos=7, tokens=3, requests=1, occurred_us=100, now_us=1)
    assert holds.on_verdict(a, "p", 100, 1) == 1
    assert (a, "p") not in holds.held and holds.totals(b, "p").nanos == 7  # type: ignore[union-attr]  # held: not None
    assert len(holds) == 1 and holds.held_nanos == 7
    assert holds.on_verdict(b, "other-period", 100, 1) == 0
    assert holds.on_verdict(b, "p", 99, 2) == 0
    assert holds.on_verdict(b, "p", 100, 2) == 1 and len(holds) == 0 and not holds.held


@pytest.mark.parametrize("step_back", [0, 15], ids=["clock-forward", "clock-steps-back"])
def test_holds_agree_with_a_plain_model_under_a_random_workload(step_back: int) -> None:
    """Reserve, settle, release, verdicts and timeouts in random order: every
    (counter, period) total is the sum of the holds a plain list says still hold it;
    each sweep drops exactly the holds past their deadline, also when the clock steps
    back (the sweep stops at the first live hold only while deadlines are in order)."""
    import random

    rng = random.Random(5 + step_back)
    cps: list[CounterPeriod] = [
        ((f"b{b}", "org", f"u{u}"), p) for b in range(3) for u in range(3) for p in ("p", "q")
    ]
    holds = Holds(timeout_us=1_000)
    # hold id -> [nanos, tokens, requests, expires, counters, occurred or None, seqs]
    model: dict[int, list[Any]] = {}
    now = 0
    for _ in range(4000):
        now = max(0, now + rng.randrange(-step_back, 20))
        op = rng.random()
        if op < 0.4 or not model:
            named = [rng.choice(cps) for _ in range(rng.randrange(1, 5))]  # may repeat
            n, t = rng.randrange(1, 100), rng.randrange(1, 50)
            hold_id = holds.reserve(named, nanos=n, tokens=t, requests=1, now_us=now)
            model[hold_id] = [n, t, 1, now + 1_000, list(dict.fromkeys(named)), None, {}]
        elif op < 0.6:
            hold_id = rng.choice(list(model))
            entry = model[hold_id]
            seqs = {cp: rng.randrange(3) for cp in entry[4] if rng.random() < 0.7}
            n, t, r = rng.randrange(0, 100), rng.randrange(0, 50), rng.randrange(2)
            ok = holds.settle(
                hold_id, nanos=n, tokens=t, requests=r, occurred_us=now, now_us=now, seqs=seqs
            )
            assert ok == (entry[5] is None)
            if ok:
                model[hold_id] = [n, t, r, now + 1_000, entry[4], now, seqs]
        elif op < 0.75:
            hold_id = rng.choice(list(model))
            assert holds.release(hold_id)
            del model[hold_id]
            assert not holds.release(hold_id)
        elif op < 0.95:
            (counter, period), as_of, seq = (
                rng.choice(cps),
                now - rng.randrange(50),
                rng.randrange(4),
            )
            expected = 0
            for hold_id, entry in list(model.items()):
                cp = (counter, period)
                covered = entry[5] is not None and entry[5] <= as_of
                if cp in entry[4] and covered and seq > entry[6].get(cp, -1):
                    entry[4].remove(cp)
                    expected += 1
                    if not entry[4]:
                        del model[hold_id]
            assert holds.on_verdict(counter, period, as_of, seq) == expected
        else:
            gone = [h for h, entry in model.items() if entry[3] <= now]
            assert holds.expire(now) == len(gone)
            for hold_id in gone:
                del model[hold_id]
        assert len(holds) == len(model)
        for cp in cps:
            mine = [e for e in model.values() if cp in e[4]]
            totals = holds.totals(*cp)
            if not mine:
                assert totals is None
                continue
            assert totals is not None
            got = (totals.nanos, totals.tokens, totals.requests, totals.holds)
            assert got == (
                sum(e[0] for e in mine),
                sum(e[1] for e in mine),
                sum(e[2] for e in mine),
                len(mine),
            )
    assert holds.held_nanos == sum(e[0] for e in model.values())

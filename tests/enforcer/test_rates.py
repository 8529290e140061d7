"""Rate limits (a budget's ``rate:``): token buckets per counter, each replica its share;
refused ``throttled`` with 429 and Retry-After; accuracy per window, on one enforcer and
across three that count themselves on the broker."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaProducer

from enforcer import Enforcer, EnforcerConfig
from enforcer.rates import BURST_FRACTION, MIN_REQUESTS_BURST
from schemas.budgets import Budget, RateLimit
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, VERDICT
from schemas.periods import parse_window
from schemas.topics import Topics
from tests.enforcer.kit import NOW, PRICES, FakeClock, ctx, loaded_enforcer, verdict


def rated(rate: RateLimit, *, limit_requests: int | None = None, scope: str = "secret") -> Budget:
    return Budget(
        budget_id="rated",
        scope=scope,
        window=parse_window("day"),
        limit_requests=limit_requests,
        rate=rate,
    )


def admitted_per_window(checks: list[tuple[float, bool]], start: float, window: float) -> list[int]:
    """Admitted checks per whole window of ``window`` seconds from ``start``."""
    per: Counter[int] = Counter()
    last = max(t for t, _ in checks)
    for t, ok in checks:
        if ok:
            per[int((t - start) // window)] += 1
    return [per[i] for i in range(int((last - start) // window))]


def tolerance(limit: int, replicas: int) -> int:
    """How far a window's admitted count may be from the limit: each replica's bucket
    holds at most max(2, limit / replicas x BURST_FRACTION) requests, which a window may
    find full (more) or leave full (fewer) (enforcer/README.md: accuracy)."""
    return math.ceil(replicas * max(MIN_REQUESTS_BURST, limit / replicas * BURST_FRACTION))


def test_requests_per_second_admits_the_limit_in_every_window() -> None:
    b = rated(RateLimit(requests_per_second=20))
    e, clock = loaded_enforcer([b], [])
    checks: list[tuple[float, bool]] = []
    start = clock()
    for _ in range(10_000):  # one attempt each ms for 10 s
        d = e.check(ctx())
        checks.append((clock(), d.allowed))
        if d.allowed:
            e.settle(d.hold_id, {"model": "claude-sonnet-4-5", "occurred_at": clock.now})
        clock.advance(0.001)
    windows = admitted_per_window(checks, start, 1.0)
    assert len(windows) == 9
    assert all(abs(n - 20) <= tolerance(20, 1) for n in windows), windows
    assert len(e.holds) == 0  # holds made for the rate only are gone once settled


def test_throttled_answer_default_and_native() -> None:
    b = rated(RateLimit(requests_per_minute=60))  # one a second, a bucket of 2
    e, clock = loaded_enforcer([b], [])
    assert e.check(ctx()).allowed and e.check(ctx()).allowed
    d = e.check(ctx())
    assert d.decision == "throttled" and d.outcome == "refused" and d.status == 429
    assert d.retry_after == 1
    assert ("x-should-retry", "true") in d.headers and ("retry-after-ms", "1000") in d.headers
    assert d.body == {
        "error": "throttled",
        "budget_id": "rated",
        "counter": d.refusing.counter if d.refusing else None,
        "limit": {"unit": "requests", "count": 60, "per": "minute"},
        "replicas": 1,
        "retry_after_ms": 1000,
        "message": "Budget 'rated': rate limit of 60 requests per minute reached; retry in 1000 ms.",
    }
    assert [c.state for c in d.counters] == ["throttled"]
    assert not d.over_budget and d.exceeded_budgets == ()  # a rate is not a spent budget
    event = d.refusal_event()
    assert event is not None and event["decision"] == "throttled"
    assert event["outcome"] == "refused" and event["decision_budget_id"] == "rated"
    assert e.peek(ctx()).decision == "throttled"  # a peek sees it too, and takes nothing
    clock.advance(0.5)
    assert e.check(ctx()).retry_after == 1 and e.check(ctx()).body["retry_after_ms"] == 500  # type: ignore[index]  # a refusal has a body
    clock.advance(0.5)
    assert e.check(ctx()).allowed
    native, _ = loaded_enforcer([b], [], refusal_style="native")
    native.check(ctx(provider="openai"))
    native.check(ctx(provider="openai"))
    body = native.check(ctx(provider="openai")).body
    assert body is not None and body["error"]["code"] == "rate_limit_exceeded"
    assert body["error"]["type"] == "requests"
    metrics = e.metrics.render().decode()
    assert 'spendbus_enforcer_checks_total{budget="rated",outcome="throttled"}' in metrics
    assert 'spendbus_enforcer_decisions_total{decision="throttled"}' in metrics


def test_a_budget_refusal_takes_nothing_from_the_rate() -> None:
    b = rated(RateLimit(requests_per_minute=60), limit_requests=5)
    e, _ = loaded_enforcer([b], [verdict(b, ["acme", "sk-1"], spent_requests=5)])
    for _ in range(3):
        assert e.check(ctx()).decision == "budget_exceeded"
    assert not e.checker.rate_limits.buckets  # never looked at: the budget refused first


def test_tokens_per_minute_take_the_worst_case_and_settle_gives_back_the_rest() -> None:
    b = rated(RateLimit(tokens_per_minute=60_000))  # 1000 tokens a second
    e, clock = loaded_enforcer([b], [])
    d = e.check(ctx(input_tokens=1000, max_output_tokens=4000))  # worst case 5000
    assert d.allowed
    assert e.check(ctx()).decision == "throttled"  # in debt: 1000 - 5000
    used = {"model": "claude-sonnet-4-5", "occurred_at": clock.now, "input_tokens": 1000}
    assert e.settle(d.hold_id, {**used, "output_tokens": 200})  # 1200 used: 3800 back
    assert e.check(ctx(input_tokens=10, max_output_tokens=10)).decision == "throttled"  # -200
    clock.advance(0.3)  # +300: 100 left
    assert e.check(ctx(input_tokens=100, max_output_tokens=100)).allowed  # -100
    assert e.check(ctx(input_tokens=10, max_output_tokens=10)).decision == "throttled"
    # a request that never went out gives everything back, the request too
    clock.advance(10)
    d = e.check(ctx(input_tokens=900, max_output_tokens=100))
    assert d.allowed and e.release(d.hold_id)
    assert e.check(ctx(input_tokens=900, max_output_tokens=100)).allowed


def test_each_counter_has_its_own_bucket_and_warn_budgets_do_not_throttle() -> None:
    b = rated(RateLimit(requests_per_minute=60))
    warn = Budget(
        budget_id="soft",
        scope="org",
        window=parse_window("day"),
        action="warn",
        limit_requests=10**6,
        rate=RateLimit(requests_per_second=1),
    )
    e, _ = loaded_enforcer([b, warn], [])
    for secret in ("a", "a", "b", "b"):  # two each: their buckets of 2, the org's warn rate
        assert e.check(ctx(secret_id=secret)).allowed
    assert e.check(ctx(secret_id="a")).decision == "throttled"


# --- across three replicas, counted on the broker -------------------------------------------------
async def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_rate_limit_accuracy_across_three_replicas_that_count_themselves(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """Three enforcers learn they are three from their group; each takes a third of a
    30 requests/s limit; attempts every ms on each (a clock of their own), round robin:
    every whole second admits the limit, within the stated tolerance."""
    limit = 30
    b = rated(RateLimit(requests_per_second=limit), scope="org")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            topics.budget_policies, BUDGET_POLICY.encode(b.to_record(NOW)), key=b"rated"
        )
        await producer.send_and_wait(
            topics.pricing, PRICE_TABLE.encode(PRICES.to_record()), key=PRICES.version.encode()
        )
        v = verdict(b, ["acme"])
        await producer.send_and_wait(
            topics.budget_verdicts, VERDICT.encode(v), key=v["counter_key"].encode()
        )
    finally:
        await producer.stop()
    clock = FakeClock()
    members: list[Enforcer] = []
    try:
        for n in range(3):
            e = Enforcer(
                EnforcerConfig(
                    bootstrap=kafka_bootstrap,
                    topic_prefix=topics.prefix,
                    client_id=f"rated-{n}",
                    membership=True,
                    max_replicas=6,
                    membership_grace_s=1.0,
                ),
                clock=clock,
            )
            await e.start()
            members.append(e)
        for e in members:
            await e.wait_ready(60)
        await eventually(lambda: all(m.membership and m.membership.count == 3 for m in members))
        clock.advance(1.01)  # the newcomers' grace
        await eventually(lambda: all(m.checker.replicas == 3 for m in members), 10)
        for e in members:  # the verdict stream confirmed as of the test's clock
            e.state.fresh_at_us = int(clock() * 1_000_000)
        checks: list[tuple[float, bool]] = []
        start = clock()
        per_member: Counter[int] = Counter()
        for step in range(6_000):  # 6 s, one attempt per member per ms
            for i, e in enumerate(members):
                d = e.check(ctx(org_id="acme", secret_id=f"sk-{step % 7}"))
                checks.append((clock(), d.allowed))
                if d.allowed:  # held: the request stays in flight
                    per_member[i] += 1
            clock.advance(0.001)
        windows = admitted_per_window(checks, start, 1.0)
        assert len(windows) == 5
        assert all(abs(n - limit) <= tolerance(limit, 3) for n in windows), windows
        # each replica admitted its third
        assert all(abs(n - 6 * limit / 3) <= 2 for n in per_member.values()), per_member
    finally:
        for e in members:
            await e.stop()


@pytest.mark.parametrize("unit", ["requests", "tokens"])
def test_per_minute_windows_across_three_replicas_with_settles(unit: str) -> None:
    """600 requests (or 120,000 tokens) a minute over three enforcers told they are three;
    calls settle 0.2 s after admission using a third to all of their worst case: every
    whole minute of 6 admits the limit within the stated tolerance."""
    import random

    rate = (
        RateLimit(requests_per_minute=600)
        if unit == "requests"
        else RateLimit(tokens_per_minute=120_000)
    )
    b = rated(rate, scope="org")
    clock = FakeClock()
    fleet = [loaded_enforcer([b], [], clock=clock, replicas=3)[0] for _ in range(3)]
    rng = random.Random(5)
    admitted: list[tuple[float, int]] = []
    pending: list[tuple[float, Enforcer, int, int]] = []
    start = clock()
    for _ in range(36_000):  # 6 minutes, one attempt per replica each 10 ms
        now = clock()
        for done in [p for p in pending if now - p[0] >= 0.2]:
            pending.remove(done)
            used = {"model": "claude-sonnet-4-5", "occurred_at": clock.now}
            done[1].settle(done[2], {**used, "input_tokens": done[3]})
        for e in fleet:
            e.state.fresh_at_us = int(now * 1_000_000)
            d = e.check(ctx(org_id="acme", input_tokens=100, max_output_tokens=200))
            if d.allowed and d.hold_id is not None:
                billed = rng.randrange(100, 301)
                admitted.append((now, 1 if unit == "requests" else billed))
                pending.append((now, e, d.hold_id, billed))
        clock.advance(0.01)
    per: Counter[int] = Counter()
    for t, amount in admitted:
        per[int((t - start) // 60)] += amount
    windows = [per[i] for i in range(6)]
    if unit == "requests":
        stated = tolerance(600, 3)
        assert all(abs(n - 600) <= stated for n in windows), (windows, stated)
    else:  # a bucket of max(1/60 of the share, a worst case) and one worst case of debt
        worst = 300
        stated = math.ceil(3 * (max(120_000 / 3 * BURST_FRACTION, worst) + worst))
        assert all(abs(n - 120_000) <= stated for n in windows), (windows, stated)

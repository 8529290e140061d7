"""Replicas from membership: enforcers count themselves through a consumer group of their own
on the real broker (join, leave, kill -9), and the effective count errs toward less
headroom while it changes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from enforcer import Enforcer, EnforcerConfig
from enforcer.membership import Membership, group_id
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, VERDICT
from schemas.topics import Topics
from tests.enforcer.kit import NOW, PRICES, FakeClock, budget, ctx, verdict

USD = 1_000_000_000
ORG = budget("org", limit_usd=1)  # $3/$15 per Mtok: each check's estimate is $0.018


# --- the rules, on a clock of our own ---------------------------------------------------------
def membership(**values: Any) -> tuple[Membership, FakeClock, list[int]]:
    clock = FakeClock()
    published: list[int] = []
    config = EnforcerConfig(membership=True, **values)
    return Membership(config, clock, published.append), clock, published


def test_a_replica_assumes_max_replicas_until_it_knows_and_while_new() -> None:
    m, clock, _ = membership(max_replicas=10, membership_grace_s=5)
    assert m.replicas == 10 and m.effective(clock()) == 10  # no count yet
    m._on_count(3)
    assert m.effective(clock()) == 10  # newly joined: its peers may hold larger shares
    clock.advance(5.1)
    assert m.effective(clock()) == 3


def test_after_a_change_the_largest_recent_count_is_kept_for_the_grace() -> None:
    m, clock, published = membership(max_replicas=4, membership_grace_s=5)
    m._on_count(2)
    clock.advance(6)
    m._publish(clock())
    assert published[-1] == 2
    m._on_count(6)  # scale-up: the new count is larger, used at once
    assert published[-1] == 6
    clock.advance(1)
    m._on_count(3)  # scale-down: 6 stays for the grace (the leavers' requests finish)
    assert published[-1] == 6
    clock.advance(4.5)
    m._publish(clock())
    assert published[-1] == 6  # 6 was the count in force when the 5 s window opened
    clock.advance(1)
    m._publish(clock())
    assert published[-1] == 3
    assert len(m.changes) <= 2  # pruned past the window


def test_replicas_is_a_floor_under_the_count() -> None:
    m, clock, _ = membership(replicas=5, max_replicas=8, membership_grace_s=0)
    m._on_count(2)
    assert m.effective(clock()) == 5


def test_membership_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        EnforcerConfig(membership=True, max_replicas=0)
    with pytest.raises(ValueError):
        EnforcerConfig(membership=True, membership_session_timeout_s=0)


# --- on the broker ------------------------------------------------------------------------------
async def seed(bootstrap: str, topics: Topics, spent_nanos: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        v = verdict(ORG, ["acme"], spent_nanos=spent_nanos, at=NOW)
        for topic, key, value in (
            (topics.budget_policies, ORG.budget_id, BUDGET_POLICY.encode(ORG.to_record(NOW))),
            (topics.pricing, PRICES.version, PRICE_TABLE.encode(PRICES.to_record())),
            (topics.budget_verdicts, v["counter_key"], VERDICT.encode(v)),
        ):
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


def member_config(bootstrap: str, topics: Topics, n: int) -> EnforcerConfig:
    return EnforcerConfig(
        bootstrap=bootstrap,
        topic_prefix=topics.prefix,
        client_id=f"member-{n}",
        membership=True,
        max_replicas=8,
        membership_grace_s=1.0,
        membership_session_timeout_s=6.0,
    )


async def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def start_member(bootstrap: str, topics: Topics, n: int, clock: FakeClock) -> Enforcer:
    """A member on ``clock`` (every member shares one: grace periods end when the test
    says, rebalances happen when the broker does them)."""
    e = Enforcer(member_config(bootstrap, topics, n), clock=clock)
    await e.start()
    await e.wait_ready(60)
    return e


def counts(members: list[Enforcer]) -> list[int | None]:
    return [m.membership.count if m.membership else None for m in members]


async def after_grace(clock: FakeClock, members: list[Enforcer]) -> None:
    """Let the grace of every member end (and each publish its count)."""
    clock.advance(members[0].config.membership_grace_s + 0.01)
    await asyncio.sleep(0.6)  # two ticks of each member's loop


@pytest.mark.integration
async def test_members_count_each_other_as_they_join_and_leave(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """Join: every member learns the new count; a newcomer assumes max_replicas for its
    grace; leave: the others learn at once and keep the larger count for the grace."""
    await seed(kafka_bootstrap, topics)
    assert group_id(topics) == f"{topics.prefix}spendbus-enforcers"
    clock = FakeClock()
    members = [await start_member(kafka_bootstrap, topics, 0, clock)]
    try:
        assert counts(members) == [1] and members[0].checker.replicas == 8  # new: max
        for n in (1, 2):
            members.append(await start_member(kafka_bootstrap, topics, n, clock))
        await eventually(lambda: counts(members) == [3, 3, 3])
        assert all(m.checker.replicas == 8 for m in members)  # all joined within the grace
        # `spendbus status` shows the group: its members are the replicas counted, no lag
        from spendbus.commands.status_kafka import kafka_report

        report = await kafka_report(kafka_bootstrap, topics, 30)
        [group] = [g for g in report["consumer_groups"] if g["group"] == group_id(topics)]
        assert group["members"] == 3 and group["lag"] == 0 and group["counts_enforcers"]
        await after_grace(clock, members)
        assert [m.checker.replicas for m in members] == [3, 3, 3]
        left = members.pop()
        await left.stop()  # a clean leave: LeaveGroup, the others rebalance at once
        await eventually(lambda: counts(members) == [2, 2], 15)
        await asyncio.sleep(0.6)
        assert [m.checker.replicas for m in members] == [3, 3]  # the grace keeps 3 a while
        await after_grace(clock, members)
        assert [m.checker.replicas for m in members] == [2, 2]
        # the share follows: 2 x (held + 0.018) <= $1 admits 27 holds on one member
        admitted = 0
        while members[0].check(ctx()).allowed:
            admitted += 1
        assert admitted == 27
        metrics = members[0].metrics.render().decode()
        assert "spendbus_enforcer_replicas 2.0" in metrics
        assert "spendbus_enforcer_group_members 2.0" in metrics
    finally:
        for m in members:
            await m.stop()


@pytest.mark.integration
async def test_a_killed_member_is_dropped_after_its_session_times_out(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """kill -9 of a replica (a sidecar process): it cannot leave; the broker drops it when
    its session times out, and the survivor's share widens after the grace."""
    await seed(kafka_bootstrap, topics)
    clock = FakeClock()
    survivor = await start_member(kafka_bootstrap, topics, 0, clock)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),  # where serve makes its token file
    }
    code = (
        "from spendbus.commands.enforcer import enforcer; enforcer(['serve', '--port', '0', "
        "'--membership', '--max-replicas', '8', '--membership-grace', '1'])"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stderr=asyncio.subprocess.PIPE
    )
    membership = survivor.membership
    assert membership is not None
    try:
        assert proc.stderr is not None
        while True:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "serve exited before listening"
            if line.startswith(b'{"listening"'):
                json.loads(line)
                break
        await eventually(lambda: membership.count == 2)
        await after_grace(clock, [survivor])
        assert survivor.checker.replicas == 2
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        rebalances = membership.rebalances
        await asyncio.sleep(1.5)
        assert membership.count == 2  # nothing told the group the member was gone yet
        await eventually(lambda: membership.count == 1, 30)
        assert membership.rebalances == rebalances + 1
        await asyncio.sleep(0.6)
        assert survivor.checker.replicas == 2  # the grace
        await after_grace(clock, [survivor])
        assert survivor.checker.replicas == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await survivor.stop()


@pytest.mark.integration
async def test_shares_stay_within_the_headroom_while_members_join_and_leave_under_traffic(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """Traffic on every live member while one joins and two leave. A request lasts 6 steps
    of 0.05 s (less than the 1 s grace), then its worst case is charged to the verdict
    (as the aggregator would, the worst case: actual = estimate), and a member that left
    still finishes what it admitted. At every step spend + every hold stays within the
    limit, but for each newcomer's bounded allowance (1/max_replicas of the headroom)."""
    spent = 820_000_000  # $0.18 left: 10 estimates for one enforcer alone
    await seed(kafka_bootstrap, topics, spent_nanos=spent)
    clock = FakeClock()
    key = verdict(ORG, ["acme"])["counter_key"]
    members = [await start_member(kafka_bootstrap, topics, n, clock) for n in range(2)]
    everyone = list(members)
    await eventually(lambda: counts(members) == [2, 2])
    await after_grace(clock, members)
    in_flight: list[tuple[float, Enforcer, int, int]] = []  # (admitted at, member, hold, nanos)
    seq = 1
    joined = 0
    worst = 0
    admitted = 0

    async def steps(n: int) -> None:
        nonlocal spent, seq, worst, admitted
        for _ in range(n):
            clock.advance(0.05)
            done = [f for f in in_flight if clock() - f[0] >= 0.3 - 1e-9]
            for f in done:
                in_flight.remove(f)
                f[1].release(f[2])
                spent += f[3]
            if done:
                seq += 1
                v = verdict(ORG, ["acme"], spent_nanos=spent, seq=seq, at=NOW)
                for m in everyone:
                    m.state.apply_verdict(key, v)
            for m in members:
                d = m.check(ctx())
                if d.allowed and d.hold_id is not None:
                    hold = m.holds.get(d.hold_id)
                    assert hold is not None
                    in_flight.append((clock(), m, d.hold_id, hold.nanos))
                    admitted += 1
            held = sum(f[3] for f in in_flight)
            allowance = joined * (USD - 820_000_000) // members[0].config.max_replicas
            worst = max(worst, spent + held)
            assert spent + held <= USD + allowance, (spent, held, allowance)
            await asyncio.sleep(0.01)

    try:
        await steps(20)
        everyone.append(await start_member(kafka_bootstrap, topics, 2, clock))
        members.append(everyone[-1])
        joined = 1
        await steps(10)
        await eventually(lambda: counts(members) == [3, 3, 3])
        await steps(40)
        for _ in range(2):
            gone = members.pop(0)
            await gone.stop()  # it leaves; what it admitted still finishes and is charged
            await eventually(
                lambda: len(set(counts(members))) == 1 and counts(members)[0] == len(members)
            )
            await steps(40)
        assert admitted > 10 and worst > USD - 60_000_000  # the traffic did fill the shares
    finally:
        for m in members:
            await m.stop()


@pytest.mark.integration
async def test_a_member_killed_under_traffic_takes_its_share_with_it(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Two replicas fill their halves of a $0.18 headroom (5 holds of $0.018 each), one a
    sidecar process admitting over HTTP; it is killed -9 with its requests (they die with
    it: never charged). The survivor refuses past its half until the group drops the dead
    member and the grace is over, then takes the whole headroom: never more than it."""
    from datetime import UTC, datetime

    import aiohttp

    clock = FakeClock(datetime.now(UTC))  # the sidecar's clock is the wall clock
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        v = verdict(ORG, ["acme"], spent_nanos=820_000_000, at=clock.now)
        for topic, key, value in (
            (topics.budget_policies, ORG.budget_id, BUDGET_POLICY.encode(ORG.to_record(NOW))),
            (topics.pricing, PRICES.version, PRICE_TABLE.encode(PRICES.to_record())),
            (topics.budget_verdicts, v["counter_key"], VERDICT.encode(v)),
        ):
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()
    survivor = await start_member(kafka_bootstrap, topics, 0, clock)
    membership = survivor.membership
    assert membership is not None
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),  # where serve makes its token file
    }
    code = (
        "from spendbus.commands.enforcer import enforcer; enforcer(['serve', '--port', '0', "
        "'--membership', '--max-replicas', '8', '--membership-grace', '1', "
        "'--no-publish-refusals'])"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stderr=asyncio.subprocess.PIPE
    )
    request = {
        "org_id": "acme",
        "secret_id": "sk-1",
        "provider": "anthropic",
        "model": "claude-sonnet-4-5",
        "input_tokens": 1000,
        "max_output_tokens": 1000,
    }
    try:
        assert proc.stderr is not None
        while True:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "serve exited before listening"
            if line.startswith(b'{"listening"'):
                url = json.loads(line)["listening"]
                # the token serve made on first start, read as a client reads it
                token = Path(json.loads(line)["token_file"]).read_text().strip()
                break
        await eventually(lambda: membership.count == 2)
        await after_grace(clock, [survivor])
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while (
                "spendbus_enforcer_replicas 2.0"
                not in await (await http.get(f"{url}/metrics")).text()
            ):  # its own newcomer's grace (1 s of the wall clock)
                assert time.monotonic() < deadline, "the sidecar never used 2 replicas"
                await asyncio.sleep(0.2)
            sidecar_admitted = 0
            for _ in range(8):
                auth = {"Authorization": f"Bearer {token}"}
                answer = await (
                    await http.post(f"{url}/v1/check", json=request, headers=auth)
                ).json()
                sidecar_admitted += answer["allowed"]
        assert sidecar_admitted == 5  # 2 x (5 x 0.018) = 0.18: its half
        survivor_admitted = sum(survivor.check(ctx()).allowed for _ in range(8))
        assert survivor_admitted == 5
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        # still counted: the survivor keeps to its half
        assert not survivor.check(ctx()).allowed
        await eventually(lambda: membership.count == 1, 30)
        await asyncio.sleep(0.6)
        assert not survivor.check(ctx()).allowed  # the grace
        await after_grace(clock, [survivor])
        more = sum(survivor.check(ctx()).allowed for _ in range(8))
        assert more == 5  # the whole headroom, now its own: 10 x 0.018 = 0.18
        assert survivor.holds.held_nanos == 180_000_000
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await survivor.stop()

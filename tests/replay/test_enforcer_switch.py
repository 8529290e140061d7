"""The enforcer's generation switch on a real broker: background load, atomic swap keeping
per counter the newer verdict, then following only the new generation's topic."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregator.replay.generations import publish_switch, switch_to
from enforcer import Enforcer, EnforcerConfig
from schemas.codec import VERDICT
from schemas.ids import counter_key
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics

pytestmark = pytest.mark.integration

AT = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def verdict(org: str, seq: int, nanos: int, period: str = "m:2026-11") -> tuple[bytes, bytes]:
    key = counter_key("org-monthly", (org,))
    record = {
        "counter_key": key,
        "budget_id": "org-monthly",
        "scope": "org",
        "scope_values": [org],
        "period": period,
        "state": "ok",
        "spent_nanos": nanos,
        "spent_tokens": seq * 10,
        "spent_requests": seq,
        "limit_nanos": 10**12,
        "limit_tokens": None,
        "limit_requests": None,
        "action": "enforce",
        "refusal": "budget_exceeded",
        "reset_at": datetime(2026, 12, 1, tzinfo=UTC),
        "as_of": AT,
        "seq": seq,
        "emitted_at": AT + timedelta(seconds=seq),
    }
    return key.encode(), VERDICT.encode(record)


def held(enforcer: Enforcer) -> dict[str, tuple[int, int]]:
    return {v.counter_key: (v.seq, v.spent_nanos) for v in enforcer.state.verdicts.values()}


async def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_switch_swaps_atomically_keeps_the_newer_verdict_and_follows_the_new_topic(
    kafka_bootstrap: str, topics: Topics
) -> None:
    g2 = topics.of_generation("g2")
    await publish(
        kafka_bootstrap,
        topics.budget_verdicts,
        [verdict("a", 10, 1000), verdict("b", 5, 500), verdict("c", 7, 700)],
    )
    config = EnforcerConfig(bootstrap=kafka_bootstrap, topic_prefix=topics.prefix)
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        assert enforcer.follower.generation == ""
        a, b, c, d = (counter_key("org-monthly", (o,)) for o in "abcd")
        assert held(enforcer) == {a: (10, 1000), b: (5, 500), c: (7, 700)}

        # g2: behind on a, ahead on b, nothing yet for c, a counter the old one lacks (d)
        await ensure_topics(kafka_bootstrap, g2, partitions=4)
        await publish(
            kafka_bootstrap,
            g2.budget_verdicts,
            [verdict("a", 8, 800), verdict("b", 6, 600), verdict("d", 1, 100)],
        )
        seen_during_swap: list[dict[str, tuple[int, int]]] = []
        enforcer.state.on_verdict(lambda *_: seen_during_swap.append(held(enforcer)))
        await publish_switch(kafka_bootstrap, topics, switch_to("g2", "", retired=False))
        await wait_for(lambda: enforcer.follower.generation == "g2")
        assert enforcer.follower.switches == 1
        assert held(enforcer) == {a: (10, 1000), b: (6, 600), c: (7, 700), d: (1, 100)}
        # each state a check could observe had every old counter and nothing going back
        for snapshot in seen_during_swap:
            assert snapshot[a] == (10, 1000) and snapshot[c] == (7, 700)
            assert snapshot[b] >= (5, 500)

        # now only g2's topic is followed
        await publish(kafka_bootstrap, topics.budget_verdicts, [verdict("c", 50, 5000)])
        await publish(kafka_bootstrap, g2.budget_verdicts, [verdict("a", 11, 1100)])
        await wait_for(lambda: held(enforcer)[a] == (11, 1100))
        await asyncio.sleep(1.0)
        assert held(enforcer)[c] == (7, 700), "the retired generation's topic is still read"
        assert enforcer.ready and not enforcer.stale

    # an enforcer starting after the switch reads only the current generation
    async with Enforcer(config) as fresh:
        await fresh.wait_ready(60)
        assert fresh.follower.generation == "g2" and fresh.follower.switches == 0
        assert held(fresh) == {a: (11, 1100), b: (6, 600), d: (1, 100)}


async def test_a_stack_without_a_control_topic_follows_the_default_generation(
    kafka_bootstrap: str, unique: str
) -> None:
    old = Topics(prefix=f"old{unique}.")
    await ensure_topics(kafka_bootstrap, old, partitions=1)
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([old.generations])
        while old.generations in await admin.list_topics():  # deletion is asynchronous
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    await publish(kafka_bootstrap, old.budget_verdicts, [verdict("a", 3, 300)])
    config = EnforcerConfig(bootstrap=kafka_bootstrap, topic_prefix=old.prefix)
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        assert enforcer.follower.generation == ""
        assert held(enforcer) == {counter_key("org-monthly", ("a",)): (3, 300)}

"""An enforcer started before ``budget.raises`` exists (a stack from before raises) follows
the topic once it is created, from its beginning, without a restart (issue 23), on the
real broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from enforcer import Enforcer, EnforcerConfig
from enforcer.follower import OPTIONAL_TOPIC_CHECK_S
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, PRICE_TABLE, VERDICT
from schemas.periods import to_micros
from schemas.raises import BudgetRaise
from schemas.topics import Topics
from schemas.usage import BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, PRICES, FakeClock, budget, ctx, verdict

pytestmark = pytest.mark.integration

USD = 1_000_000_000
ORG = budget("org-monthly", limit_usd=10)


async def create(bootstrap: str, topics: Topics, names: set[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=1,
                    topic_configs=s.config,
                )
                for s in topics.specs(2)
                if s.name in names
            ]
        )
    finally:
        await admin.close()


async def send(bootstrap: str, messages: list[tuple[str, str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


async def test_raises_are_followed_once_their_topic_is_created(kafka_bootstrap: str) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    everything = {s.name for s in topics.specs(2)}
    await create(kafka_bootstrap, topics, everything - {topics.budget_raises})
    spent = verdict(ORG, ["acme"], spent_nanos=12 * USD)
    await send(
        kafka_bootstrap,
        [
            (topics.budget_policies, ORG.budget_id, BUDGET_POLICY.encode(ORG.to_record(NOW))),
            (topics.pricing, PRICES.version, PRICE_TABLE.encode(PRICES.to_record())),
            (topics.budget_verdicts, spent["counter_key"], VERDICT.encode(spent)),
        ],
    )
    config = EnforcerConfig(bootstrap=kafka_bootstrap, topic_prefix=topics.prefix)
    async with Enforcer(config, clock=FakeClock()) as enforcer:
        await enforcer.wait_ready(60)
        assert enforcer.follower.missing == {topics.budget_raises}
        assert enforcer.check(ctx()).decision == BUDGET_EXCEEDED
        # the topic is created and a raise published into it while this enforcer runs
        await create(kafka_bootstrap, topics, {topics.budget_raises})
        granted = BudgetRaise(
            raise_id="r-late",
            budget_id=ORG.budget_id,
            scope_values=(),
            mode="by",
            raise_nanos=5 * USD,
            raise_tokens=None,
            raise_requests=None,
            starts_at_us=to_micros(NOW - timedelta(minutes=1)),
            until_us=to_micros(NOW + timedelta(hours=1)),
            reason="after the upgrade",
        )
        await send(
            kafka_bootstrap,
            [(topics.budget_raises, granted.raise_id, BUDGET_RAISE.encode(granted.to_record()))],
        )
        # picked up within a few checks of the metadata (bounded), the raise honoured
        deadline = time.monotonic() + 6 * OPTIONAL_TOPIC_CHECK_S + 30
        while "r-late" not in enforcer.state.raises.by_id and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert enforcer.follower.missing == set()
        decision = enforcer.check(ctx())
        assert decision.allowed, decision.body
        assert decision.counters[0].limit_nanos == 15 * USD
        enforcer.release(decision.hold_id)
        # the topics followed before go on from where they were: a newer verdict arrives
        more = verdict(ORG, ["acme"], spent_nanos=16 * USD, seq=2)
        await send(
            kafka_bootstrap, [(topics.budget_verdicts, more["counter_key"], VERDICT.encode(more))]
        )
        deadline = time.monotonic() + 30
        while enforcer.usage(ctx())[0].spent_nanos != 16 * USD and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert enforcer.check(ctx()).decision == BUDGET_EXCEEDED  # $16 of $15

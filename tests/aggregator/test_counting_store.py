"""The counting stage's store recovers from its changelogs on the real broker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from aggregator.fold import CounterState, PeriodTotals
from aggregator.state import CountingStore, encode_counter

pytestmark = pytest.mark.integration


def _state(nanos: int, fence: int) -> CounterState:
    return CounterState(
        period="d:2026-11-30",
        seq=fence + 1,
        periods={"d:2026-11-30": PeriodTotals(nanos=nanos, tokens=nanos // 10, requests=1)},
        fence={2: fence},
    )


def test_recovery_keeps_the_last_value_of_each_key_per_partition(
    kafka_bootstrap: str, unique: str
) -> None:
    counters_topic, seen_topic = f"c{unique}-counters", f"c{unique}-seen"

    async def scenario() -> tuple[CountingStore, CountingStore]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, 4, 1) for t in (counters_topic, seen_topic)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for nanos, fence in ((10, 3), (25, 7)):  # two versions: the second wins
                await producer.send_and_wait(
                    counters_topic, encode_counter(_state(nanos, fence)), b"k1", partition=2
                )
            await producer.send_and_wait(
                counters_topic, encode_counter(_state(99, 1)), b"other", partition=3
            )
            await producer.send_and_wait(seen_topic, b"2:4", b"ev-1", partition=2)
            await producer.send_and_wait(seen_topic, b"2:5", b"ev-2", partition=2)
            await producer.send_and_wait(seen_topic, None, b"ev-2", partition=2)  # tombstone
        finally:
            await producer.stop()
        mine, empty = CountingStore(), CountingStore()
        stats = await mine.recover(kafka_bootstrap, {2}, counters_topic, seen_topic)
        assert stats.records == 5 and stats.counters == 1 and stats.seen == 1
        await empty.recover(kafka_bootstrap, {0}, counters_topic, seen_topic)
        return mine, empty

    mine, empty = asyncio.run(scenario())
    recovered = mine.counter(2, "k1")
    assert recovered is not None and recovered.to_json() == _state(25, 7).to_json()
    assert mine.counter(2, "other") is None  # another partition's state is not read
    assert mine.seen(2, "ev-1") == "2:4" and mine.seen(2, "ev-2") is None
    assert empty.partitions[0].counters == {} and empty.partitions[0].seen == {}

"""What lets a checkpoint run beside the fold, on the real broker: the cut.

- Record batches sealed by a cut take no more records; ``settle(epoch)`` returns the
  deliveries of that epoch and before only, and in every partition they sit below every
  record added after the cut (so the offsets they reach cover exactly the cut).
- The store's sealed entries are persisted with those offsets while entries put after
  the cut stay pending (and every sealed event id is still found meanwhile).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from aggregator.counting.counter_codec import encode_counter
from aggregator.counting.fold import CounterState, PeriodTotals
from aggregator.counting.output_batches import Outgoing
from aggregator.counting.state import CountingStore

pytestmark = pytest.mark.integration


def _state(nanos: int) -> CounterState:
    return CounterState(
        period="t", seq=nanos, periods={"t": PeriodTotals(nanos=nanos)}, fence={0: nanos}
    )


async def _create(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 2, 1) for t in names])
    finally:
        await admin.close()


async def _read_all(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        while len(values) < end:
            for messages in (await consumer.getmany(tp, timeout_ms=1000)).values():
                values += [m.value for m in messages if m.value is not None]
        return values
    finally:
        await consumer.stop()


def test_a_cut_seals_batches_and_settles_only_its_epoch(kafka_bootstrap: str, unique: str) -> None:
    topic = f"t{unique}-out"

    async def scenario() -> None:
        await _create(kafka_bootstrap, topic)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
        await producer.start()
        try:
            outgoing = Outgoing(producer)
            for n in range(300):  # before the cut, both partitions
                outgoing.add(topic, n % 2, None, f"before-{n}".encode())
            epoch = outgoing.seal()
            for n in range(200):  # after it: never in the sealed batches
                outgoing.add(topic, n % 2, None, f"after-{n}".encode())
            outgoing.release()
            deliveries = await outgoing.settle(epoch)
            assert sum(count for _, count in deliveries) == 300
            reached: dict[int, int] = {}
            for delivery, count in deliveries:
                meta = await delivery
                reached[meta.partition] = max(reached.get(meta.partition, 0), meta.offset + count)
            later = await outgoing.settle(epoch + 1)
            assert sum(count for _, count in later) == 200
            await asyncio.gather(*[d for d, _ in later])
        finally:
            await producer.stop()
        for partition in (0, 1):
            values = await _read_all(kafka_bootstrap, topic, partition)
            cut = reached[partition]
            assert all(v.startswith(b"before-") for v in values[:cut]), partition
            assert all(v.startswith(b"after-") for v in values[cut:]), partition
            assert len(values) == 250

    asyncio.run(scenario())


class _Watched(AIOKafkaProducer):  # type: ignore[misc]  # aiokafka ships no types: its class is Any
    """A real producer that remembers which topics it was given batches of."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.topics: set[str] = set()

    async def send_batch(self, batch: Any, topic: str, **kwargs: Any) -> Any:
        self.topics.add(topic)
        return await super().send_batch(batch, topic, **kwargs)


def test_a_topic_on_its_own_producer_keeps_the_epochs(kafka_bootstrap: str, unique: str) -> None:
    """Verdicts go through a producer of their own: a cut still settles both producers'
    batches of its epoch, and each partition keeps the epoch's records below later ones."""
    shared_topic, own_topic = f"t{unique}-shared", f"t{unique}-own"

    async def scenario() -> None:
        await _create(kafka_bootstrap, shared_topic, own_topic)
        shared = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
        own = _Watched(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
        await shared.start()
        await own.start()
        try:
            outgoing = Outgoing(shared, own_producer={own_topic: own})
            for n in range(300):
                outgoing.add(shared_topic, n % 2, None, f"before-{n}".encode())
                outgoing.add(own_topic, n % 2, None, f"before-{n}".encode())
            epoch = outgoing.seal()
            for n in range(100):
                outgoing.add(shared_topic, n % 2, None, f"after-{n}".encode())
                outgoing.add(own_topic, n % 2, None, f"after-{n}".encode())
            outgoing.release()
            deliveries = await outgoing.settle(epoch)
            assert sum(count for _, count in deliveries) == 600
            reached: dict[tuple[str, int], int] = {}
            for delivery, count in deliveries:
                meta = await delivery
                where = (meta.topic, meta.partition)
                reached[where] = max(reached.get(where, 0), meta.offset + count)
            assert {topic for topic, _ in reached} == {shared_topic, own_topic}
            assert own.topics == {own_topic}  # and only its topic went through it
            later = await outgoing.settle(epoch + 1)
            await asyncio.gather(*[d for d, _ in later])
        finally:
            await shared.stop()
            await own.stop()
        for topic in (shared_topic, own_topic):
            for partition in (0, 1):
                values = await _read_all(kafka_bootstrap, topic, partition)
                cut = reached[(topic, partition)]
                assert cut == 150 and len(values) == 200, (topic, partition)
                assert all(v.startswith(b"before-") for v in values[:cut]), (topic, partition)
                assert all(v.startswith(b"after-") for v in values[cut:]), (topic, partition)

    asyncio.run(scenario())


def test_sealed_entries_persist_while_later_ones_stay_pending(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    counters_topic, seen_topic = f"t{unique}-counters", f"t{unique}-seen"

    async def scenario() -> None:
        await _create(kafka_bootstrap, counters_topic, seen_topic)
        store = CountingStore(tmp_path, counters_topic, seen_topic)
        await store.recover(kafka_bootstrap, {0})
        store.put_counter(0, "k", _state(1))
        store.put_seen(0, "ev-1", "0:1")
        sealed = store.seal()
        store.put_counter(0, "k", _state(2))  # after the cut
        store.put_seen(0, "ev-2", "0:2")
        assert store.seen(0, "ev-1") == "0:1" and store.seen(0, "ev-2") == "0:2"
        assert store.pending_seen == 2
        # the cut's changelog records were acknowledged up to these offsets
        store.persist({(counters_topic, 0): 1, (seen_topic, 0): 1}, sealed)
        assert store.pending_seen == 1
        assert store.seen(0, "ev-1") == "0:1"  # now from RocksDB
        part = store.partitions[0]
        assert part.offsets == {"counters": 1, "seen": 1}
        assert part.pending_seen == {"ev-2": "0:2"} and list(part.pending_counters) == ["k"]
        assert part.db is not None
        assert part.db[b"ck"] == b'{"p":"t","s":1,"f":{"0":1},"t":{"t":[1,0,0,0,[],{}]}}'
        assert part.db.get(b"sev-2") is None  # not acknowledged yet: not in the store
        store.close()

    asyncio.run(scenario())


def test_a_counter_touched_often_is_written_once_as_it_is_at_the_write(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Between two cuts the fold only touches counters (the live state objects); the cut
    writes each changed counter once, encoded as it is then, and puts it for persisting."""
    counters_topic, seen_topic = f"t{unique}-counters", f"t{unique}-seen"

    async def scenario() -> None:
        await _create(kafka_bootstrap, counters_topic, seen_topic)
        store = CountingStore(tmp_path, counters_topic, seen_topic)
        await store.recover(kafka_bootstrap, {0, 1})
        live = _state(1)
        for nanos in range(1, 50):  # one counter, changed in place by 49 folds
            live.periods["t"].nanos = nanos
            store.touch_counter(0, "hot", live)
        store.touch_counter(1, "cold", _state(7))
        assert store.changed_counters == 2
        assert store.counter(0, "hot") is live  # the fold reads the live state meanwhile
        assert store.partitions[0].pending_counters == {}  # nothing encoded before the write
        written = store.write_changed()
        assert sorted((p, k) for p, k, _ in written) == [(0, "hot"), (1, "cold")]
        hot = next(v for p, k, v in written if k == "hot")
        assert hot == encode_counter(live) and b'"t":[49,' in hot  # the state at the write
        assert store.partitions[0].pending_counters == {"hot": hot}  # persisted at the cut
        assert store.changed_counters == 0 and store.write_changed() == []
        store.touch_counter(1, "cold", _state(8))
        store.drop({1})  # given up: its unwritten change is not counted any more
        assert store.changed_counters == 0
        store.close()

    asyncio.run(scenario())

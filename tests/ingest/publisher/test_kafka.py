"""The publisher against a real broker: what is published is what is read back, and a broker
outage plus a publisher restart loses nothing and publishes nothing twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner

from ingest.publisher import UsagePublisher
from schemas.topics import Topics, usage_raw_key
from spendbus.stack.topics import ensure_topics
from tests.ingest.publisher.kit import config, consume, event

pytestmark = pytest.mark.integration


async def test_published_events_read_back_keyed_by_org_with_their_ids(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    orgs = ["acme", "globex", "initech", "umbrella", "hooli"]
    events = [event(i, org=orgs[i % len(orgs)]) for i in range(2_000)]
    async with UsagePublisher(config(tmp_path, kafka_bootstrap, topic_prefix=topics.prefix)) as pub:
        await pub.publish(events[0])
        assert await pub.publish_many(events[1:]) == len(events) - 1
        await pub.flush(30)
        assert pub.spooled_bytes == 0
        assert pub.metrics.published._value.get() == len(events)

    got = await consume(kafka_bootstrap, topics.usage_raw, len(events))
    assert len(got) == len(events)
    assert {e["event_id"] for _, _, e in got} == {e["event_id"] for e in events}
    by_id = {e["event_id"]: e for e in events}
    partitions = list(range(4))
    for partition, key, decoded in got:
        sent = by_id[decoded["event_id"]]
        assert key == usage_raw_key(sent["org_id"])
        assert decoded == sent  # decoded field by field: nothing was re-encoded or changed
        # the partition every Kafka client's default partitioner picks for this key
        assert partition == DefaultPartitioner()(key, partitions, partitions)
    # per key, the topic holds the events in publish order
    order: dict[bytes, list[str]] = defaultdict(list)
    for _, key, decoded in got:
        order[key].append(decoded["event_id"])
    for org in orgs:
        assert order[org.encode()] == [e["event_id"] for e in events if e["org_id"] == org]


async def test_waits_for_room_when_the_spool_is_full_then_delivers_everything(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    cfg = config(
        tmp_path,
        kafka_bootstrap,
        topic_prefix=topics.prefix,
        spool_max_bytes=64 * 1024,
        segment_bytes=16 * 1024,
        max_batch_bytes=16 * 1024,
        max_record_bytes=4 * 1024,
        spool_full_timeout_s=20,
    )
    events = [event(i) for i in range(3_000)]  # ~1 MB: many times the spool
    async with UsagePublisher(cfg) as pub:
        for i in range(0, len(events), 100):
            await pub.publish_many(events[i : i + 100])
        await pub.flush(30)
        waited = pub.metrics.spool_full.labels("waited")._value.get()
        assert waited > 0
        assert pub.metrics.spool_full.labels("refused")._value.get() == 0
        # acknowledged segments are deleted when the cursor is next written (every 100 ms)
        for _ in range(100):
            if pub.status()["spool_segments"] <= 5:
                break
            await asyncio.sleep(0.1)
        assert pub.status()["spool_segments"] <= 5
    got = await consume(kafka_bootstrap, topics.usage_raw, len(events))
    assert [e["event_id"] for _, _, e in got] == [e["event_id"] for e in events]


@pytest.mark.faults
async def test_broker_outage_and_publisher_restart_lose_nothing_and_duplicate_nothing(
    local_broker: Any, tmp_path: Path
) -> None:
    """Kill the broker, publish, stop the publisher; start a new one, restart the broker on
    the same port: every event arrives exactly once by event_id, in order per key."""
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(local_broker.bootstrap, topics, partitions=4)
    cfg = config(tmp_path / "spool", local_broker.bootstrap, topic_prefix=topics.prefix)
    orgs = ["acme", "globex", "initech"]
    before = [event(i, org=orgs[i % 3]) for i in range(100)]
    during = [event(i, org=orgs[i % 3]) for i in range(100, 1_100)]

    first = UsagePublisher(cfg)
    await first.start()
    await first.publish_many(before)
    await first.flush(30)
    await asyncio.to_thread(local_broker.kill)  # a broker crash: the harshest stop
    try:
        for e in during[:500]:
            await first.publish(e)
        await first.publish_many(during[500:])
        await asyncio.sleep(0.5)  # the sender tries, and fails, meanwhile
        assert first.spooled_bytes > 0
        await first.stop(timeout=0.5)

        second = UsagePublisher(cfg)
        await second.start()
        assert second.spooled_bytes > 0  # the spool survived the restart
    finally:
        await asyncio.to_thread(local_broker.start)
    await second.flush(60)
    await second.stop()

    sent = before + during
    got = await consume(local_broker.bootstrap, topics.usage_raw, len(sent))
    ids = [e["event_id"] for _, _, e in got]
    print(
        f"ledger: sent={len(sent)} arrived={len(ids)} unique={len(set(ids))} "
        f"difference={len(ids) - len(sent)}"
    )
    assert len(ids) == len(set(ids)) == len(sent)  # exactly once
    assert set(ids) == {e["event_id"] for e in sent}
    for org in orgs:
        assert [e["event_id"] for _, k, e in got if k == org.encode()] == [
            e["event_id"] for e in sent if e["org_id"] == org
        ]


async def test_records_linger_together_and_flush_does_not_wait_for_the_linger(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Kafka's linger: nothing goes out before the oldest record waited linger_ms, then
    every record that joined meanwhile goes in the same batch; flush() sends at once."""
    cfg = config(tmp_path, kafka_bootstrap, topic_prefix=topics.prefix, linger_ms=800)
    async with UsagePublisher(cfg) as pub:
        batches = pub.metrics.batches._value
        published = pub.metrics.published._value
        # one event, flushed: sent at once, in one batch (a flush ignores the linger)
        await pub.publish(event(0))
        await asyncio.wait_for(pub.flush(30), 30)
        assert (batches.get(), published.get()) == (1, 1)

        # five events of one org, 40 ms apart: all within the first one's linger
        for i in range(1, 6):
            await pub.publish(event(i))
            await asyncio.sleep(0.04)
        assert (batches.get(), published.get()) == (1, 1)  # nothing sent before the linger
        deadline = asyncio.get_running_loop().time() + 30
        while published.get() < 6 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert (batches.get(), published.get()) == (2, 6)  # then all five in one batch

        # a long linger never holds up a flush
        slow = config(
            tmp_path / "slow", kafka_bootstrap, topic_prefix=topics.prefix, linger_ms=60_000
        )
        async with UsagePublisher(slow) as hurried:
            await hurried.publish(event(9))
            await asyncio.wait_for(hurried.flush(30), 10)
            assert hurried.metrics.published._value.get() == 1
    got = await consume(kafka_bootstrap, topics.usage_raw, 7)
    assert len(got) == 7

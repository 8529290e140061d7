"""Smoke tests of the real Kafka broker that the rest of the suite runs on.

They prove, against a real broker (LocalKafka, or the cluster named by KAFKA_BOOTSTRAP), what the
pipeline depends on: topic creation, produce/consume, consumer-group commits, compacted topics,
faust-streaming tables with changelogs (memory and rocksdb stores) and table recovery from the
changelog; and LocalKafka's own lifecycle (idempotent start, re-attach and stop from another
process, clean and crash restarts on the same port keeping the data).

The broker is the session fixture ``kafka_bootstrap`` of tests/conftest.py (KAFKA_BOOTSTRAP, or a
LocalKafka for the session); the lifecycle test starts a LocalKafka of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from spendbus.stack.broker_probe import broker_ready
from spendbus.stack.kafka import LocalKafka

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = os.environ.get("KAFKA_BOOTSTRAP")


def _unique(prefix: str) -> str:
    # Unique names keep the tests independent of each other and of an external cluster's state.
    return f"smoke-{prefix}-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _create_topics(bootstrap: str, *topics: NewTopic) -> None:
    async with _admin(bootstrap) as admin:
        response = await admin.create_topics(list(topics))
    errors = {name: (code, msg) for name, code, msg in response.topic_errors if code != 0}
    assert not errors, f"create_topics failed: {errors}"


async def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    async with _admin(bootstrap) as admin:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)]
        )
    (resource,) = response.to_object()["resources"]
    assert resource["error_code"] == 0, resource
    return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}


async def _consume(
    bootstrap: str, topic: str, want: int, group: str | None = None, timeout: float = 30.0
) -> list[Any]:
    """Read ``want`` records of ``topic`` from the earliest offset, committing if in a group."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while len(records) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        if group is not None:
            await consumer.commit()
    finally:
        await consumer.stop()
    return records


async def _read_all(
    bootstrap: str, topic: str, partitions: int = 1, timeout: float = 30.0
) -> list[Any]:
    """Every record of ``topic`` up to its current end offsets (no group, nothing committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end in {timeout}s")
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_produce_consume_and_group_commit(kafka_bootstrap: str) -> None:
    topic, group, n = _unique("t"), _unique("g"), 60
    await _create_topics(kafka_bootstrap, NewTopic(topic, 3, 1))

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for i in range(n):
            await producer.send(topic, f"v{i}".encode(), key=f"org-{i % 7}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    records = await _consume(kafka_bootstrap, topic, n, group=group)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(n))
    # One key always lands in one partition: what keeps all counters of an org in one place.
    partitions_of_key: dict[bytes, set[int]] = {}
    for r in records:
        partitions_of_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_of_key.values())

    async with _admin(kafka_bootstrap) as admin:
        committed = await admin.list_consumer_group_offsets(group)
    assert sum(meta.offset for tp, meta in committed.items() if tp.topic == topic) == n

    # A new member of the group resumes from the committed offsets: nothing left to read.
    assert await _consume(kafka_bootstrap, topic, 1, group=group, timeout=3.0) == []


async def test_compacted_topic_is_compacted(kafka_bootstrap: str) -> None:
    """A compacted topic keeps the last value of each key: what budget.verdicts relies on."""
    topic = _unique("compact")
    await _create_topics(
        kafka_bootstrap,
        NewTopic(
            topic,
            1,
            1,
            topic_configs={
                "cleanup.policy": "compact",
                # Roll segments at once and clean any dirt: the active segment is never
                # compacted, so with the defaults (7 days, 50 % dirty) nothing would happen here.
                "segment.ms": "100",
                "min.cleanable.dirty.ratio": "0.01",
            },
        ),
    )
    assert (await _topic_config(kafka_bootstrap, topic))["cleanup.policy"] == "compact"

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"spent-{i}".encode(), key=b"counter")
        await producer.send_and_wait(topic, None, key=b"deleted")  # a tombstone is accepted
        deadline = time.monotonic() + 60  # LocalKafka's cleaner looks every 2 s; defaults 15 s
        while True:
            # A new record rolls the segment holding the older ones, making them cleanable.
            await asyncio.sleep(0.5)
            await producer.send_and_wait(topic, b"tick", key=b"tick")
            records = await _read_all(kafka_bootstrap, topic)
            values = [r.value for r in records if r.key == b"counter"]
            if values == [b"spent-4"] or time.monotonic() > deadline:
                break
    finally:
        await producer.stop()
    assert values == [b"spent-4"], "the log cleaner did not compact the topic"


def _counting_app(
    app_id: str, bootstrap: str, store: str, datadir: Path, source: str, partitions: int
) -> tuple[faust.App, Any, list[int]]:
    """A faust app whose agent counts the records of ``source`` per key in a changelogged table.

    Returns the app, its table and a one-element list counting the records the agent saw.
    """
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store=store,
        datadir=str(datadir),
        # The embedded web server would bind 0.0.0.0:6066; nothing here needs it.
        web_enabled=False,
        # The changelog must have as many partitions as the source topic it is updated from.
        topic_partitions=partitions,
        topic_replication_factor=1,
    )
    events = app.topic(
        source, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    counts = app.Table("counts", default=int, key_type=str, value_type=int)
    seen = [0]

    @app.agent(events)
    async def count(stream: Any) -> None:
        async for event in stream.events():
            counts[event.key.decode()] += 1
            seen[0] += 1

    return app, counts, seen


async def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
async def test_faust_table_with_changelog(kafka_bootstrap: str, tmp_path: Path, store: str) -> None:
    app_id, n, keys, partitions = _unique(store.split(":")[0]), 200, 5, 2
    source = f"{app_id}-events"
    await _create_topics(kafka_bootstrap, NewTopic(source, partitions, 1))
    expected = {f"org-{k}": n // keys for k in range(keys)}

    app, counts, seen = _counting_app(
        app_id, kafka_bootstrap, store, tmp_path / "first", source, partitions
    )
    await app.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for i in range(n):
                await producer.send(source, b"x", key=f"org-{i % keys}".encode())
            await producer.flush()
        finally:
            await producer.stop()
        await _wait_for(lambda: dict(counts.items()) == expected, 60, "the table to count all")
        assert seen[0] == n
    finally:
        await app.stop()

    changelog = f"{app_id}-counts-changelog"
    async with _admin(kafka_bootstrap) as admin:
        assert changelog in await admin.list_topics()
    assert (await _topic_config(kafka_bootstrap, changelog))["cleanup.policy"] == "compact"

    # The same app id with an empty memory store can only get its state from the changelog; the
    # source offsets committed at stop() mean it must not count anything again.
    app2, counts2, seen2 = _counting_app(
        app_id, kafka_bootstrap, "memory://", tmp_path / "second", source, partitions
    )
    await app2.start()
    try:
        await _wait_for(lambda: dict(counts2.items()) == expected, 60, "recovery from changelog")
        await asyncio.sleep(1.0)
        assert seen2[0] == 0
        assert dict(counts2.items()) == expected
    finally:
        await app2.stop()


def _in_other_process(data_dir: Path, code: str) -> str:
    """Run ``code`` in a fresh interpreter with ``k = LocalKafka(data_dir)``; return its stdout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    script = (
        "from pathlib import Path\nfrom spendbus.stack.kafka import LocalKafka\n"
        f"k = LocalKafka(Path({str(data_dir)!r}))\n{code}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def _produce_one(bootstrap: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()


@pytest.mark.skipif(bool(EXTERNAL), reason="LocalKafka lifecycle; KAFKA_BOOTSTRAP names a cluster")
async def test_local_kafka_lifecycle(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path / "kafka")
    # start()/stop() block for seconds: run them off the event loop, as an async caller should.
    await asyncio.to_thread(broker.start, 180)
    try:
        pid, bootstrap = broker.pid, broker.bootstrap
        assert pid is not None and broker.is_running()

        await asyncio.to_thread(broker.start)  # idempotent: same JVM
        assert broker.pid == pid

        # Another process re-attaches through broker.pid + state.json (spendbus up / down).
        assert _in_other_process(broker.data_dir, "print(k.is_running(), k.bootstrap)") == (
            f"True {bootstrap}"
        )

        topic = _unique("restart")
        await _create_topics(bootstrap, NewTopic(topic, 1, 1))
        await _produce_one(bootstrap, topic, b"before-stop")

        # Clean stop from another process; the data and the port survive a restart.
        _in_other_process(broker.data_dir, "k.stop()")
        assert not broker.is_running()
        assert not broker_ready("127.0.0.1", broker.port, timeout=0.5)
        await asyncio.to_thread(broker.start, 180)
        assert broker.bootstrap == bootstrap and broker.pid != pid
        await _produce_one(bootstrap, topic, b"after-restart")

        # A crash (SIGKILL) and a restart: the log is recovered, acknowledged writes are kept.
        await asyncio.to_thread(broker.kill)
        assert not broker.is_running()
        await asyncio.to_thread(broker.start, 180)
        assert broker.bootstrap == bootstrap
        records = await _consume(bootstrap, topic, 2)
        assert [r.value for r in records] == [b"before-stop", b"after-restart"]
        tp = TopicPartition(topic, 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            assert (await consumer.end_offsets([tp]))[tp] == 2
        finally:
            await consumer.stop()
    finally:
        await asyncio.to_thread(broker.stop)
    assert not broker.is_running()
    assert not (broker.data_dir / "broker.pid").exists()

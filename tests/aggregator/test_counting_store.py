"""The counting stage's store on the real broker: recovery from the changelogs, and the local
RocksDB that caches a prefix of them (a restart reads only the tail; a store that does not
match the changelogs any more is wiped and restored from the start)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.errors import TopicAlreadyExistsError

from aggregator.config import AggregatorConfig
from aggregator.counting.counter_codec import encode_counter
from aggregator.counting.fold import CounterState, PeriodTotals
from aggregator.counting.process import BatchProcessor
from aggregator.counting.reference import Reference
from aggregator.counting.stage import CountingStage
from aggregator.counting.state import CountingStore, RecoveryStats
from aggregator.metrics import Metrics
from schemas.budgets import budgets_from_yaml
from schemas.codec import USAGE_EVENT
from schemas.topics import Topics, usage_raw_key
from schemas.usage import new_usage_event
from tests.pipeline_kit import BUDGETS_YAML, price_book

pytestmark = pytest.mark.integration

PARTITION = 2


def _state(nanos: int, fence: int) -> CounterState:
    return CounterState(
        period="d:2026-11-30",
        seq=fence + 1,
        periods={"d:2026-11-30": PeriodTotals(nanos=nanos, tokens=nanos // 10, requests=1)},
        fence={PARTITION: fence},
    )


async def _create(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 4, 1) for t in names])
    finally:
        await admin.close()


async def _recreate(bootstrap: str, *names: str) -> None:
    """Delete the topics and create them again, empty (deletion finishes asynchronously)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(list(names))
        for _ in range(100):
            response = await admin.create_topics([NewTopic(t, 4, 1) for t in names])
            codes = {name: code for name, code, *_ in response.topic_errors}
            if all(code == 0 for code in codes.values()):
                return
            names = tuple(n for n, code in codes.items() if code != 0)
            assert all(code == TopicAlreadyExistsError.errno for code in codes.values()), codes
            await asyncio.sleep(0.2)
        raise AssertionError(f"topics {names} were not recreated")
    finally:
        await admin.close()


async def _write(
    bootstrap: str, counters_topic: str, seen_topic: str, first: int, count: int
) -> dict[tuple[str, int], int]:
    """``count`` events from number ``first``: a seen entry each and 3 counters moving with
    them (so counters are rewritten and the compacted keys repeat). Returns the changelog
    offsets reached, as a checkpoint's acknowledgements give them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    reached: dict[tuple[str, int], int] = {}
    try:
        for n in range(first, first + count):
            sends = [
                (seen_topic, f"ev-{n}".encode(), f"{PARTITION}:{n}".encode()),
                (counters_topic, f"k{n % 3}".encode(), encode_counter(_state(10 * n, n))),
            ]
            for topic, key, value in sends:
                meta = await producer.send_and_wait(topic, value, key, partition=PARTITION)
                reached[(topic, PARTITION)] = meta.offset + 1
    finally:
        await producer.stop()
    return reached


async def _recover(
    root: Path, bootstrap: str, topics: tuple[str, str]
) -> tuple[CountingStore, RecoveryStats]:
    store = CountingStore(root, *topics)
    stats = await store.recover(bootstrap, {PARTITION})
    return store, stats


def _contents(store: CountingStore) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    counters = {k: s.to_json() for k, s in store.partitions[PARTITION].counters.items()}
    return counters, dict(store.event_ids(PARTITION))


def test_recovery_keeps_the_last_value_of_each_key_per_partition(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    counters_topic, seen_topic = f"c{unique}-counters", f"c{unique}-seen"

    async def scenario() -> tuple[CountingStore, CountingStore, RecoveryStats]:
        await _create(kafka_bootstrap, counters_topic, seen_topic)
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
        mine = CountingStore(tmp_path / "mine", counters_topic, seen_topic)
        empty = CountingStore(tmp_path / "empty", counters_topic, seen_topic)
        stats = await mine.recover(kafka_bootstrap, {2})
        await empty.recover(kafka_bootstrap, {0})
        return mine, empty, stats

    mine, empty, stats = asyncio.run(scenario())
    assert stats.records == 5 and stats.counters == 1 and stats.seen == 3 and stats.wiped == 0
    recovered = mine.counter(2, "k1")
    assert recovered is not None and recovered.to_json() == _state(25, 7).to_json()
    assert mine.counter(2, "other") is None  # another partition's state is not read
    assert mine.seen(2, "ev-1") == "2:4" and mine.seen(2, "ev-2") is None
    assert dict(mine.event_ids(2)) == {"ev-1": "2:4"}
    assert empty.partitions[0].counters == {} and list(empty.event_ids(0)) == []


def test_a_restart_reads_only_the_changelog_tail_and_equals_a_full_restore(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topics = (f"t{unique}-counters", f"t{unique}-seen")
    local = tmp_path / "local"

    async def scenario() -> None:
        await _create(kafka_bootstrap, *topics)
        await _write(kafka_bootstrap, *topics, first=0, count=40)  # 80 records
        first, stats = await _recover(local, kafka_bootstrap, topics)
        assert (stats.records, stats.local_counters, stats.wiped) == (80, 0, 0)
        # what the worker folds next: kept in memory, then persisted by a checkpoint once
        # the changelog acknowledged it (the same records, written here by hand)
        for n in range(40, 50):
            first.put_seen(PARTITION, f"ev-{n}", f"{PARTITION}:{n}")
            first.put_counter(PARTITION, f"k{n % 3}", _state(10 * n, n))
        assert first.pending_seen == 10 and first.seen(PARTITION, "ev-45") == f"{PARTITION}:45"
        reached = await _write(kafka_bootstrap, *topics, first=40, count=10)
        first.persist(reached)
        assert first.pending_seen == 0 and first.seen(PARTITION, "ev-45") == f"{PARTITION}:45"
        first.drop({PARTITION})

        # written while the worker was away (another owner, or a crash before persist)
        await _write(kafka_bootstrap, *topics, first=50, count=15)  # 30 records
        restarted, tail = await _recover(local, kafka_bootstrap, topics)
        assert (tail.records, tail.local_counters, tail.wiped) == (30, 3, 0)
        scratch, full = await _recover(tmp_path / "scratch", kafka_bootstrap, topics)
        assert full.records == 130 and full.wiped == 0
        assert _contents(restarted) == _contents(scratch)
        counters, seen = _contents(restarted)
        assert len(seen) == 65 and seen["ev-64"] == f"{PARTITION}:64"
        assert counters["k1"] == _state(640, 64).to_json()  # 64 is the last n with n % 3 == 1
        restarted.drop({PARTITION})
        scratch.drop({PARTITION})

        # a restart with nothing new reads nothing
        again, idle = await _recover(local, kafka_bootstrap, topics)
        assert (idle.records, idle.local_counters) == (0, 3)
        assert _contents(again) == (counters, seen)
        again.drop({PARTITION})

    asyncio.run(scenario())


def test_a_store_past_the_end_of_a_recreated_changelog_is_wiped_and_restored(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topics = (f"r{unique}-counters", f"r{unique}-seen")
    local = tmp_path / "local"

    async def scenario() -> None:
        await _create(kafka_bootstrap, *topics)
        await _write(kafka_bootstrap, *topics, first=0, count=20)
        old, _ = await _recover(local, kafka_bootstrap, topics)
        old.drop({PARTITION})
        await _recreate(kafka_bootstrap, *topics)
        await _write(kafka_bootstrap, *topics, first=100, count=4)  # 8 records, other keys
        stale, stats = await _recover(local, kafka_bootstrap, topics)
        assert (stats.wiped, stats.records) == (1, 8)
        counters, seen = _contents(stale)
        assert seen == {f"ev-{n}": f"{PARTITION}:{n}" for n in range(100, 104)}
        assert stale.seen(PARTITION, "ev-3") is None  # nothing of the old topic is left
        assert set(counters) == {"k0", "k1", "k2"}
        assert counters["k0"] == _state(1020, 102).to_json()
        stale.drop({PARTITION})

    asyncio.run(scenario())


def test_a_store_behind_the_log_start_offset_is_wiped_and_restored(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Records the store still needs were removed (retention, delete-records)."""
    topics = (f"d{unique}-counters", f"d{unique}-seen")
    local = tmp_path / "local"

    async def scenario() -> None:
        await _create(kafka_bootstrap, *topics)
        await _write(kafka_bootstrap, *topics, first=0, count=5)
        old, _ = await _recover(local, kafka_bootstrap, topics)
        old.drop({PARTITION})
        reached = await _write(kafka_bootstrap, *topics, first=5, count=10)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            # the seen changelog loses its first 8 records: the store (at 5) cannot catch up
            await admin.delete_records({TopicPartition(topics[1], PARTITION): RecordsToDelete(8)})
        finally:
            await admin.close()
        behind, stats = await _recover(local, kafka_bootstrap, topics)
        assert stats.wiped == 1
        assert (
            stats.records == reached[(topics[0], PARTITION)] + reached[(topics[1], PARTITION)] - 8
        )
        _, seen = _contents(behind)
        assert set(seen) == {f"ev-{n}" for n in range(8, 15)}
        behind.drop({PARTITION})

    asyncio.run(scenario())


def test_a_store_whose_files_were_deleted_or_damaged_restores_from_the_start(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topics = (f"f{unique}-counters", f"f{unique}-seen")
    local = tmp_path / "local"

    async def scenario() -> None:
        await _create(kafka_bootstrap, *topics)
        await _write(kafka_bootstrap, *topics, first=0, count=12)
        old, _ = await _recover(local, kafka_bootstrap, topics)
        before = _contents(old)
        old.drop({PARTITION})
        shutil.rmtree(local)
        fresh, stats = await _recover(local, kafka_bootstrap, topics)
        assert (stats.records, stats.local_counters, stats.wiped) == (24, 0, 0)
        assert _contents(fresh) == before
        fresh.drop({PARTITION})

        # files RocksDB cannot read: wiped and restored too
        (local / topics[0] / str(PARTITION) / "CURRENT").write_text("not a manifest\n")
        rebuilt, stats = await _recover(local, kafka_bootstrap, topics)
        assert (stats.records, stats.local_counters, stats.wiped) == (24, 0, 1)
        assert _contents(rebuilt) == before
        rebuilt.drop({PARTITION})

    asyncio.run(scenario())


def test_the_stage_persists_its_checkpoints_and_a_restart_reads_nothing_more(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The counting stage end to end: its checkpoints write the local store (step 5), so a
    restarted stage recovers from it without reading a changelog record, and equals a
    from-scratch restore of the changelogs."""
    config = AggregatorConfig(
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        app_id=f"{topics.prefix}agg",
        data_dir=tmp_path / "worker",
        commit_seconds=0.2,
    )
    events = [
        new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{n % 3}",
            org_id=f"org-{n % 4}",
            gateway_id="store",
            input_tokens=100 + n,
            output_tokens=10,
        )
        for n in range(30)
    ]

    async def run_stage(first: int, count: int) -> RecoveryStats:
        """Publish events[first:count], run a stage until it folded them, stop it."""
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for event in events[first:count]:
                await producer.send_and_wait(
                    topics.usage_raw, USAGE_EVENT.encode(event), usage_raw_key(event["org_id"])
                )
        finally:
            await producer.stop()
        reference = Reference()
        reference.prices = price_book()
        reference.budgets = {
            b.budget_id: b for b in budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))
        }
        ready = asyncio.Event()
        ready.set()
        metrics = Metrics()
        stage = CountingStage(
            config, topics, BatchProcessor(reference, source_topic=topics.usage_raw), metrics, ready
        )
        await stage.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while metrics.totals.get("events", 0) < count - first:
                assert asyncio.get_running_loop().time() < deadline, metrics.totals
                await asyncio.sleep(0.1)
            recovered = stage.store.last_recovery
            assert recovered is not None
            await asyncio.sleep(0.5)  # a checkpoint or two
        finally:
            await stage.stop()
        return recovered

    async def scenario() -> None:
        await run_stage(0, 20)
        first_dir = sorted((tmp_path / "worker" / "counting").iterdir())
        assert [d.name for d in first_dir] == [config.counter_changelog]
        assert len(list(first_dir[0].iterdir())) == 4  # one store per usage.raw partition
        # the restart folds 10 more; the first 20 come from the local stores
        recovered = await run_stage(20, 30)
        assert (recovered.partitions, recovered.records, recovered.wiped) == (4, 0, 0)
        assert recovered.local_counters > 0
        mine = CountingStore(config.data_dir / "counting", *_names(config))
        scratch = CountingStore(tmp_path / "scratch" / "counting", *_names(config))
        await mine.recover(kafka_bootstrap, {0, 1, 2, 3})
        full = await scratch.recover(kafka_bootstrap, {0, 1, 2, 3})
        assert mine.last_recovery is not None and mine.last_recovery.records == 0
        assert full.records > 0
        for partition in range(4):
            assert {k: s.to_json() for k, s in mine.partitions[partition].counters.items()} == {
                k: s.to_json() for k, s in scratch.partitions[partition].counters.items()
            }
            assert dict(mine.event_ids(partition)) == dict(scratch.event_ids(partition))
        ids = {e for p in range(4) for e, _ in mine.event_ids(p)}
        assert {e["event_id"] for e in events} <= ids
        mine.drop({0, 1, 2, 3})
        scratch.drop({0, 1, 2, 3})

    asyncio.run(scenario())


def _names(config: AggregatorConfig) -> tuple[str, str]:
    return config.counter_changelog, config.seen_changelog

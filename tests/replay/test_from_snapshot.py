"""spendbus replay --from-snapshot with a real generation worker (real Kafka, chdb).

The worker is seeded from the latest complete snapshot (changelogs, verdicts, group
offsets at the fences) and must end equal to a fold of the whole ledger from offset 0,
having read only the records after the fences; an incomplete snapshot is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from aggregator.config import AggregatorConfig
from aggregator.replay.generations import fold_views, group_progress, verdict_views
from aggregator.replay.run import StackPlace
from aggregator.replay.seeding import seed_generation
from aggregator.replay.snapshots import (
    fold_ledger,
    ledger_ends,
    load_reference,
    snapshot_records,
    write_snapshot,
)
from runtime.kafka import committed_offsets, topic_partitions
from schemas.errors import ConfigError
from schemas.topics import Topics
from spendbus.commands.replay import generation_replay
from tests.pipeline_kit import Pipeline
from tests.replay.kit import make_events, publish_events

pytestmark = pytest.mark.integration


def _place(bootstrap: str, topics: Topics, dsn: str | None, home: Path) -> StackPlace:
    return StackPlace(bootstrap=bootstrap, topics=topics, dsn=dsn, home=home, partitions=4)


def _wait_group_past(bootstrap: str, topics: Topics, timeout: float = 180.0) -> None:
    ends = asyncio.run(ledger_ends(bootstrap, topics))
    deadline = time.monotonic() + timeout
    while not asyncio.run(group_progress(bootstrap, topics)).past(ends):
        assert time.monotonic() < deadline, f"{topics.aggregator_app_id} did not catch up"
        time.sleep(0.5)


async def _committed(bootstrap: str, group: str) -> dict[int, int]:
    return {tp.partition: o for tp, o in (await committed_offsets(bootstrap, group)).items()}


async def _topic_names(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def test_a_seeded_generation_equals_a_full_replay_and_reads_only_past_the_fences(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    bootstrap, topics = pipeline.bootstrap, pipeline.topics
    before = make_events(600, seed=41)
    publish_events(pipeline, before + before[:10])  # 10 producer duplicates
    reference = asyncio.run(load_reference(bootstrap, topics))
    snapshotted = asyncio.run(fold_ledger(bootstrap, topics, reference))
    snapshot_id = asyncio.run(write_snapshot(bootstrap, topics, snapshotted))
    fences = dict(snapshotted.fences)
    assert sum(fences.values()) == 610

    # after the snapshot only acme spends: globex's and initech's counters are never
    # touched again, so their verdicts can only come from the seeding; 20 ids from
    # before the fence come again (dedupe entries travel in the snapshot)
    later = [e for e in make_events(500, seed=41, start=600) if e["org_id"] == "acme"]
    after = later + before[100:120]
    publish_events(pipeline, after)
    ends = asyncio.run(ledger_ends(bootstrap, topics))
    assert sum(ends.values()) == 610 + len(after)

    run = generation_replay(
        _place(bootstrap, topics, pipeline.dsn, tmp_path), "g2", from_snapshot=True
    )
    run.start()
    try:
        assert run.seeded is not None and run.seeded.fences == fences
        assert run.seeded.counters == len(snapshotted.counters)
        assert run.seeded.dedupe_entries == len(snapshotted.seen) >= 600
        run.wait_caught_up(target=ends)
        _wait_group_past(bootstrap, topics)  # the live generation too (vs_previous)
        report = run.report(settle_seconds=60)
        consumed = run.worker.get("/stats")["events"]
        stored = run.worker.post("/sql", {"sql": "SELECT count() FROM usage_events"})["rows"]
    finally:
        run.stop()

    # the start point: the worker read exactly the records after the fences
    assert consumed == len(after)
    assert asyncio.run(_committed(bootstrap, topics.of_generation("g2").aggregator_app_id)) == ends

    # the counters: every verdict of g2 equals a fold of the whole ledger from offset 0,
    # seq included, for touched and untouched counters alike
    full = asyncio.run(fold_ledger(bootstrap, topics, reference, until=ends))
    assert full.stats.charged == 600 + len(later) and full.stats.duplicates == 30
    expected = fold_views(full)
    found = asyncio.run(verdict_views(bootstrap, topics.of_generation("g2").budget_verdicts))
    assert found == expected
    untouched = {k for k in expected if "acme" not in k}
    assert untouched and untouched <= set(found)

    assert report.from_snapshot == snapshot_id
    assert report.counters_sha256 == hashlib.sha256(full.canonical()).hexdigest()
    assert report.charged == full.stats.charged and report.cost_nanos == full.stats.cost_nanos
    assert report.vs_ledger == [] and report.vs_previous == []
    # ClickHouse: only the rows after the fences, checked as such and said so
    assert int(stored[0][0]) == len(later)
    assert report.vs_clickhouse == []
    assert "after the snapshot's fences" in report.clickhouse_scope
    assert report.consistent


def test_an_incomplete_snapshot_is_refused_and_nothing_is_started(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    Pipeline(kafka_bootstrap, topics, tmp_path, f"chdb://{tmp_path / 'unused'}").apply_reference()
    events = make_events(50, seed=43)

    async def publish_without_manifest() -> None:
        from tests.pipeline_kit import publish_usage as publish

        await publish(kafka_bootstrap, topics.usage_raw, events)
        reference = await load_reference(kafka_bootstrap, topics)
        state = await fold_ledger(kafka_bootstrap, topics, reference)
        records = snapshot_records("s20261130T000000000000Z", state)
        assert records[-1][0].endswith(b"|manifest")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in records[:-1]:  # a crash before the manifest
                await producer.send_and_wait(topics.counter_snapshots, key=key, value=value)
        finally:
            await producer.stop()

    asyncio.run(publish_without_manifest())
    run = generation_replay(
        _place(kafka_bootstrap, topics, None, tmp_path), "g2", from_snapshot=True
    )
    with pytest.raises(ConfigError, match="without a manifest: incomplete"):
        run.start()
    assert run.worker.pid() is None
    g2 = topics.of_generation("g2")
    assert asyncio.run(_committed(kafka_bootstrap, g2.aggregator_app_id)) == {}
    assert f"{g2.aggregator_app_id}-counter-state-changelog" not in asyncio.run(
        _topic_names(kafka_bootstrap)
    )  # nothing was created for the generation


def test_seeding_a_generation_that_has_run_is_refused(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    Pipeline(kafka_bootstrap, topics, tmp_path, f"chdb://{tmp_path / 'unused'}").apply_reference()
    g2 = topics.of_generation("g2")
    config = AggregatorConfig(
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        generation="g2",
        app_id=g2.aggregator_app_id,
    )

    async def scenario() -> None:
        from tests.pipeline_kit import publish_usage as publish

        await publish(kafka_bootstrap, topics.usage_raw, make_events(40, seed=44))
        reference = await load_reference(kafka_bootstrap, topics)
        state = await fold_ledger(kafka_bootstrap, topics, reference)
        # the generation's worker ran once: its group committed offsets
        partitions = await topic_partitions(kafka_bootstrap, topics.usage_raw)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            group_id=config.counting_group,
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            consumer.assign(partitions)
            await consumer.commit({partitions[0]: 1})
        finally:
            await consumer.stop()
        with pytest.raises(ConfigError, match="has committed offsets already"):
            await seed_generation(config, state, reference)
        assert await _committed(kafka_bootstrap, config.counting_group) == {0: 1}

    asyncio.run(scenario())


def test_replay_from_snapshot_from_the_command_line(
    pipeline: Pipeline, request: pytest.FixtureRequest
) -> None:
    import json

    from click.testing import CliRunner

    from spendbus.cli import cli
    from spendbus.stack.worker import WorkerProcess

    env = dict(pipeline.worker.env)
    runner = CliRunner()
    publish_events(pipeline, make_events(200, seed=45))
    # no snapshot yet: refused, and no worker is left behind
    result = runner.invoke(cli, ["replay", "--generation", "g2", "--from-snapshot"], env=env)
    assert result.exit_code != 0
    assert "no complete snapshot" in str(result.exception or result.output)

    result = runner.invoke(cli, ["snapshot", "--json"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    made = json.loads(result.stdout)
    publish_events(pipeline, make_events(100, seed=45, start=200))
    replay_worker = WorkerProcess(
        run_dir=pipeline.worker.run_dir, env={}, web_port=0, name="aggregator-g2"
    )
    request.addfinalizer(replay_worker.stop)
    result = runner.invoke(
        cli,
        ["replay", "--generation", "g2", "--from-snapshot", "--json"],
        env=env,
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "started from snapshot" in result.stderr
    report = json.loads(result.stdout)
    assert report["from_snapshot"] == made["snapshot"]
    assert sum(report["seeded"]["fences"].values()) == 200
    assert report["charged"] == 300 and report["consistent"]
    assert report["vs_ledger"] == [] and report["vs_clickhouse"] == []
    assert "after the snapshot's fences" in report["clickhouse_scope"]

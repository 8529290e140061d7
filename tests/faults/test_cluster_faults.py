"""Faults of a 3-broker cluster (the ``kafka_cluster`` fixture: three local KRaft nodes, each a
broker and a controller voter; topics with three replicas, min.insync.replicas 2), under load
from the publisher: a broker killed -9 and never restarted, the leader of usage.raw killed
while the counting stage checkpoints, a rolling restart of all three, the active controller
killed (the quorum loses a voter), and two workers of which one is killed -9 while a third
joins. Each test prints its ledger (events and nanos sent, charged in the verdicts, stored
in ClickHouse) and asserts every difference is 0. Each leaves all three nodes running.

`make test` runs the first; the others are `slow` (`make test-faults`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.codec import ALERT
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.stack.broker_probe import free_port
from spendbus.stack.topics import ensure_topics, replication_report
from spendbus.stack.worker import WorkerProcess
from tests.pipeline_kit import Pipeline, poll

pytestmark = [pytest.mark.integration, pytest.mark.faults]

EVENTS = 2_400


def make_events(n: int, seed: int) -> list[UsageEvent]:
    rng = random.Random(seed)
    return [
        new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id=f"sk-{i % 6}",
            org_id=f"org-{i % 8}",
            gateway_id="cluster-faults",
            input_tokens=rng.randint(1, 8_000),
            output_tokens=rng.randint(1, 800),
        )
        for i in range(n)
    ]


class ClusterRun:
    """Fresh topics on the cluster, a worker (the sink: the embedded store), the workload."""

    def __init__(self, cluster: Any, tmp_path: Path, dsn: str, seed: int) -> None:
        self.cluster = cluster
        self.tmp_path = tmp_path
        self.topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
        asyncio.run(ensure_topics(cluster.bootstrap, self.topics, partitions=4))
        self.pipeline = Pipeline(cluster.bootstrap, self.topics, tmp_path, dsn)
        self.pipeline.apply_reference()
        self.events = make_events(EVENTS, seed)
        self.costs = [self.pipeline.prices.price_event(e).cost_nanos for e in self.events]
        self.per_secret: dict[tuple[str, str], int] = defaultdict(int)
        for e, cost in zip(self.events, self.costs, strict=True):
            self.per_secret[(e["org_id"], e["secret_id"])] += cost

    def feed(self, fault: Callable[[], Awaitable[None]], chunks: int = 3) -> None:
        """Publish the events in ``chunks``, ``fault()`` after the first (the worker is then
        mid-stream), the rest while and after it happens."""

        async def run() -> None:
            config = PublisherConfig(
                bootstrap=self.cluster.bootstrap,
                topic_prefix=self.topics.prefix,
                spool_dir=self.tmp_path / "spool",
            )
            size = len(self.events) // chunks
            async with UsagePublisher(config) as publisher:
                for event in self.events[:size]:
                    await publisher.publish(event)
                await publisher.flush()
                faulting = asyncio.ensure_future(fault())
                for event in self.events[size:]:
                    await publisher.publish(event)
                    await asyncio.sleep(0)  # the fault's steps get their turn
                await faulting
                await publisher.flush(120)
                assert publisher.spooled_bytes == 0

        asyncio.run(run())

    def ledger(self, fault: str) -> None:
        """Print the ledger and assert nothing was lost or doubled anywhere."""
        sent, sent_nanos = len(self.events), sum(self.costs)
        rows = self.pipeline.sql_until(
            "SELECT count(), sum(cost_nanos), uniqExact(event_id) FROM usage_events",
            lambda rows: int(rows[0][0]) >= sent,
            timeout=240,
        )
        stored, stored_nanos, unique = int(rows[0][0]), int(rows[0][1] or 0), int(rows[0][2])
        charged = self.pipeline.verdict_spend_until(dict(self.per_secret))
        charged_nanos = sum(charged.values())
        print(
            f"\nledger [{fault}]: sent={sent} events / {sent_nanos} nanos; "
            f"charged (verdicts)={charged_nanos} nanos; "
            f"in ClickHouse={stored} events ({unique} unique) / {stored_nanos} nanos; "
            f"difference: {stored - sent} events, {stored_nanos - sent_nanos} nanos in "
            f"ClickHouse, {charged_nanos - sent_nanos} nanos charged"
        )
        assert (stored, unique, stored_nanos) == (sent, sent, sent_nanos), (
            f"stats: {self.pipeline.stats()}\nworker log:\n{self.pipeline.worker.log_tail(60)}"
        )
        assert charged == dict(self.per_secret)

    def changelogs_replicated(self) -> None:
        """The counters' changelogs the worker made have the cluster's three replicas."""
        app_id = self.topics.aggregator_app_id
        names = [f"{app_id}-counter-state-changelog", f"{app_id}-seen-events-changelog"]
        plan, under = asyncio.run(replication_report(self.cluster.bootstrap, names))
        assert plan.replication_factor == 3 and under == [], under


async def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> the node leading it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


@pytest.fixture
def cluster_run(kafka_cluster: Any, tmp_path: Path, clickhouse_dsn: str) -> Any:
    run = ClusterRun(kafka_cluster, tmp_path, clickhouse_dsn, seed=len(str(tmp_path)))
    run.pipeline.worker.start(timeout=180)
    try:
        yield run
    finally:
        run.pipeline.worker.stop()
        kafka_cluster.start()  # every node up again for the next test


def test_a_broker_of_three_killed_and_never_restarted_loses_and_doubles_nothing(
    cluster_run: ClusterRun,
) -> None:
    run = cluster_run
    run.changelogs_replicated()
    # the node leading most of the ledger's partitions: the harshest one to lose
    led = asyncio.run(leaders(run.cluster.bootstrap, run.topics.usage_raw))
    victim = max(set(led.values()), key=lambda node: list(led.values()).count(node))

    async def kill() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(run.cluster.kill_node, victim)

    run.feed(kill)
    assert not run.cluster.node(victim).is_running()  # never restarted
    assert run.pipeline.worker.pid() is not None, run.pipeline.worker.log_tail(60)
    run.ledger(f"broker {victim} of 3 killed -9, never restarted")
    assert not run.cluster.node(victim).is_running()


@pytest.mark.slow
def test_the_ledger_leader_killed_while_the_counting_stage_checkpoints(
    cluster_run: ClusterRun,
) -> None:
    run = cluster_run
    led = asyncio.run(leaders(run.cluster.bootstrap, run.topics.usage_raw))

    async def kill_at_a_checkpoint() -> None:
        # the stage checkpoints every commit interval (1 s) while it folds: the kill lands
        # right after a checkpoint was recorded, while the next one is cut and handed over
        def checkpoints() -> int:
            return int(run.pipeline.stats()["checkpoints"])

        seen = await asyncio.to_thread(checkpoints)
        await asyncio.to_thread(poll, checkpoints, lambda n: n > seen, 30.0, 0.05)
        await asyncio.to_thread(run.cluster.kill_node, led[0])

    run.feed(kill_at_a_checkpoint)
    run.ledger(f"leader of usage.raw[0] (node {led[0]}) killed at a checkpoint")


@pytest.mark.slow
def test_a_rolling_restart_of_all_three_brokers_under_load(cluster_run: ClusterRun) -> None:
    run = cluster_run

    async def roll() -> None:
        for node in (1, 2, 3):
            await asyncio.to_thread(run.cluster.stop_node, node)  # a controlled shutdown
            await asyncio.to_thread(run.cluster.start_node, node)

    run.feed(roll, chunks=4)
    assert len(run.cluster.running()) == 3
    run.ledger("rolling restart of brokers 1, 2, 3")


@pytest.mark.slow
def test_the_controller_quorum_losing_one_voter(cluster_run: ClusterRun) -> None:
    run = cluster_run
    active = run.cluster.quorum_leader()
    assert active is not None

    async def kill_the_controller() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(run.cluster.kill_node, active)

    run.feed(kill_the_controller)
    # the two voters left elected another controller: metadata changes still go through
    assert poll(run.cluster.quorum_leader, lambda n: n not in (None, active), 60) not in (
        None,
        active,
    )
    more = Topics(prefix=f"{run.topics.prefix}after.")
    assert asyncio.run(ensure_topics(run.cluster.bootstrap, more, partitions=2))
    run.ledger(f"active controller (node {active}) killed, 2 of 3 voters left")


@pytest.mark.slow
def test_two_workers_one_killed_the_other_takes_over_then_a_third_joins(
    kafka_cluster: Any, tmp_path: Path, clickhouse_dsn: str
) -> None:
    run = ClusterRun(kafka_cluster, tmp_path, clickhouse_dsn, seed=18)
    first = run.pipeline.worker

    def counting_only(name: str) -> WorkerProcess:
        port = free_port()
        return WorkerProcess(
            run_dir=tmp_path / name / "run",
            env={
                **{k: v for k, v in first.env.items() if k != "CLICKHOUSE_DSN"},
                "SPENDBUS_HOME": str(tmp_path / name),
                "SPENDBUS_WEB_PORT": str(port),
            },
            web_port=port,
            args=("--no-sink",),  # one process owns the embedded store: the first sinks
        )

    second, third = counting_only("second"), counting_only("third")
    first.start(timeout=180)
    second.start(timeout=180)
    try:
        split = poll(
            lambda: (run.pipeline.stats(), second.get("/stats")),
            lambda s: s[0]["assigned_partitions"] == 2 and s[1]["assigned_partitions"] == 2,
            120,
        )
        assert [s["assigned_partitions"] for s in split] == [2, 2], split

        async def kill_then_join() -> None:
            await asyncio.to_thread(
                poll, lambda: second.get("/stats"), lambda s: s.get("events", 0) > 0, 60.0
            )
            await asyncio.to_thread(second.kill)  # -9 mid-stream: its partitions move
            await asyncio.to_thread(
                poll,
                run.pipeline.stats,
                lambda s: s["assigned_partitions"] == 4 and s["serving"],
                120.0,
            )
            await asyncio.to_thread(third.start, 180)

        run.feed(kill_then_join, chunks=4)
        shared = poll(
            lambda: (run.pipeline.stats(), third.get("/stats")),
            lambda s: (
                s[0]["assigned_partitions"] + s[1]["assigned_partitions"] == 4
                and s[1]["assigned_partitions"] > 0
            ),
            120,
        )
        assert shared[0]["assigned_partitions"] + shared[1]["assigned_partitions"] == 4
        run.ledger("2 workers, one killed -9, the other took over, a third joined")
        # every alert of the store's record once on the shared alert topic
        wanted = sorted(r[0] for r in run.pipeline.sql("SELECT alert_id FROM alerts"))
        assert wanted

        def recorded(got: list[str]) -> list[str]:  # forecast alerts are not in the view
            return sorted(i for i in got if not i.startswith("forecast|"))

        sent = poll(lambda: alert_ids(run), lambda got: recorded(got) == wanted, 60)
        assert recorded(sent) == wanted
        assert len(sent) == len(set(sent)), "an alert sent twice"
        done = subprocess.run(
            [sys.executable, "-m", "spendbus", "verify", "--json"],
            env={**os.environ, **first.env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["differences"] == [] and report["charged"] == EVENTS, report
        assert report["verdicts_compared"] > 0 and report["periods_compared"] > 0, report
    finally:
        for worker in (third, second, first):
            worker.stop()


def alert_ids(run: ClusterRun) -> list[str]:
    """The alert_id of every record on the shared alert topic, repeats included."""

    async def read() -> list[str]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=run.cluster.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(run.topics.shared_alerts) or {0}
            consumer.assign([TopicPartition(run.topics.shared_alerts, p) for p in partitions])
            ends = await consumer.end_offsets(list(consumer.assignment()))
            got: list[str] = []

            async def behind() -> bool:
                return any([await consumer.position(tp) < end for tp, end in ends.items()])

            while await behind():
                batch = await consumer.getmany(timeout_ms=2000)
                got += [ALERT.decode(r.value)["alert_id"] for rs in batch.values() for r in rs]
            return got
        finally:
            await consumer.stop()

    return asyncio.run(read())

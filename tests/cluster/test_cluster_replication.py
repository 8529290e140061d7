"""Replication that follows the cluster, on three real local KRaft nodes: every topic of
the contract gets three replicas and min.insync.replicas 2; a topic created below that
(the explicit, logged override) is a problem in `spendbus status` naming the command
that fixes it, and `spendbus topics fix-replication` raises it through the admin API's
partition reassignment while its records stay readable."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from runtime.replication import ReplicationPolicy
from schemas.topics import Topics
from spendbus.stack.topics import FIX_COMMAND, ensure_topics, replication_report
from tests.pipeline_kit import poll

pytestmark = pytest.mark.integration


def spendbus(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


async def _replicas_of(bootstrap: str, name: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([name])
        return sorted(len(p["replicas"]) for p in described["partitions"])
    finally:
        await admin.close()


def replicas_of(bootstrap: str, name: str, partitions: int = 4) -> list[int]:
    """Replicas of each partition, once the node asked knows them all (a new topic's
    metadata reaches the nodes one after another)."""
    return poll(
        lambda: asyncio.run(_replicas_of(bootstrap, name)), lambda r: len(r) == partitions, 30
    )


def test_every_topic_gets_three_replicas_on_three_brokers(kafka_cluster: Any) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    names = [s.name for s in topics.specs(4)]
    created = asyncio.run(ensure_topics(kafka_cluster.bootstrap, topics, 4))
    assert sorted(created) == sorted(names)
    plan, under = asyncio.run(replication_report(kafka_cluster.bootstrap, names))
    assert (plan.brokers, plan.replication_factor, plan.min_insync_replicas) == (3, 3, 2)
    assert under == []
    assert replicas_of(kafka_cluster.bootstrap, topics.usage_raw) == [3, 3, 3, 3]


def test_status_reports_an_under_replicated_ledger_and_fix_replication_raises_it(
    kafka_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    override = ReplicationPolicy(replication_factor=1, allow_under_replication=True)
    with caplog.at_level(logging.WARNING, logger="runtime.replication"):
        asyncio.run(ensure_topics(kafka_cluster.bootstrap, topics, 4, replication=override))
    assert "with 1 replica(s) on a cluster of 3 brokers" in caplog.text
    assert replicas_of(kafka_cluster.bootstrap, topics.usage_raw) == [1, 1, 1, 1]

    async def write_ledger() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_cluster.bootstrap, acks="all", enable_idempotence=True
        )
        await producer.start()
        try:
            for n in range(200):
                await producer.send(topics.usage_raw, f"event-{n}".encode(), key=b"k%d" % (n % 7))
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(write_ledger())
    env = {
        "KAFKA_BOOTSTRAP": kafka_cluster.bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_WEB_PORT": "9",  # no worker: status says so, beside the replication
    }
    before = spendbus(env, "status", "--json", "--timeout", "15")
    assert before.returncode == 0, before.stdout + before.stderr
    report = json.loads(before.stdout)
    below = {u["topic"] for u in report["replication"]["under_replicated"]}
    assert below == {s.name for s in topics.specs(4)}
    ledger_problem = next(p for p in report["problems"] if topics.usage_raw + ":" in p)
    assert "1 replica(s), the cluster allows 3" in ledger_problem
    assert FIX_COMMAND in ledger_problem

    fixed = spendbus(env, "topics", "fix-replication", "--timeout", "240")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"fixed {topics.usage_raw}" in fixed.stdout

    after = json.loads(spendbus(env, "status", "--json", "--timeout", "15").stdout)
    assert after["replication"]["under_replicated"] == []
    assert not [p for p in after["problems"] if FIX_COMMAND in p]
    assert replicas_of(kafka_cluster.bootstrap, topics.usage_raw) == [3, 3, 3, 3]
    again = spendbus(env, "topics", "check")
    assert again.returncode == 0 and "at the plan" in again.stdout, again.stdout + again.stderr

    async def read_ledger() -> list[bytes]:
        consumer = AIOKafkaConsumer(
            topics.usage_raw,
            bootstrap_servers=kafka_cluster.bootstrap,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < 200:
                batch = await consumer.getmany(timeout_ms=5000)
                if not batch:
                    break
                got += [r.value for records in batch.values() for r in records]
            return got
        finally:
            await consumer.stop()

    assert sorted(asyncio.run(read_ledger())) == sorted(f"event-{n}".encode() for n in range(200))


def test_spendbus_up_brokers_three_starts_a_replicated_local_cluster(tmp_path: Any) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path / "home"), "SPENDBUS_TOPIC_PREFIX": "up3."}
    env_clean = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    os_env = {**env_clean, **env}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spendbus", *args],
            env=os_env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    up = run("up", "--brokers", "3", "--no-worker")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        report = json.loads(run("status", "--json", "--timeout", "15").stdout)
        assert [b["node_id"] for b in report["kafka"]["brokers"]] == [1, 2, 3]
        assert report["replication"]["replication_factor"] == 3
        assert report["replication"]["under_replicated"] == []
        # a second `up` with another size is refused, naming what to do
        other = run("up", "--brokers", "2", "--no-worker")
        said = " ".join((other.stdout + other.stderr).split())
        assert other.returncode != 0 and "has 3 brokers, not 2" in said, said
    finally:
        down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not json.loads(run("status", "--json", "--timeout", "3").stdout)["kafka"]["running"]

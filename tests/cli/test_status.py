"""`spendbus status --json` over a real broker and a real worker: consumer lag while the worker
is away and after it caught up, the DLQ count after a bad record, ClickHouse reachable (directly
and through the worker); a broker that refuses or never answers is a clear exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from schemas.codec import USAGE_EVENT
from schemas.topics import Topics, usage_raw_key
from schemas.usage import new_usage_event
from spendbus.commands.status_services import redact
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration

WARM_UP = 10
EVENTS = 40


def run_status(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spendbus", "status", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pipeline_env(pipeline: Pipeline) -> dict[str, str]:
    return {k: v for k, v in pipeline.worker.env.items()}


def status_json(pipeline: Pipeline) -> dict[str, Any]:
    done = run_status(pipeline_env(pipeline), "--json", "--timeout", "15")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]  # json.loads answers Any


def status_until(
    pipeline: Pipeline, done: Callable[[dict[str, Any]], bool], timeout: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    report = status_json(pipeline)
    while not done(report) and time.monotonic() < deadline:
        time.sleep(0.5)
        report = status_json(pipeline)
    return report


def worker_groups(report: dict[str, Any], pipeline: Pipeline) -> list[dict[str, Any]]:
    """The worker's consumer groups (the counting stage's and the sinks'), named by the prefix."""
    return [g for g in report["consumer_groups"] if g["group"].startswith(pipeline.topics.prefix)]


def total_lag(report: dict[str, Any], pipeline: Pipeline) -> int:
    return sum(g["lag"] for g in worker_groups(report, pipeline))


def members(report: dict[str, Any], pipeline: Pipeline) -> list[int]:
    return [g["members"] for g in worker_groups(report, pipeline)]


def lag_of(report: dict[str, Any], pipeline: Pipeline, topic: str) -> int:
    return sum(
        t["lag"]
        for g in worker_groups(report, pipeline)
        for t in g["topics"]
        if t["topic"] == topic
    )


def usage_events(n: int) -> list[bytes]:
    return [
        USAGE_EVENT.encode(
            new_usage_event(
                provider="openai",
                api="openai-chat",
                model="gpt-4o-mini",
                secret_id=f"sk-{i % 3}",
                org_id=f"org-{i % 5}",
                gateway_id="status-test",
                input_tokens=1000 + i,
                output_tokens=100,
            )
        )
        for i in range(n)
    ]


def test_status_shows_lag_drain_dead_letters_and_clickhouse(pipeline: Pipeline) -> None:
    topics = pipeline.topics
    first = usage_events(WARM_UP)
    asyncio.run(
        publish(
            pipeline.bootstrap,
            topics.usage_raw,
            [(usage_raw_key(f"org-{i % 5}"), v) for i, v in enumerate(first)],
        )
    )
    # counted: the group's lag drains to 0 on every topic it reads (raw, priced, verdicts)
    ready = status_until(
        pipeline,
        lambda r: (
            bool(worker_groups(r, pipeline))
            and total_lag(r, pipeline) == 0
            and r["clickhouse"]["usage_events"] == WARM_UP
        ),
    )
    assert ready["kafka"]["reachable"] and ready["kafka"]["brokers"], ready["kafka"]
    assert {t["name"] for t in ready["topics"] if t["exists"]} >= {
        topics.usage_raw,
        topics.budget_verdicts,
        topics.usage_dlq,
    }
    assert ready["worker"]["answering"] and ready["worker"]["serving"]
    assert ready["worker"]["stats"]["charged"] == WARM_UP
    assert total_lag(ready, pipeline) == 0 and all(members(ready, pipeline)), ready
    read = {t["topic"] for g in worker_groups(ready, pipeline) for t in g["topics"]}
    assert read >= {topics.usage_raw, topics.usage_priced}, read
    assert ready["clickhouse"]["via"] == "worker" and ready["clickhouse"]["reachable"] is True

    # the worker away: what is published waits in its group's lag, and status says nobody reads
    pipeline.worker.stop()
    values = usage_events(EVENTS)
    asyncio.run(
        publish(
            pipeline.bootstrap,
            topics.usage_raw,
            [(usage_raw_key(f"org-{i % 5}"), v) for i, v in enumerate(values)],
        )
    )
    away = status_until(pipeline, lambda r: not any(members(r, pipeline)))
    assert lag_of(away, pipeline, topics.usage_raw) == EVENTS, away["consumer_groups"]
    assert not away["worker"]["answering"] and away["worker"]["pid"] is None
    assert any("no member" in p for p in away["problems"]), away["problems"]
    # with nobody holding the embedded store, status opens it itself
    assert away["clickhouse"]["reachable"] is True
    assert away["clickhouse"]["usage_events"] == WARM_UP

    # back: every event counted, the lag drains to 0 again
    pipeline.worker.start(timeout=180)
    total = WARM_UP + EVENTS
    drained = status_until(
        pipeline,
        lambda r: total_lag(r, pipeline) == 0 and r["clickhouse"]["usage_events"] == total,
    )
    print("groups after counting:", json.dumps(worker_groups(drained, pipeline)))
    assert drained["worker"]["stats"]["charged"] == EVENTS
    assert total_lag(drained, pipeline) == 0 and all(members(drained, pipeline)), drained
    assert drained["clickhouse"] == {
        "dsn": redact(pipeline.dsn),
        "reachable": True,
        "usage_events": total,
        "via": "worker",
        "error": None,
    }
    assert drained["verdicts"]["records"] > 0
    assert drained["verdicts"]["age_seconds"] is not None
    assert drained["verdicts"]["age_seconds"] >= 0
    assert drained["dlq"]["letters"] == 0 and drained["problems"] == []

    # a record nobody can read goes to the DLQ, and status counts it
    asyncio.run(publish(pipeline.bootstrap, topics.usage_raw, [(b"org", b"not avro")]))
    lettered = status_until(pipeline, lambda r: r["dlq"]["letters"] == 1)
    assert lettered["dlq"] == {"topic": topics.usage_dlq, "letters": 1}
    assert any("dead letters" in p for p in lettered["problems"]), lettered["problems"]

    # the screen a person reads holds the same facts
    screen = run_status(pipeline_env(pipeline))
    assert screen.returncode == 0, screen.stderr
    assert "consumer groups" in screen.stdout and "dead letters" in screen.stdout
    assert "reachable" in screen.stdout


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never answers (a wedged broker)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("broker", ["refused", "silent"])
def test_unreachable_broker_is_exit_2_with_a_message(
    broker: str, silent_listener: str, tmp_path: Any
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}" if broker == "refused" else silent_listener
    env = {
        "KAFKA_BOOTSTRAP": bootstrap,
        "SPENDBUS_HOME": str(tmp_path),
        "SPENDBUS_WEB_PORT": str(free_port()),
    }
    # the subprocess timeout is the bound: status gives up after --timeout on its own
    done = run_status(env, "--json", "--timeout", "3", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Kafka unreachable" in done.stderr and bootstrap in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["kafka"]["reachable"] is False and report["kafka"]["bootstrap"] == bootstrap
    assert report["consumer_groups"] == [] and report["dlq"] is None

    screen = run_status(env, "--timeout", "3", timeout=60)
    assert screen.returncode == 2
    assert "unreachable" in screen.stdout and "Kafka unreachable" in screen.stderr


async def _after_a_cutover(bootstrap: str, topics: Topics, waiting: int) -> None:
    """What `spendbus replay --cutover` to g2 leaves: the switch (previous retired), g2's
    topics, its group committed to the ledger's end, and the retired default group's
    offsets left where they were, ``waiting`` records short of the end."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from aggregator.replay.generations import publish_switch, switch_to

    g2 = topics.of_generation("g2")
    await ensure_topics(bootstrap, g2, partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in usage_events(waiting):
            await producer.send_and_wait(topics.usage_raw, value, partition=0)
    finally:
        await producer.stop()
    ledger = TopicPartition(topics.usage_raw, 0)
    for group, offset in ((topics.aggregator_app_id, 0), (g2.aggregator_app_id, waiting)):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign([ledger])
            await consumer.commit({ledger: offset})
        finally:
            await consumer.stop()
    await publish_switch(bootstrap, topics, switch_to("g2", "", retired=True))


def test_after_a_cutover_status_follows_the_new_generation(
    kafka_bootstrap: str, unique: str, tmp_path: Any
) -> None:
    """Issue 35: the retired default group's lag is no alarm, and the topics, verdicts and
    groups shown are g2's."""
    topics = Topics(prefix=f"t{unique}.")
    asyncio.run(ensure_topics(kafka_bootstrap, topics, partitions=1))
    asyncio.run(_after_a_cutover(kafka_bootstrap, topics, waiting=3))
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),
        "SPENDBUS_WEB_PORT": str(free_port()),
    }
    done = run_status(env, "--json", "--timeout", "15")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["generation"] == "g2"
    names = {t["name"] for t in report["topics"]}
    g2 = topics.of_generation("g2")
    assert {g2.budget_verdicts, g2.usage_priced} <= names
    assert not {topics.budget_verdicts, topics.usage_priced} & names
    assert report["verdicts"]["topic"] == g2.budget_verdicts
    groups = {g["group"]: g for g in report["consumer_groups"]}
    assert groups[topics.aggregator_app_id]["generation_current"] is False
    assert groups[topics.aggregator_app_id]["lag"] == 3
    assert groups[g2.aggregator_app_id]["generation_current"] is True
    # ... and so is the store (the generation's: docs/replay.md)
    assert report["clickhouse"]["dsn"].endswith("clickhouse-g2")
    # no worker and no store in this test: those problems are true; nothing else is
    true = ("no aggregator worker answers", "ClickHouse unreachable: no embedded store")
    assert [p for p in report["problems"] if not p.startswith(true)] == []
    screen = run_status({**env, "COLUMNS": "200"}, "--timeout", "15")
    assert "generation: g2" in screen.stdout and "(other generation)" in screen.stdout

"""The worker's sink in a process of its own (aggregator/sink/process.py, sink_link.py), on
the real broker and engine: it owns the store (``/sql`` answers through it), is started
again when it dies, and dies or stops with its worker; every event is stored once
throughout (``SPENDBUS_SINK_PROCESS=true``). By default the sink runs in the worker itself."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.sink.process import NICENESS
from schemas.records import UsageEvent
from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline, poll, publish_usage

pytestmark = pytest.mark.integration

#: bounds of the polls below (a restart waits a second, then opens the store again)
DEADLINE_SECONDS = 90.0
STORED = "SELECT count(), uniqExact(event_id) FROM usage_events"


def usage(n: int, start: int) -> list[UsageEvent]:
    return [
        new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id=f"sk-{i % 3}",
            org_id=f"org-{i % 4}",
            gateway_id="sink-process",
            input_tokens=100 + i,
            output_tokens=10,
        )
        for i in range(start, start + n)
    ]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def publish_and_wait(pipeline: Pipeline, events: list[UsageEvent], total: int) -> None:
    asyncio.run(publish_usage(pipeline.bootstrap, pipeline.topics.usage_raw, events))
    rows = pipeline.sql_until(STORED, lambda r: int(r[0][0]) >= total, DEADLINE_SECONDS)
    assert [int(v) for v in rows[0]] == [total, total], pipeline.worker.log_tail(60)


@pytest.fixture
def sinking(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> Iterator[Pipeline]:
    """A worker whose sink runs in a process of its own."""
    pipeline = Pipeline(
        kafka_bootstrap,
        topics,
        tmp_path,
        clickhouse_dsn,
        worker_env={"SPENDBUS_SINK_PROCESS": "true"},
    )
    pipeline.apply_reference()
    pipeline.worker.start(timeout=180)
    try:
        yield pipeline
    finally:
        pipeline.worker.stop()


def test_the_sink_process_owns_the_store_and_is_started_again_when_it_dies(
    sinking: Pipeline,
) -> None:
    pipeline = sinking
    worker = pipeline.worker.pid()
    first = pipeline.stats()["sink_process"]
    assert first["starts"] == 1 and first["pid"] not in (None, worker)
    assert parent_of(first["pid"]) == worker
    assert b"aggregator.sink.process" in Path(f"/proc/{first['pid']}/cmdline").read_bytes()
    # the fold first (niced once its interpreter is up: the pid is known from the spawn on)
    wanted = min(19, niceness(worker) + NICENESS)
    assert poll(lambda: niceness(first["pid"]), lambda n: n == wanted, 30.0, 0.1) == wanted
    publish_and_wait(pipeline, usage(300, 0), 300)

    os.kill(first["pid"], signal.SIGKILL)
    again = poll(
        lambda: pipeline.stats()["sink_process"],
        lambda s: s["starts"] == 2 and s["pid"] is not None,
        DEADLINE_SECONDS,
    )
    assert again["starts"] == 2 and again["pid"] != first["pid"], pipeline.worker.log_tail(40)
    # the new process has the store: what came after is stored, nothing twice
    publish_and_wait(pipeline, usage(300, 300), 600)
    assert pipeline.worker.pid() == worker  # the worker itself went on


def test_the_sink_process_dies_with_its_worker_and_stops_with_it(sinking: Pipeline) -> None:
    pipeline = sinking
    publish_and_wait(pipeline, usage(200, 0), 200)
    killed = pipeline.stats()["sink_process"]["pid"]
    pipeline.worker.kill()
    assert not poll(lambda: alive(killed), lambda up: not up, 10.0, 0.05)

    pipeline.worker.start(timeout=180)  # the store's lock went with the dead sink process
    publish_and_wait(pipeline, usage(200, 200), 400)
    stopped = pipeline.stats()["sink_process"]["pid"]
    pipeline.worker.stop()
    assert not alive(stopped)  # stopped before its worker exited


def test_by_default_the_worker_sinks_itself(pipeline: Pipeline) -> None:
    assert "sink_process" not in pipeline.stats()
    publish_and_wait(pipeline, usage(200, 0), 200)
    # the rows are visible before the insert returns (its materialized views still run)
    stats = pipeline.stats_until(lambda s: s["sink_rows"] >= 200, DEADLINE_SECONDS)
    assert stats["sink_rows"] == 200

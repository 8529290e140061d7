"""verify: recomputing every counter from the ledger equals the live verdicts, and a
verdict that disagrees is reported."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.replay.verify import verify_counters
from runtime.topic_reader import read_latest_values
from schemas.codec import VERDICT
from schemas.ids import counter_key
from spendbus.stack.compacted import publish
from tests.integration.test_thin_slice import make_events, publish_events
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration


def test_recomputed_counters_equal_the_live_verdicts(pipeline: Pipeline, tmp_path: Path) -> None:
    events = make_events(400, seed=11)
    asyncio.run(publish_events(pipeline, tmp_path / "spool", events + events[:10]))
    pipeline.stats_until(lambda stats: stats.get("events", 0) >= len(events) + 10)
    time.sleep(1.0)  # the last batch's verdicts

    pipeline.sql_until(
        "SELECT count() FROM usage_events", lambda rows: int(rows[0][0]) >= len(events)
    )
    report = asyncio.run(
        verify_counters(pipeline.bootstrap, pipeline.topics, history_query=pipeline.sql)
    )
    assert report.records == len(events) + 10
    assert report.stats.charged == len(events) and report.stats.duplicates == 10
    assert report.stats.cost_nanos == sum(pipeline.prices.price_event(e).cost_nanos for e in events)
    assert report.ok, report.differences[:5]
    # every counter's newest period against its verdict, every period against ClickHouse
    assert report.verdicts_compared == report.counters > 0
    counters = {(e["org_id"], e["secret_id"]) for e in events} | {(e["org_id"],) for e in events}
    assert report.periods_compared == len(report.history) >= len(counters)
    # the command says how many it compared (its store: the running worker's /sql page)
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", "verify", "--json"],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": pipeline.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
            "SPENDBUS_HOME": str(tmp_path),
            "CLICKHOUSE_DSN": pipeline.dsn,
            "SPENDBUS_WEB_PORT": str(pipeline.worker.web_port),
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["verdicts_compared"] == report.verdicts_compared
    assert summary["periods_compared"] == report.periods_compared

    # a verdict that lies (a newer seq, the wrong spend) is found
    key = counter_key("per-secret", (events[0]["org_id"], events[0]["secret_id"]))
    live: dict[bytes, Any] = asyncio.run(
        read_latest_values(pipeline.bootstrap, pipeline.topics.budget_verdicts)
    )
    verdict = VERDICT.decode(live[key.encode()])
    forged = {**verdict, "seq": verdict["seq"] + 1, "spent_nanos": verdict["spent_nanos"] + 1}
    asyncio.run(
        publish(
            pipeline.bootstrap,
            pipeline.topics.budget_verdicts,
            [(key.encode(), VERDICT.encode(forged))],
        )
    )
    report = asyncio.run(verify_counters(pipeline.bootstrap, pipeline.topics))
    assert [(d.counter_key, d.field, d.recomputed, d.live) for d in report.differences] == [
        (key, "spent_nanos", verdict["spent_nanos"], verdict["spent_nanos"] + 1)
    ]

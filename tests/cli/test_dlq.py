"""`spendbus dlq`: list the dead letters with their reasons, requeue one after its cause
was fixed, and a letter requeued twice is still charged once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.usage import new_usage_event
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration


def spendbus(pipeline: Pipeline, *args: str) -> str:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": pipeline.bootstrap,
        "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_list_then_requeue_a_fixed_letter_charged_once(pipeline: Pipeline) -> None:
    # one letter the aggregator wrote itself (garbage), one whose cause was since fixed: its
    # value is a good event (as after deploying a schema version the worker did not know)
    asyncio.run(publish(pipeline.bootstrap, pipeline.topics.usage_raw, [(b"acme", b"garbage")]))
    event = new_usage_event(
        provider="openai",
        api="openai-chat",
        model="gpt-4o-mini",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="dlq-test",
        input_tokens=1000,
        output_tokens=100,
    )
    fixed = {
        "reason": "unknown_fingerprint",
        "detail": "written by a newer producer",
        "stage": "aggregator",
        "source_topic": pipeline.topics.usage_raw,
        "source_partition": 0,
        "source_offset": 0,
        "key": b"acme",
        "value": USAGE_EVENT.encode(event),
        "failed_at": datetime.now(UTC),
    }
    asyncio.run(
        publish(
            pipeline.bootstrap, pipeline.topics.usage_dlq, [(b"acme", DEAD_LETTER.encode(fixed))]
        )
    )
    deadline = time.monotonic() + 60
    letters: list[dict[str, Any]] = []
    while len(letters) < 2 and time.monotonic() < deadline:
        letters = json.loads(spendbus(pipeline, "dlq", "list", "--json"))
        time.sleep(0.5)
    assert sorted(letter["reason"] for letter in letters) == ["bad_magic", "unknown_fingerprint"]

    assert "would requeue 1" in spendbus(
        pipeline, "dlq", "requeue", "--reason", "unknown_fingerprint", "--dry-run"
    )
    for _ in range(2):  # requeued twice by mistake: still one charge
        assert "requeued 1" in spendbus(
            pipeline, "dlq", "requeue", "--reason", "unknown_fingerprint"
        )
    expected = pipeline.prices.price_event(event).cost_nanos
    pipeline.stats_until(lambda stats: stats.get("duplicates", 0) >= 1, timeout=60)
    rows = pipeline.sql_until(  # the sink writes within a second
        f"SELECT count(), sum(cost_nanos) FROM usage_events WHERE event_id = '{event['event_id']}'",
        lambda rows: int(rows[0][0]) >= 1,
        timeout=60,
    )
    assert (int(rows[0][0]), int(rows[0][1])) == (1, expected)
    assert pipeline.stats()["duplicates"] == 1

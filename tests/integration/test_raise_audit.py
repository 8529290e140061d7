"""Temporary raises on the real broker, worker and engine (issue 23): the worker counts an
event that occurred under a raise against the raised limit (its verdict in budget_state),
and every raise, revoked or not, is in ClickHouse's budget_raises audit table."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.topics import Topics
from schemas.usage import new_usage_event
from tests.pipeline_kit import Pipeline, publish_usage

pytestmark = pytest.mark.integration

PER_SECRET_LIMIT = 100_000_000  # pipeline_kit's per-secret budget: limit_usd "0.10"


def spendbus(pipeline: Pipeline, home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": pipeline.bootstrap,
            "SPENDBUS_TOPIC_PREFIX": pipeline.topics.prefix,
            "SPENDBUS_HOME": str(home),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_raises_reach_the_verdicts_and_the_audit_table(
    pipeline: Pipeline, topics: Topics, tmp_path: Path
) -> None:
    home = tmp_path / "cli"
    spendbus(
        pipeline, home, "budgets", "raise", "per-secret", "--scope", "acme/sk-1",
        "--by", "0.40", "--until", "1d", "--reason", "quarter close",
    )  # fmt: skip
    spendbus(
        pipeline, home, "budgets", "raise", "per-secret", "--to", "1", "--until", "2h",
        "--reason", "a mistake",
    )  # fmt: skip
    spendbus(pipeline, home, "budgets", "revoke-raise", "per-secret")  # the budget-wide one
    rows = pipeline.sql_until(
        "SELECT budget_id, scope_values, mode, raise_nanos, reason, created_by, "
        "revoked_at IS NOT NULL FROM budget_raises FINAL ORDER BY reason DESC",
        lambda r: len(r) == 2 and bool(r[1][6]),
    )
    assert [(*r[:5], bool(r[6])) for r in rows] == [
        ("per-secret", ["acme", "sk-1"], "by", 400_000_000, "quarter close", False),
        ("per-secret", [], "to", 1_000_000_000, "a mistake", True),
    ]
    assert all(r[5] for r in rows)  # who raised it

    # an event under the raise: its verdict carries the raised limit; another secret's not
    now = datetime.now(UTC)
    events = [
        new_usage_event(
            event_id=f"raised-{secret}",
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=secret,
            org_id="acme",
            gateway_id="it",
            input_tokens=1_000,
            output_tokens=100,
            occurred_at=now,
        )
        for secret in ("sk-1", "sk-2")
    ]
    asyncio.run(publish_usage(pipeline.bootstrap, topics.usage_raw, events))
    limits = pipeline.sql_until(
        "SELECT scope_values[2], limit_nanos FROM budget_state FINAL "
        "WHERE budget_id = 'per-secret' ORDER BY scope_values[2]",
        lambda r: len(r) == 2,
    )
    assert [tuple(r) for r in limits] == [
        ("sk-1", PER_SECRET_LIMIT + 400_000_000),
        ("sk-2", PER_SECRET_LIMIT),
    ]

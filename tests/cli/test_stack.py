"""The command line over a real stack: up, apply, list, usage, sql (through the worker and
directly on the store), status, down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from schemas.pricing import default_price_file
from spendbus.stack.broker_probe import free_port
from tests.pipeline_kit import poll

pytestmark = pytest.mark.integration

BUDGETS = """
- id: acme-monthly
  scope: org
  match: {org_id: acme}
  window: month
  limit_usd: "500"
"""
UNPRICED = """
- id: mystery
  scope: org
  match: {model: mystery-model-9}
  window: month
  limit_usd: "5"
"""
EVENTS = [
    {
        "event_id": f"cli-{i}",
        # now: `spendbus usage` shows the current month's counters
        "occurred_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provider": "anthropic",
        "api": "anthropic-messages",
        "model": "claude-sonnet-4-5",
        "secret_id": "sk-1",
        "org_id": "acme",
        "gateway_id": "cli-test",
        "input_tokens": 1000,
        "output_tokens": 100,
    }
    for i in range(20)
]
# 1000 input x $3/M + 100 output x $15/M = 4_500_000 nanos each


def spendbus(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"spendbus {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


def worker_stats(env: dict[str, str]) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(spendbus(env, "status", "--json").stdout)["worker"]["stats"]
    return stats


def test_the_local_stack_from_the_command_line(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_HOME": str(tmp_path / "home"),
        "SPENDBUS_TOPIC_PREFIX": f"cli{unique}.",
        "SPENDBUS_WEB_PORT": str(free_port()),
    }
    spendbus(env, "up")
    try:
        status = json.loads(spendbus(env, "status", "--json").stdout)
        assert status["worker"]["pid"] and status["worker"]["stats"]["serving"]
        (tmp_path / "budgets.yaml").write_text(BUDGETS)
        # no file: the prices shipped with the package (a wheel's user has no checkout)
        applied = spendbus(env, "prices", "apply").stdout
        assert str(default_price_file()) in applied and "price version(s)" in applied
        spendbus(env, "budgets", "apply", str(tmp_path / "budgets.yaml"))
        listed = json.loads(spendbus(env, "budgets", "list", "--json").stdout)
        assert [b["budget_id"] for b in listed] == ["acme-monthly"]

        # a USD limit over a model without a price is applied, with a warning
        (tmp_path / "unpriced.yaml").write_text(UNPRICED)
        warned = spendbus(env, "budgets", "apply", str(tmp_path / "unpriced.yaml"))
        assert "mystery-model-9" in warned.stdout and "warning" in warned.stdout
        spendbus(env, "budgets", "delete", "mystery")

        # a budget file with an error names the file, the budget and the field, and applies nothing
        (tmp_path / "bad.yaml").write_text(BUDGETS.replace("window: month", "window: fortnight"))
        bad = spendbus(env, "budgets", "apply", str(tmp_path / "bad.yaml"), check=False)
        assert bad.returncode != 0
        assert "bad.yaml" in bad.stdout + bad.stderr and "window" in bad.stdout + bad.stderr

        # the worker reads budgets live: an event counted before it has read the budget
        # never counts towards it, so wait until it holds exactly acme-monthly (the policy
        # topic has one partition: "one budget" is acme-monthly, before or after mystery)
        assert poll(lambda: worker_stats(env)["budgets"], lambda n: n == 1, 90, 0.5) == 1
        (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
        spendbus(env, "ingest", str(tmp_path / "events.jsonl"))

        def stored() -> tuple[int, int]:
            sql = "SELECT count() AS n, sum(cost_nanos) AS nanos FROM usage_events"
            row = json.loads(spendbus(env, "sql", "--json", sql).stdout)[0]
            return int(row["n"]), int(row["nanos"])

        assert poll(stored, lambda got: got[0] >= len(EVENTS), 90, 0.5) == (20, 20 * 4_500_000)

        # verdicts may go out a moment after the store has the rows: the enforcer's numbers
        # converge on the same sum
        def budget_usage() -> list[tuple[str, int]]:
            out = spendbus(env, "usage", "--org-id", "acme", "--secret-id", "sk-1", "--json")
            return [(u["budget_id"], u["spent_nanos"]) for u in json.loads(out.stdout)]

        expected = [("acme-monthly", 20 * 4_500_000)]
        assert poll(budget_usage, lambda usage: usage == expected, 90, 0.5) == expected

        # `up` made the worker's web token (private); `sql` sends it, and the worker's
        # /sql refuses what is not a plain query, naming why
        token_file = tmp_path / "home" / "web.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        refused = spendbus(env, "sql", "DROP TABLE usage_events", check=False)
        assert refused.returncode != 0
        assert "DROP statements are refused" in refused.stdout + refused.stderr
        assert token not in refused.stdout + refused.stderr
        assert stored() == (20, 20 * 4_500_000)
        token_file.write_text("not-the-token\n")  # what a stale or foreign token gets
        token_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
        unauthorized = spendbus(env, "sql", "SELECT 1", check=False)
        assert unauthorized.returncode != 0
        assert "bearer token" in unauthorized.stdout + unauthorized.stderr
        report = json.loads(spendbus(env, "status", "--json").stdout)
        assert report["clickhouse"]["reachable"] is None
        assert "refused the web token" in report["clickhouse"]["error"]
        assert any("ClickHouse not checked" in p for p in report["problems"])
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)  # a secret: private (runtime/private_files.py)
    finally:
        spendbus(env, "down")
    # nothing runs now: sql opens the embedded store itself
    out = spendbus(env, "sql", "--json", "SELECT count() AS n FROM usage_events")
    assert int(json.loads(out.stdout)[0]["n"]) == 20
    assert json.loads(spendbus(env, "status", "--json").stdout)["worker"]["pid"] is None

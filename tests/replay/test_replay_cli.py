"""`spendbus snapshot` and `spendbus replay --dry-run` from the command line (real Kafka)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pipeline_kit import Pipeline
from replay_kit import make_events, publish

from schemas.topics import Topics
from spendbus.cli import cli

pytestmark = pytest.mark.integration


def _run(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_snapshot_then_dry_runs_from_zero_and_from_the_snapshot_agree(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    Pipeline(kafka_bootstrap, topics, tmp_path, f"chdb://{tmp_path / 'unused'}").apply_reference()
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path),
    }
    events = make_events(300, seed=8)
    asyncio.run(publish(kafka_bootstrap, topics.usage_raw, events[:200]))
    code, out, _ = _run(env, "snapshot", "--json")
    assert code == 0
    made = json.loads(out)
    assert sum(int(v) for v in made["fences"].values()) == 200 and made["counters"] > 0

    asyncio.run(publish(kafka_bootstrap, topics.usage_raw, events[200:] + events[:10]))
    code, out, _ = _run(env, "replay", "--dry-run", "--json")
    assert code == 0
    full = json.loads(out)
    assert (full["records"], full["charged"], full["duplicates"]) == (310, 300, 10)
    code, out, _ = _run(env, "replay", "--dry-run", "--from-snapshot", "--json")
    assert code == 0
    resumed = json.loads(out)
    assert resumed["counters_sha256"] == full["counters_sha256"]
    assert resumed["charged"] == 300 and resumed["cost_nanos"] == full["cost_nanos"]
    # no worker ran: every counter is missing from the current generation's verdicts
    assert {d["field"] for d in full["vs_previous"]} == {"counter"}

    code, out, _ = _run(env, "replay", "--dry-run", "--json", "--since", "2026-11-02T10:00:00Z")
    assert code == 0 and 0 < json.loads(out)["charged"] < 300


def test_bad_replay_options_are_refused_with_the_reason(tmp_path: Path) -> None:
    env = {"KAFKA_BOOTSTRAP": "127.0.0.1:9", "SPENDBUS_HOME": str(tmp_path)}
    runner = CliRunner()
    result = runner.invoke(cli, ["replay", "--since", "2026-11-01T00:00:00Z"], env=env)
    assert result.exit_code == 2 and "use them with --dry-run" in result.output
    result = runner.invoke(cli, ["replay", "--dry-run", "--since", "2026-11-01"], env=env)
    assert result.exit_code == 2 and "give a time zone" in result.output
    result = runner.invoke(cli, ["replay", "--dry-run", "--cutover"], env=env)
    assert result.exit_code == 2 and "--cutover needs a real generation" in result.output
    result = runner.invoke(cli, ["replay", "--generation", "G-2"], env=env)
    assert result.exit_code != 0
    assert "lower-case letters and digits" in str(result.exception or result.output)

"""`spendbus snapshot` and `spendbus replay --dry-run` from the command line (real Kafka)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.stack.worker import WorkerProcess
from tests.pipeline_kit import Pipeline
from tests.pipeline_kit import publish_usage as publish
from tests.replay.kit import make_events

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


def test_replay_with_cutover_from_the_command_line_on_the_local_stack(
    pipeline: Pipeline, request: pytest.FixtureRequest
) -> None:
    """The stack's worker is the serving slot: the command retires it and restarts it on g2."""
    from aggregator.replay.generations import read_switch
    from tests.replay.kit import publish_events

    publish_events(pipeline, make_events(200, seed=12))
    env = dict(pipeline.worker.env)
    # first without --cutover: g2 is built and keeps running beside the default generation
    replay_worker = WorkerProcess(
        run_dir=pipeline.worker.run_dir, env={}, web_port=0, name="aggregator-g2"
    )
    request.addfinalizer(replay_worker.stop)
    result = CliRunner().invoke(cli, ["replay", "--generation", "g2"], env=env)
    assert result.exit_code == 0, result.output
    assert "spendbus replay --generation g2 --cutover" in " ".join(result.stderr.split())
    assert "vs generation (default): no differences" in result.stdout
    # then cut over: the command attaches to the running g2 worker
    result = CliRunner().invoke(
        cli, ["replay", "--generation", "g2", "--cutover"], env=env, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "vs the ledger (in memory): no differences" in result.stdout
    assert "vs its ClickHouse rows: no differences" in result.stdout
    assert "vs generation (default): no differences" in result.stdout
    assert "cut over to generation g2" in result.stdout
    switch = asyncio.run(read_switch(pipeline.bootstrap, pipeline.topics))
    assert switch is not None and (switch.generation, switch.previous_retired) == ("g2", True)
    # the serving slot runs again, now on g2's store: analysts' SQL sees every event
    rows = pipeline.sql_until("SELECT count() FROM usage_events", lambda r: r[0][0] >= 200)
    assert rows[0][0] == 200
    assert pipeline.stats().get("serving")
    # ... and it is g2's group that reads new events; the retired default group is left behind
    from aggregator.replay.generations import group_progress
    from aggregator.replay.snapshots import ledger_ends

    publish_events(pipeline, make_events(10, seed=12, start=200))
    ends = asyncio.run(ledger_ends(pipeline.bootstrap, pipeline.topics))
    g2 = pipeline.topics.of_generation("g2")
    deadline = time.monotonic() + 60
    while not asyncio.run(group_progress(pipeline.bootstrap, g2)).past(ends):
        assert time.monotonic() < deadline, pipeline.worker.log_tail()
        time.sleep(0.5)
    assert asyncio.run(group_progress(pipeline.bootstrap, pipeline.topics)).committed == 200

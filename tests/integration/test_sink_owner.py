"""An embedded store takes one sinking worker: a second worker that would sink into an
embedded store of its own (half the partitions' rows in each store) refuses to start,
saying what to pick; the first keeps every partition and every row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spendbus.stack.broker_probe import free_port
from tests.pipeline_kit import Pipeline, poll

pytestmark = pytest.mark.integration


def test_a_second_embedded_sink_in_the_group_is_refused(pipeline: Pipeline, tmp_path: Path) -> None:
    # the first worker's sink stage has joined its group
    poll(pipeline.stats, lambda s: s["serving"], 120)
    env = {
        **os.environ,
        **pipeline.worker.env,
        "SPENDBUS_HOME": str(tmp_path / "second"),
        "CLICKHOUSE_DSN": f"chdb://{tmp_path / 'second' / 'clickhouse'}",
        "SPENDBUS_WEB_PORT": str(free_port()),
    }
    refused = subprocess.run(
        [sys.executable, "-m", "spendbus", "aggregator", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0, said
    assert "already writes usage.priced to ClickHouse" in said, said
    assert "--no-sink" in said and "CLICKHOUSE_DSN=https://" in said, said
    assert not (tmp_path / "second" / "clickhouse").exists()  # nothing opened
    assert pipeline.stats()["assigned_partitions"] == 4

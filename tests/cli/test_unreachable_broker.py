"""A command whose broker does not answer ends with one line saying so, never a traceback
(issue 35, item 1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the probe goes


def test_a_command_with_no_broker_fails_in_one_line(tmp_path: Path) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("- {id: b, scope: org, window: day, limit_usd: '1'}\n")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{_closed_port()}",
        "SPENDBUS_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "spendbus", "budgets", "apply", str(budgets)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    said = done.stdout + done.stderr
    assert "Traceback" not in said, said
    # the error (rich wraps it to the terminal's width) names the setting and what to do
    error = " ".join(said[said.index("error: no Kafka broker answers") :].split())
    assert "127.0.0.1" in error and "check KAFKA_BOOTSTRAP" in error and "spendbus up" in error

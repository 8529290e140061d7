"""Every bench of bench/run_all.py at a tiny size, as a subprocess (issue 34: "every bench
runs in CI at a tiny size so none can rot"): it exits 0 and prints one JSON object holding
the headline keys `make bench` reads (run_all.HEADLINES). A smoke test: no figure is
checked, only that the bench runs and reports.

The benches on Kafka get the session's broker (KAFKA_BOOTSTRAP: they start none of their
own); each writes its files (a chart, a copy of its JSON) into the test's folder, never
bench/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.run_all import BENCHES, HEADLINES, dig

ROOT = Path(__file__).resolve().parents[2]

#: each bench's options for a tiny run (``{tmp}``: the test's folder)
TINY: dict[str, list[str]] = {
    "taps": [
        *("--repeats", "1", "--relay-rounds", "2", "--relay-streams", "1"),
        *("--round-chunks", "20", "--tokens", "20", "--pace-ms", "0.1"),
    ],
    "publisher": ["--events", "2000", "--runs", "1"],
    "sink": ["--batch", "200", "--batches", "1", "--runs", "1"],
    # the sink in its own process only: the headlines read that placement
    "burst": ["--events", "5000", "--rate", "200", "--seconds", "1", "--sink", "process"],
    "insert_formats": ["--batch", "200", "--batches", "2", "--rounds", "1"],
    "enforcer": [
        *("--checks", "2000", "--seconds", "0.5", "--max-requests", "500"),
        *("--connections", "2", "--rounds", "1"),
    ],
    # enough events that the fold spans more than one of the bench's 50 ms samples
    "pipeline": ["--workers", "1", "--events", "20000", "--rate", "200", "--seconds", "1"],
    "fold": ["--events", "2000", "--rounds", "1"],
    "verdict_encode": ["--encodes", "200", "--rounds", "1"],
    "gateway": [
        *("--concurrency", "4", "--requests", "8", "--rounds", "1", "--output-tokens", "10"),
        *("--chunk-latency-ms", "5", "--no-burst", "--out", "{tmp}/gateway.json"),
    ],
    "replay": [
        *("--events", "500", "--worker-events", "10000"),
        *("--repeats", "1", "--worker-repeats", "1"),
    ],
    "overshoot": [
        *("--clients", "6", "--replicas", "2", "--cap-usd", "0.15", "--max-seconds", "30"),
        *("--stop-after-refusals", "4", "--quiet-s", "1", "--latency-ms", "20"),
        *("--chunk-latency-ms", "0.5", "--flush-interval-s", "0.5"),
        *("--no-unshared-comparison", "--phases", "ours,baseline"),
        *("--chart", "{tmp}/overshoot.png", "--out", "{tmp}/overshoot.json"),
    ],
    "cli": ["--rounds", "1"],
    "admin": [
        "--events",
        "2000",
        "--budgets",
        "2",
        "--counters-per-budget",
        "3",
        "--requests",
        "3",
        "--report-requests",
        "1",
    ],
    "console": [
        "--events",
        "2000",
        "--budgets",
        "2",
        "--counters-per-budget",
        "3",
        "--requests",
        "2",
    ],
    "budget_history": [
        *("--events", "2000", "--budgets", "2", "--counts-per-event", "2", "--requests", "1"),
    ],
}
#: the benches that need a Kafka broker
ON_KAFKA = {"admin", "console", "publisher", "burst", "pipeline", "gateway", "replay", "overshoot"}


def run_tiny(name: str, tmp: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run bench ``name`` at its tiny size; its one JSON object, checked for the headlines."""
    args = [a.replace("{tmp}", str(tmp)) for a in TINY[name]]
    inherited = os.environ.get("PYTHONPATH")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"bench_{name}.py"), *args],
        cwd=ROOT,
        env={
            **os.environ,
            # this checkout's code, as `make bench` runs it from the checkout
            "PYTHONPATH": os.pathsep.join([str(ROOT), *([inherited] if inherited else [])]),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only: a tiny run takes well under a minute
    )
    assert done.returncode == 0, f"bench {name} failed:\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"bench {name} printed {len(lines)} lines:\n{done.stdout[-2000:]}"
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    missing = [path for bench, path, _ in HEADLINES if bench == name and dig(report, path) == "-"]
    assert not missing, f"bench {name}: headline keys missing from its JSON: {missing}"
    return report


def test_every_bench_of_make_bench_has_a_tiny_size() -> None:
    assert set(TINY) == set(BENCHES)
    assert set(BENCHES) >= ON_KAFKA


@pytest.mark.parametrize("name", sorted(set(TINY) - ON_KAFKA))
def test_a_bench_without_kafka_runs_tiny_and_reports(name: str, tmp_path: Path) -> None:
    run_tiny(name, tmp_path)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(ON_KAFKA))
def test_a_bench_on_kafka_runs_tiny_and_reports(
    name: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    run_tiny(name, tmp_path, {"KAFKA_BOOTSTRAP": kafka_bootstrap})

"""bench/compare.py (`make bench-compare`) at its smallest, against HEAD itself: the base
worktree is made and removed again, the fold and the pipeline benches run on both trees,
and the one JSON object holds each tree's medians and their ratios. No figure is checked.

The build is left out (``--no-build``: both trees run as they are, which is what this test
can afford; `make bench-compare` builds them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import COMPARE_DIR, PIPELINE_FIGURES

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_compare_against_head_reports_both_trees_and_removes_its_worktree(
    kafka_bootstrap: str,
) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    inherited = os.environ.get("PYTHONPATH")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "compare.py"),
            *("--base", "HEAD", "--no-build", "--remove"),
            *("--fold-events", "2000", "--fold-rounds", "1"),
            *("--pipeline-events", "20000", "--pipeline-rounds", "1"),
            *("--rate", "200", "--seconds", "1"),
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP": kafka_bootstrap,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *([inherited] if inherited else [])]),
        },
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout[-2000:]
    report = json.loads(lines[0])

    assert report["base"]["commit"] == report["current"]["commit"] == head
    assert report["groups_built"] is None
    assert not (COMPARE_DIR / head).exists()  # --remove
    fold = report["fold"]
    assert len(fold["current_runs"]) == len(fold["base_runs"]) == 1
    assert {"current_median", "base_median", "ratio_current_to_base"} <= set(fold)
    pipeline = report["pipeline"]
    names = {name for name, _ in PIPELINE_FIGURES} | {"aggregator_over_raw_relay"}
    for tree in ("current", "base"):
        assert names <= set(pipeline[tree])
        assert len(pipeline["runs"][tree]) == 1
    assert names <= set(pipeline["ratio_current_to_base"])

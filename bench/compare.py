"""`make bench-compare BASE=<ref>`: this tree's counting stage beside another commit's.

Issue 34: one command for the side-by-side runs the fold's records were made by hand with.

1. The base tree: ``git worktree add --detach`` of ``<ref>`` into
   ``build/bench-compare/<commit>`` (reused by the next run at the same commit;
   ``--remove`` removes it afterwards).
2. Both trees' compiled extensions for the aggregator and schemas groups, each tree with
   its own setup.py (``SPENDBUS_NATIVE_GROUPS=aggregator,schemas setup.py build_ext
   --inplace``, as ``make native`` builds one group); ``--no-build`` runs them as they are.
3. The fold alone: ``bench/bench_fold.py --baseline <base>``, which alternates its
   rounds between the trees (CPU µs an event: lower is better).
4. The pipeline: ``bench/bench_pipeline.py --workers 1`` alternated between the trees
   (``SPENDBUS_BENCH_ROOT``: the worker runs that tree's code, the harness is this one's),
   which tree goes first swapping every round, all on one broker (KAFKA_BOOTSTRAP, else a
   local one started for the run): the counting stage's events/s beside the raw relay of
   the same run (consume + two writes an event, the Kafka clients' share), its events per
   CPU-second, and the verdict latency at a fixed rate.

Prints one JSON object: each tree's medians, and ``ratio_current_to_base`` for each
(above 1 for events/s is faster, for µs or ms it is slower); progress goes to stderr.

    .venv/bin/python bench/compare.py --base <ref> [--fold-rounds 7] [--pipeline-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parents[1]
COMPARE_DIR = ROOT / "build" / "bench-compare"
#: the compiled groups both trees are built with (pyproject [tool.spendbus.compiled])
GROUPS = ("aggregator", "schemas")
#: (name in the report, dotted path in bench_pipeline's JSON)
PIPELINE_FIGURES = (
    ("aggregator_events_per_s", "throughput.aggregator_events_per_s"),
    ("raw_relay_events_per_s", "throughput.raw_relay_two_writes_events_per_s"),
    ("raw_consume_events_per_s", "throughput.raw_consume_events_per_s"),
    ("aggregator_events_per_cpu_s", "throughput.aggregator_events_per_cpu_s"),
    ("verdict_latency_p50_ms", "latency.verdict_latency_ms.p50"),
    ("verdict_latency_p99_ms", "latency.verdict_latency_ms.p99"),
    ("kafka_floor_p99_ms", "latency.kafka_floor_ms.p99"),
)

console = Console(stderr=True)


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def base_tree(commit: str) -> Path:
    """The base checkout at ``commit`` under build/bench-compare/, reused when it is there."""
    path = COMPARE_DIR / commit
    git("worktree", "prune")
    if path.exists():
        if (path / ".git").exists() and git("rev-parse", "HEAD", cwd=path) == commit:
            return path
        remove_tree(path)
    COMPARE_DIR.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(path), commit)
    return path


def remove_tree(path: Path) -> None:
    if (path / ".git").exists():
        git("worktree", "remove", "--force", str(path))
    shutil.rmtree(path, ignore_errors=True)
    git("worktree", "prune")


def build(tree: Path) -> None:
    """``tree``'s extensions of GROUPS, built in place by its own setup.py."""
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        env={**os.environ, "SPENDBUS_NATIVE_GROUPS": ",".join(GROUPS)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"building {tree} failed:\n{done.stderr[-3000:]}")
    # as `make native`: an extension whose C did not change is copied with its old time,
    # and the test session refuses an extension older than its source
    now = time.time()
    for group in GROUPS:
        for extension in tree.glob(f"{group}/**/*.cpython-*.so"):
            os.utime(extension, (now, now))


def run_json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a bench of this tree; the one JSON object it printed."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def dig(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


@contextmanager
def kafka() -> Iterator[str]:
    """KAFKA_BOOTSTRAP, else a local broker for the run."""
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP"):
        yield bootstrap
        return
    sys.path.insert(0, str(ROOT))
    from spendbus.stack.broker_jars import ensure_broker_jars
    from spendbus.stack.kafka import LocalKafka

    ensure_broker_jars()
    with tempfile.TemporaryDirectory(prefix="bench-compare-kafka-") as tmp:
        broker = LocalKafka(data_dir=Path(tmp), port=0)
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


def pipeline_figures(report: dict[str, Any]) -> dict[str, float]:
    figures = {name: float(dig(report, path)) for name, path in PIPELINE_FIGURES}
    # the counting stage against the raw relay of the same run
    figures["aggregator_over_raw_relay"] = round(
        figures["aggregator_events_per_s"] / figures["raw_relay_events_per_s"], 4
    )
    figures["load_avg_1m"] = float(report["load_avg_1m"])
    return figures


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(r[name] for r in runs), 4) for name in runs[0]}


def ratios(current: dict[str, float], base: dict[str, float]) -> dict[str, float | None]:
    return {
        name: round(current[name] / base[name], 3) if base[name] else None
        for name in current
        if name != "load_avg_1m"
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (any ref)")
    parser.add_argument("--fold-events", type=int, default=60_000)
    parser.add_argument("--fold-rounds", type=int, default=7, help="rounds of each tree")
    parser.add_argument("--pipeline-events", type=int, default=50_000)
    parser.add_argument("--pipeline-rounds", type=int, default=3, help="runs of each tree")
    parser.add_argument("--rate", type=int, default=2_000, help="events/s of the latency part")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the latency part")
    parser.add_argument("--only", choices=("fold", "pipeline"), help="one of the two benches")
    parser.add_argument(
        "--build",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build both trees' extensions (aggregator, schemas) first",
    )
    parser.add_argument("--remove", action="store_true", help="remove the base worktree afterwards")
    args = parser.parse_args()

    commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    result: dict[str, Any] = {
        "bench": "compare",
        "current": {
            "commit": git("rev-parse", "HEAD"),
            # uncommitted changes of the tracked files are measured too
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        },
        "base": {"ref": args.base, "commit": commit},
        "groups_built": list(GROUPS) if args.build else None,
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }
    steps = (
        (2 if args.build else 0)
        + (args.only != "pipeline")
        + (2 * args.pipeline_rounds if args.only != "fold" else 0)
    )
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(f"base tree {commit[:12]}", total=steps + 1)
        base = base_tree(commit)
        progress.advance(task)
        result["base"]["root"] = str(base.relative_to(ROOT))
        try:
            if args.build:
                for name, tree in (("current", ROOT), ("base", base)):
                    progress.update(task, description=f"building the {name} tree's extensions")
                    build(tree)
                    progress.advance(task)
            if args.only != "pipeline":
                progress.update(task, description="the fold, rounds alternated")
                fold = run_json(
                    [
                        str(ROOT / "bench" / "bench_fold.py"),
                        *("--events", str(args.fold_events), "--rounds", str(args.fold_rounds)),
                        *("--baseline", str(base)),
                    ],
                    {},
                )
                progress.advance(task)
                result["fold"] = {
                    "events": args.fold_events,
                    "rounds": args.fold_rounds,
                    "unit": "CPU µs an event (lower is better)",
                    "current_median": fold["median_cpu_us_per_event"],
                    "base_median": fold["baseline_median_cpu_us_per_event"],
                    "ratio_current_to_base": fold["ratio_medians_this_to_baseline"],
                    "current_runs": fold["cpu_us_per_event"],
                    "base_runs": fold["baseline_cpu_us_per_event"],
                }
            if args.only != "fold":
                result["pipeline"] = compare_pipeline(args, base, progress, task)
        finally:
            if args.remove:
                remove_tree(base)
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


def compare_pipeline(
    args: argparse.Namespace, base: Path, progress: Progress, task: Any
) -> dict[str, Any]:
    trees = {"current": ROOT, "base": base}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    bench = [
        str(ROOT / "bench" / "bench_pipeline.py"),
        *("--workers", "1", "--events", str(args.pipeline_events)),
        *("--rate", str(args.rate), "--seconds", str(args.seconds)),
    ]
    with kafka() as bootstrap:
        for n in range(args.pipeline_rounds):
            order = ("current", "base") if n % 2 == 0 else ("base", "current")
            for name in order:
                progress.update(
                    task, description=f"the pipeline, round {n + 1}: the {name} tree's worker"
                )
                # both trees' workers run through SPENDBUS_BENCH_ROOT, started alike
                env = {"KAFKA_BOOTSTRAP": bootstrap, "SPENDBUS_BENCH_ROOT": str(trees[name])}
                runs[name].append(pipeline_figures(run_json(bench, env)))
                progress.advance(task)
    current, base_medians = medians(runs["current"]), medians(runs["base"])
    return {
        "workers": 1,
        "events": args.pipeline_events,
        "rate_events_per_s": args.rate,
        "seconds": args.seconds,
        "rounds": args.pipeline_rounds,
        "current": current,
        "base": base_medians,
        "ratio_current_to_base": ratios(current, base_medians),
        "runs": runs,
    }


if __name__ == "__main__":
    main()

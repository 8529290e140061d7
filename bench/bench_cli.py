"""Benchmark of the command line's start: prints one JSON object.

The wall time of `spendbus --help` and of `spendbus price` (one call) beside a bare
interpreter start (`python -c pass`), each run as a fresh process, the three alternated
in a rotating order round after round so that load on a shared machine falls on all
alike; medians and each command's ratio to the bare start. ``--baseline CHECKOUT`` runs
the same two commands from another checkout's code too (run in its root, which is first on
``PYTHONPATH``), alternated with the others, and reports the ratio of this tree's medians
to the baseline's.

    .venv/bin/python bench/bench_cli.py [--rounds 21] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: the call `price` prices: a model of the shipped price file, tokens both ways
PRICE_ARGS = ["price", "--model", "claude-sonnet-4-5", "--input-tokens", "1000"]
PRICE_ARGS += ["--output-tokens", "200"]
#: what each timed command runs after the interpreter
COMMANDS: dict[str, list[str]] = {
    "bare": ["-c", "pass"],
    "help": ["-m", "spendbus", "--help"],
    "price": ["-m", "spendbus", *PRICE_ARGS],
}


def env_for(root: Path) -> dict[str, str]:
    """The environment that runs ``root``'s code: its root first on PYTHONPATH."""
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(root), *([inherited] if inherited else [])])
    return {**os.environ, "PYTHONPATH": path}


def timed(argv: list[str], root: Path, env: dict[str, str]) -> float:
    """Seconds from starting ``python ARGV`` in ``root`` to its exit; a failed run stops
    the bench. (``-m`` puts the working folder first on the path: the tree's own.)"""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_cli: `python {' '.join(argv)}` failed:\n{done.stderr[-2000:]}")
    if argv[-len(PRICE_ARGS) :] == PRICE_ARGS:
        json.loads(done.stdout)  # the call was priced, not merely started
    return elapsed


def summary(runs: list[float], bare: float) -> dict[str, Any]:
    median = statistics.median(runs)
    return {
        "median_s": round(median, 4),
        "ratio_to_bare": round(median / bare, 2),
        "runs_s": [round(r, 4) for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="runs of each command")
    parser.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    trees = {"current": ROOT}
    if args.baseline is not None:
        if not (args.baseline / "spendbus" / "cli.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a spendbus checkout")
        trees["baseline"] = args.baseline.resolve()
    # every (tree, command) pair; the bare start needs no tree's code
    cases = [("current", "bare")] + [(t, c) for t in trees for c in ("help", "price")]
    envs = {tree: env_for(root) for tree, root in trees.items()}
    load_start = os.getloadavg()[0]
    for tree, command in cases:  # one untimed run each: the OS's file cache warmed alike
        timed(COMMANDS[command], trees[tree], envs[tree])
    runs: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for round_no in range(args.rounds):
        shift = round_no % len(cases)
        for tree, command in cases[shift:] + cases[:shift]:
            runs[tree, command].append(timed(COMMANDS[command], trees[tree], envs[tree]))
    bare = statistics.median(runs["current", "bare"])
    report: dict[str, Any] = {
        "bench": "cli",
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "python": sys.version.split()[0],
        "bare_python": summary(runs["current", "bare"], bare),
        "commands": {c: summary(runs["current", c], bare) for c in ("help", "price")},
    }
    if "baseline" in trees:
        baseline = {c: summary(runs["baseline", c], bare) for c in ("help", "price")}
        report["baseline"] = {"root": str(trees["baseline"]), "commands": baseline}
        report["ratio_current_to_baseline"] = {
            c: round(report["commands"][c]["median_s"] / baseline[c]["median_s"], 3)
            for c in ("help", "price")
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""The fold's CPU instructions per event, counted by valgrind's callgrind: prints one JSON object.

Time on a shared machine moves by more than a small change to the fold does; instructions
barely move. ``bench_fold.py --one`` folds benchkit's ledger in batches of 5,000, and
callgrind counts only inside ``BatchProcessor.process`` (the compiled method's entry,
``--toggle-collect``), so the setup, the imports and the interpreter's start are left out.
``--baseline CHECKOUT`` counts another checkout's fold the same way (its own compiled
extensions, e.g. ``build/bench-compare/<commit>`` that ``bench/compare.py`` builds); runs
alternate between the trees and each tree's median is reported with their ratio. Needs
valgrind (Debian's ``valgrind`` package) and compiled trees (``make native``).

    .venv/bin/python bench/fold_instructions.py [--events 10000] [--runs 3] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: mypyc's entry of the compiled method: instructions are counted while it runs
ENTRY = "CPyPy_process___BatchProcessor___process"


def count(tree: Path, events: int) -> int:
    """Instructions inside the fold of ``events`` events of ``tree``'s code, one run: the
    fold of ``bench_fold.py --one`` (this checkout's harness, ``tree``'s modules)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                f"--toggle-collect={ENTRY}",
                sys.executable,
                str(HERE / "bench_fold.py"),
                "--events",
                str(events),
                "--one",
            ],
            env={**os.environ, "PYTHONHASHSEED": "0", "SPENDBUS_BENCH_ROOT": str(tree)},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"callgrind of {tree} failed:\n{done.stderr[-2000:]}")
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise SystemExit(f"no instruction total in callgrind's output for {tree}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree")
    parser.add_argument("--baseline", type=Path, help="another checkout to count beside")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is missing: apt-get install valgrind")
    trees = {"current": HERE.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(count(tree, args.events) / args.events)
    report: dict[str, object] = {
        "bench": "fold_instructions",
        "events": args.events,
        "runs": args.runs,
        **{
            f"{name}_instructions_per_event": round(statistics.median(r))
            for name, r in runs.items()
        },
        "per_run": {name: [round(v) for v in r] for name, r in runs.items()},
    }
    if "baseline" in runs:
        report["ratio_current_to_baseline"] = round(
            statistics.median(runs["current"]) / statistics.median(runs["baseline"]), 4
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

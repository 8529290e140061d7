"""The fold's CPU instructions per event, counted by valgrind's callgrind: prints one JSON object.

Time on a shared machine moves by more than a small change to the fold does; instructions
barely move. benchkit's ledger (as ``bench_fold.py``) is folded in batches of 5,000, and
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

FOLD = """
import sys
sys.path.insert(0, {tree!r})
sys.path.insert(1, {bench_root!r})
from datetime import UTC, datetime
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference
from bench.benchkit import BUDGETS, events
from schemas.budgets import budgets_from_yaml
from schemas.pricing import PriceBook, default_price_file, load_price_file
reference = Reference()
reference.prices = PriceBook(load_price_file(default_price_file()))
reference.budgets = {{b.budget_id: b for b in budgets_from_yaml(BUDGETS)}}
ledger = events({events})
records = [RawRecord(i % 4, i // 4, key, value) for i, (key, value) in enumerate(ledger)]
processor = BatchProcessor(reference, source_topic="usage.raw")
counters, seen = {{}}, {{}}
now = datetime.now(UTC)
for start in range(0, len(records), 5000):
    out = processor.process(
        records[start : start + 5000],
        lambda p, k: counters.get((p, k)),
        lambda p, k: seen.get((p, k)),
        now=now,
    )
    counters.update(out.counter_states)
    seen.update(out.seen_writes)
"""


def count(tree: Path, events: int) -> int:
    """Instructions inside the fold of ``events`` events of ``tree``'s code, one run."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "fold.py"
        script.write_text(FOLD.format(tree=str(tree), bench_root=str(HERE.parent), events=events))
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                f"--toggle-collect={ENTRY}",
                sys.executable,
                str(script),
            ],
            env={**os.environ, "PYTHONHASHSEED": "0"},
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

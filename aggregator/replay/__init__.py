"""Replays: every counter rebuilt from the ledger, beside the serving one or in memory.

A generation (``generations.py``) is one build of everything the aggregator derives: its
topics and its store. ``GenerationReplay`` (``run.py``) starts or attaches a new one
(seeded from a snapshot by ``seeding.py``), catches it up, compares it (``checks.py``, ``report.py``) and cuts over;
``fold_dry_run`` (``folds.py``) folds the ledger in memory from a snapshot
(``snapshots.py``); ``verify_counters`` (``verify.py``) checks a running one. See
docs/replay.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from aggregator.replay.errors import ReplayError
    from aggregator.replay.folds import fold_dry_run, write_new_snapshot
    from aggregator.replay.generations import Difference, current_generation, generation_dsn
    from aggregator.replay.report import OrgChange, ReplayReport
    from aggregator.replay.run import GenerationReplay, ReplayWorker, StackPlace, next_generation
    from aggregator.replay.snapshots import Bounds, FoldState
    from aggregator.replay.verify import VerifyReport, verify_counters

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "Bounds": "aggregator.replay.snapshots",
    "Difference": "aggregator.replay.generations",
    "FoldState": "aggregator.replay.snapshots",
    "GenerationReplay": "aggregator.replay.run",
    "OrgChange": "aggregator.replay.report",
    "ReplayError": "aggregator.replay.errors",
    "ReplayReport": "aggregator.replay.report",
    "ReplayWorker": "aggregator.replay.run",
    "StackPlace": "aggregator.replay.run",
    "VerifyReport": "aggregator.replay.verify",
    "current_generation": "aggregator.replay.generations",
    "fold_dry_run": "aggregator.replay.folds",
    "generation_dsn": "aggregator.replay.generations",
    "next_generation": "aggregator.replay.run",
    "verify_counters": "aggregator.replay.verify",
    "write_new_snapshot": "aggregator.replay.folds",
}

__all__ = [
    "Bounds",
    "Difference",
    "FoldState",
    "GenerationReplay",
    "OrgChange",
    "ReplayError",
    "ReplayReport",
    "ReplayWorker",
    "StackPlace",
    "VerifyReport",
    "current_generation",
    "fold_dry_run",
    "generation_dsn",
    "next_generation",
    "verify_counters",
    "write_new_snapshot",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)

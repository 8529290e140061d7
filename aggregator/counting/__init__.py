"""The counting stage: usage.raw in large batches, priced and folded into every budget
counter, out as usage.priced, budget.verdicts, budget.alerts and usage.dlq.

``CountingStage`` is the stage (consumer, checkpoint, rebalances, ``stage.py``);
``BatchProcessor`` the pure fold of one batch (``process.py``) over ``fold.py``'s one
event into one counter; ``CountingStore`` the counters and dedupe it keeps;
``ReferenceFollower`` the budgets, prices and raises it reads first. Replays and the
alert publisher fold with the same code. See the README one folder up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from aggregator.counting.batch_output import BatchStats, VerdictChange
    from aggregator.counting.errors import CountingError
    from aggregator.counting.fold import CounterState, PeriodTotals, apply, counter_state
    from aggregator.counting.process import BatchProcessor, RawRecord
    from aggregator.counting.reference import Reference, ReferenceFollower
    from aggregator.counting.stage import CountingStage
    from aggregator.counting.state import CountingStore

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "BatchProcessor": "aggregator.counting.process",
    "BatchStats": "aggregator.counting.batch_output",
    "CounterState": "aggregator.counting.fold",
    "CountingError": "aggregator.counting.errors",
    "CountingStage": "aggregator.counting.stage",
    "CountingStore": "aggregator.counting.state",
    "PeriodTotals": "aggregator.counting.fold",
    "RawRecord": "aggregator.counting.process",
    "Reference": "aggregator.counting.reference",
    "ReferenceFollower": "aggregator.counting.reference",
    "VerdictChange": "aggregator.counting.batch_output",
    "apply": "aggregator.counting.fold",
    "counter_state": "aggregator.counting.fold",
}

__all__ = [
    "BatchProcessor",
    "BatchStats",
    "CounterState",
    "CountingError",
    "CountingStage",
    "CountingStore",
    "PeriodTotals",
    "RawRecord",
    "Reference",
    "ReferenceFollower",
    "VerdictChange",
    "apply",
    "counter_state",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)

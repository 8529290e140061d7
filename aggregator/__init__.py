"""spendbus aggregator: prices the ledger, keeps the budget counters, rebuilds them.

A Faust worker (``create_app``, run by ``spendbus aggregator run``) reads usage.raw,
prices each event, folds it into the budget counters and publishes usage.priced and
budget.verdicts; its sink writes ClickHouse exactly once (``aggregator.sink``). A replay
rebuilds every counter from the ledger into a new generation (``GenerationReplay``,
``fold_dry_run``), ``verify_counters`` checks a running one. See README.md beside this file.

These names are the public surface: code outside the room imports nothing else of it.
They load on first use (PEP 562), so that reading a setting does not import Faust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from aggregator.app import create_app
    from aggregator.config import AggregatorConfig
    from aggregator.replay import (
        Bounds,
        Difference,
        FoldState,
        GenerationReplay,
        OrgChange,
        ReplayError,
        ReplayReport,
        ReplayWorker,
        StackPlace,
        VerifyReport,
        current_generation,
        fold_dry_run,
        generation_dsn,
        next_generation,
        verify_counters,
        write_new_snapshot,
    )
    from aggregator.sink import (
        SinkError,
        apply_schema,
        check_embedded_sink,
        open_client,
        run_query,
    )

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "AggregatorConfig": "aggregator.config",
    "Bounds": "aggregator.replay",
    "Difference": "aggregator.replay",
    "FoldState": "aggregator.replay",
    "GenerationReplay": "aggregator.replay",
    "OrgChange": "aggregator.replay",
    "ReplayError": "aggregator.replay",
    "ReplayReport": "aggregator.replay",
    "ReplayWorker": "aggregator.replay",
    "SinkError": "aggregator.sink",
    "StackPlace": "aggregator.replay",
    "VerifyReport": "aggregator.replay",
    "apply_schema": "aggregator.sink",
    "check_embedded_sink": "aggregator.sink",
    "create_app": "aggregator.app",
    "current_generation": "aggregator.replay",
    "fold_dry_run": "aggregator.replay",
    "generation_dsn": "aggregator.replay",
    "next_generation": "aggregator.replay",
    "open_client": "aggregator.sink",
    "run_query": "aggregator.sink",
    "verify_counters": "aggregator.replay",
    "write_new_snapshot": "aggregator.replay",
}

__all__ = [
    "AggregatorConfig",
    "Bounds",
    "Difference",
    "FoldState",
    "GenerationReplay",
    "OrgChange",
    "ReplayError",
    "ReplayReport",
    "ReplayWorker",
    "SinkError",
    "StackPlace",
    "VerifyReport",
    "apply_schema",
    "check_embedded_sink",
    "create_app",
    "current_generation",
    "fold_dry_run",
    "generation_dsn",
    "next_generation",
    "open_client",
    "run_query",
    "verify_counters",
    "write_new_snapshot",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES)

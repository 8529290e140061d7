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

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggregator.app import create_app
    from aggregator.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess, redact_dsn
    from aggregator.config import AggregatorConfig
    from aggregator.generation_replay import (
        GenerationReplay,
        ReplayError,
        ReplayWorker,
        StackPlace,
        next_generation,
    )
    from aggregator.generations import Difference, current_generation, generation_dsn
    from aggregator.replay_folds import fold_dry_run, write_new_snapshot
    from aggregator.replay_report import OrgChange, ReplayReport
    from aggregator.sink import SinkError, apply_schema, open_client, run_query
    from aggregator.sink_owner import check_embedded_sink
    from aggregator.snapshots import Bounds, FoldState
    from aggregator.verify import VerifyReport, verify_counters

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "AggregatorConfig": "aggregator.config",
    "Bounds": "aggregator.snapshots",
    "ClickHouseAccess": "aggregator.clickhouse_access",
    "DEFAULT_ACCESS": "aggregator.clickhouse_access",
    "Difference": "aggregator.generations",
    "FoldState": "aggregator.snapshots",
    "GenerationReplay": "aggregator.generation_replay",
    "OrgChange": "aggregator.replay_report",
    "ReplayError": "aggregator.generation_replay",
    "ReplayReport": "aggregator.replay_report",
    "ReplayWorker": "aggregator.generation_replay",
    "SinkError": "aggregator.sink",
    "StackPlace": "aggregator.generation_replay",
    "VerifyReport": "aggregator.verify",
    "apply_schema": "aggregator.sink",
    "check_embedded_sink": "aggregator.sink_owner",
    "create_app": "aggregator.app",
    "current_generation": "aggregator.generations",
    "fold_dry_run": "aggregator.replay_folds",
    "generation_dsn": "aggregator.generations",
    "next_generation": "aggregator.generation_replay",
    "open_client": "aggregator.sink",
    "redact_dsn": "aggregator.clickhouse_access",
    "run_query": "aggregator.sink",
    "verify_counters": "aggregator.verify",
    "write_new_snapshot": "aggregator.replay_folds",
}

__all__ = [
    "DEFAULT_ACCESS",
    "AggregatorConfig",
    "Bounds",
    "ClickHouseAccess",
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
    "redact_dsn",
    "run_query",
    "verify_counters",
    "write_new_snapshot",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'aggregator' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))

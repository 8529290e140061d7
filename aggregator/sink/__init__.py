"""The aggregator's sink: usage.priced and budget.verdicts into ClickHouse, exactly once.

The library (analyst schema, exactly-once writes, example queries: ``clickhouse.py``,
``rows.py``, ``store.py``, ``query.py``, ``errors.py``), the guard of ``/sql`` (``guard.py``) and the
embedded engine's own process (``engine_*.py``, ``landlock.py``); beside them the
worker's side: the sink stage (``stage.py``), the store opened once (``writer.py``), the sink in a process of its own (``process.py``, ``link.py``,
``wire.py``) and the one sink per embedded store (``owner.py``). Reads nothing but
``schemas/`` and ClickHouse; the flush order and its failure modes: README.md here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from aggregator.sink.clickhouse import ClickHouseSink
    from aggregator.sink.errors import DataPathInUse, SinkError, SinkRejected, SinkUnavailable
    from aggregator.sink.link import SinkLink
    from aggregator.sink.owner import check_embedded_sink
    from aggregator.sink.query import EXAMPLE_QUERIES, ROLLUP_DRIFT, run_query
    from aggregator.sink.rows import (
        USAGE_COLUMNS,
        VERDICT_COLUMNS,
        rows_from_priced,
        rows_from_verdicts,
    )
    from aggregator.sink.stage import SinkStage
    from aggregator.sink.store import (
        DDL_DIR,
        apply_schema,
        open_client,
        rebuild_rollups,
        split_statements,
    )
    from aggregator.sink.writer import ClickHouseWriter, StoreAccess

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "ClickHouseSink": "aggregator.sink.clickhouse",
    "ClickHouseWriter": "aggregator.sink.writer",
    "DDL_DIR": "aggregator.sink.store",
    "DataPathInUse": "aggregator.sink.errors",
    "EXAMPLE_QUERIES": "aggregator.sink.query",
    "ROLLUP_DRIFT": "aggregator.sink.query",
    "SinkError": "aggregator.sink.errors",
    "SinkLink": "aggregator.sink.link",
    "SinkRejected": "aggregator.sink.errors",
    "SinkStage": "aggregator.sink.stage",
    "SinkUnavailable": "aggregator.sink.errors",
    "StoreAccess": "aggregator.sink.writer",
    "USAGE_COLUMNS": "aggregator.sink.rows",
    "VERDICT_COLUMNS": "aggregator.sink.rows",
    "apply_schema": "aggregator.sink.store",
    "check_embedded_sink": "aggregator.sink.owner",
    "open_client": "aggregator.sink.store",
    "rebuild_rollups": "aggregator.sink.store",
    "rows_from_priced": "aggregator.sink.rows",
    "rows_from_verdicts": "aggregator.sink.rows",
    "run_query": "aggregator.sink.query",
    "split_statements": "aggregator.sink.store",
}

__all__ = [
    "DDL_DIR",
    "EXAMPLE_QUERIES",
    "ROLLUP_DRIFT",
    "USAGE_COLUMNS",
    "VERDICT_COLUMNS",
    "ClickHouseSink",
    "ClickHouseWriter",
    "DataPathInUse",
    "SinkError",
    "SinkLink",
    "SinkRejected",
    "SinkStage",
    "SinkUnavailable",
    "StoreAccess",
    "apply_schema",
    "check_embedded_sink",
    "open_client",
    "rebuild_rollups",
    "rows_from_priced",
    "rows_from_verdicts",
    "run_query",
    "split_statements",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)

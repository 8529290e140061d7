"""The aggregator's ClickHouse sink: analyst schema, exactly-once writes, example queries.

Reads nothing but ``schemas/`` and ClickHouse; imports neither ingest/ nor
enforcer/. The flush order and its failure modes: README.md beside this file.
"""

from aggregator.sink.clickhouse import (
    USAGE_COLUMNS,
    VERDICT_COLUMNS,
    ClickHouseSink,
    rows_from_priced,
    rows_from_verdicts,
)
from aggregator.sink.errors import DataPathInUse, SinkError, SinkRejected, SinkUnavailable
from aggregator.sink.query import EXAMPLE_QUERIES, ROLLUP_DRIFT, run_query
from aggregator.sink.store import (
    DDL_DIR,
    apply_schema,
    open_client,
    rebuild_rollups,
    split_statements,
)

__all__ = [
    "DDL_DIR",
    "EXAMPLE_QUERIES",
    "ROLLUP_DRIFT",
    "USAGE_COLUMNS",
    "VERDICT_COLUMNS",
    "ClickHouseSink",
    "DataPathInUse",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "apply_schema",
    "open_client",
    "rebuild_rollups",
    "rows_from_priced",
    "rows_from_verdicts",
    "run_query",
    "split_statements",
]

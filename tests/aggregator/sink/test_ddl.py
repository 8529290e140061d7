"""The sink's shipped DDL against the real engine, and the package's public names."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import aggregator.sink as sink_pkg
from aggregator.sink import (
    USAGE_COLUMNS,
    VERDICT_COLUMNS,
    apply_schema,
    split_statements,
)
from aggregator.sink.store import DDL_DIR

# -- DDL ----------------------------------------------------------------------------


def test_ddl_is_idempotent_and_creates_each_table_with_its_engine(client: Any) -> None:
    assert apply_schema(client) == [p.name for p in sorted(DDL_DIR.glob("0*.sql"))]
    engines = dict(
        client.query(
            "SELECT name, engine FROM system.tables WHERE database = currentDatabase()"
        ).result_rows
    )
    assert engines == {
        "usage_events": "MergeTree",
        "spend_hourly": "SummingMergeTree",
        "spend_hourly_mv": "MaterializedView",
        "spend_daily": "SummingMergeTree",
        "spend_daily_mv": "MaterializedView",
        "spend_daily_by_dimension": "SummingMergeTree",
        "spend_daily_by_dimension_mv": "MaterializedView",
        "budget_state": "ReplacingMergeTree",
        "decisions": "View",
        "budget_counts": "View",
        "budget_history": "View",
        "budget_history_of": "View",
        "alerts": "View",
        "unit_usage": "View",
        "alert_deliveries": "ReplacingMergeTree",
        "budget_raises": "ReplacingMergeTree",
        "admin_audit": "ReplacingMergeTree",
    }


def test_sink_columns_match_the_ddl(client: Any) -> None:
    def described(table: str) -> list[tuple[str, str]]:
        rows = client.query(f"DESCRIBE TABLE {table}").result_rows
        # a named tuple is described over several lines: compare its one-line form
        one_line = [(r[0], re.sub(r"\(\s+", "(", re.sub(r"\s*\n\s*", " ", r[1]))) for r in rows]
        return [column for column, r in zip(one_line, rows, strict=True) if r[2] != "DEFAULT"]

    assert described("usage_events") == list(USAGE_COLUMNS)
    assert described("budget_state") == list(VERDICT_COLUMNS)


def test_split_statements_keeps_semicolons_in_strings_and_drops_comments() -> None:
    sql = textwrap.dedent(
        """\
        -- a comment; with a semicolon
        CREATE TABLE a (s String DEFAULT 'x;y', t String DEFAULT 'it''s;') ENGINE = Memory;
        /* block; comment */ SELECT "col;umn", `b;c` FROM a ;
        ;
        SELECT 'back\\\\slash\\';'
        """
    )
    assert split_statements(sql) == [
        "CREATE TABLE a (s String DEFAULT 'x;y', t String DEFAULT 'it''s;') ENGINE = Memory",
        'SELECT "col;umn", `b;c` FROM a',
        "SELECT 'back\\\\slash\\';'",
    ]


# -- rows ---------------------------------------------------------------------------


# -- the package --------------------------------------------------------------------


def test_public_names() -> None:
    assert sorted(sink_pkg.__all__) == sorted(
        [
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
            # the worker's side of the sink, beside the library
            "ClickHouseWriter",
            "SinkLink",
            "SinkStage",
            "StoreAccess",
            "check_embedded_sink",
        ]
    )

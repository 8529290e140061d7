"""A rollup's materialized view created and filled from ``usage_events`` exactly once.

A view sees only the inserts that began after it exists, so on a store that already holds
events a new rollup would show no history (a silent $0). ``create_filled_view`` creates
the view first, then fills its table with the rows no view saw, and proves the two sets
disjoint and whole by ``usage_events.inserted_at``: its DEFAULT ``now64(3)`` is fixed once
per INSERT when the engine plans it, the same moment it picks the views the INSERT feeds
(an INSERT sending ``inserted_at`` itself would break this; the sink never does).

1. ``before``: the engine's clock, to the millisecond, floored;
2. the view is created; ``after``: the clock again;
3. every insert into ``usage_events`` planned before the view existed has ended
   (``system.processes``: those still running are waited for);
4. no row has ``before <= inserted_at <= after``: an INSERT planned while the view was
   being created may or may not feed it. Every row under ``before`` fed no view (this
   one did not exist), every row over ``after`` fed it;
5. the fill: the view's own SELECT over the rows under ``before``;
6. the table's comment says ``filled``.

A row in between (4): the view is dropped, the inserts that fed it waited for, the table
emptied, and it is tried again until ``FILL_DEADLINE_SECONDS``, then ``SinkUnavailable``
(the sink's open retries). Killed half-way, the table's comment still says ``filling``:
the next ``apply_schema`` starts over. A view that existed before this step (its table
without that comment) is left as it is; ``rebuild_rollups`` refills any rollup. One
process runs this at a time (infra/clickhouse/README.md says how on a server).
"""

from __future__ import annotations

import logging
import random
import re
import time
from datetime import datetime
from typing import Final

from clickhouse_connect.driver.client import Client

from aggregator.sink.errors import SinkRejected, SinkUnavailable

log = logging.getLogger(__name__)

SOURCE: Final = "usage_events"
#: the target table's comment while its view is being filled, and after
FILLING: Final = "filling"
FILLED: Final = "filled"
#: how long to go on trying for a creation no insert raced, and to wait for an insert
FILL_DEADLINE_SECONDS: Final = 120.0
_FROM_SOURCE: Final = re.compile(rf"\bFROM\s+{SOURCE}\b", re.IGNORECASE)


def _scalar(client: Client, sql: str) -> object:
    rows = client.query(sql).result_rows
    return rows[0][0] if rows else None


def _count(client: Client, sql: str) -> int:
    return int(str(_scalar(client, sql) or 0))


def exists(client: Client, name: str) -> bool:
    sql = (
        f"SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = '{name}'"
    )
    return _count(client, sql) > 0


def comment_of(client: Client, table: str) -> str:
    sql = (
        f"SELECT comment FROM system.tables WHERE database = currentDatabase() AND name = '{table}'"
    )
    return str(_scalar(client, sql) or "")


def set_comment(client: Client, table: str, comment: str) -> None:
    client.command(f"ALTER TABLE {table} MODIFY COMMENT '{comment}'")


def engine_clock(client: Client) -> str:
    """The engine's time now, floored to inserted_at's millisecond, as a literal."""
    now = _scalar(client, "SELECT now64(3, 'UTC')")
    if not isinstance(now, datetime):
        raise SinkRejected(f"the engine's clock read {now!r}, not a time")
    return f"toDateTime64('{now.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}', 3, 'UTC')"


def inserts_running_since(client: Client, seconds: float) -> int:
    """Inserts naming the source that have run for at least ``seconds`` (so began before
    a moment that long ago): counted whatever database they name, to err on the safe side."""
    sql = (
        "SELECT count() FROM system.processes WHERE query_kind = 'Insert' "
        f"AND positionCaseInsensitive(query, '{SOURCE}') > 0 AND elapsed >= {seconds:.6f}"
    )
    return _count(client, sql)


def wait_for_inserts_begun_before(client: Client, moment: float) -> None:
    """Until no insert into the source that began before ``moment`` (time.monotonic())
    runs; SinkUnavailable past FILL_DEADLINE_SECONDS."""
    while inserts_running_since(client, time.monotonic() - moment):
        if time.monotonic() - moment > FILL_DEADLINE_SECONDS:
            raise SinkUnavailable(
                f"an insert into {SOURCE} has run over {FILL_DEADLINE_SECONDS:.0f}s; "
                "a rollup's fill waits for it: retry"
            )
        time.sleep(0.05)


def rows_between(client: Client, before: str, after: str) -> int:
    """Rows of the source inserted by an INSERT planned from ``before`` to ``after``."""
    return _count(
        client, f"SELECT count() FROM {SOURCE} WHERE inserted_at BETWEEN {before} AND {after}"
    )


def fill_sql(target: str, columns: list[str], select: str, before: str) -> str:
    """The view's SELECT over the source's rows inserted before ``before``, into ``target``."""
    older = f"(SELECT * FROM {SOURCE} WHERE inserted_at < {before}) AS {SOURCE}"
    body, found = _FROM_SOURCE.subn(f"FROM {older}", select, count=1)
    if not found:
        raise ValueError(f"the view into {target} does not read {SOURCE}")
    return f"INSERT INTO {target} ({', '.join(columns)}) {body}"


def create_filled_view(client: Client, view: str, target: str, create: str, select: str) -> bool:
    """Create ``view`` (statement ``create``) and fill ``target`` from the source's history,
    exactly once; True when it filled. A view already there and filled (or older than
    this step: no comment) is left alone."""
    if exists(client, view) and comment_of(client, target) != FILLING:
        return False
    started = time.monotonic()
    while True:
        if exists(client, view):  # an earlier try, or a fill killed half-way
            client.command(f"DROP VIEW {view}")
            wait_for_inserts_begun_before(client, time.monotonic())
        client.command(f"TRUNCATE TABLE {target}")
        set_comment(client, target, FILLING)
        before = engine_clock(client)
        client.command(create)
        created = time.monotonic()
        after = engine_clock(client)
        wait_for_inserts_begun_before(client, created)
        if rows_between(client, before, after) == 0:
            break
        if time.monotonic() - started > FILL_DEADLINE_SECONDS:
            raise SinkUnavailable(
                f"{view}: inserts into {SOURCE} raced its creation for "
                f"{FILL_DEADLINE_SECONDS:.0f}s; retry"
            )
        log.info("%s: an insert raced its creation; again", view)
        time.sleep(random.uniform(0.01, 0.1))  # out of step with a steady writer
    columns = [row[0] for row in client.query(f"DESCRIBE ({select})").result_rows]
    client.command(
        fill_sql(target, columns, select, before),
        settings={"insert_deduplicate": 0},  # a filled block is not a retried insert
    )
    set_comment(client, target, FILLED)
    return True

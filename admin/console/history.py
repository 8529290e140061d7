"""A budget's history per period, from ClickHouse's ``budget_history_of`` view (ddl/014:
``budget_history``'s rows of one budget, exact, one per counter and period, reading only
that budget's events), read through the same function the spend reports use
(admin/reports.py: the worker's ``/sql`` or the current store), fenced by org."""

from __future__ import annotations

from typing import Any, Final

from admin.access import Caller
from admin.console.page_query import page_rows
from admin.reports import SpendQuery, quoted

#: the most (counter, period) rows a budget's page shows, newest first
MAX_HISTORY_ROWS: Final = 200


def history_sql(budget_id: str, caller: Caller) -> str:
    """The SELECT of ``budget_id``'s rows; an org-scoped caller's counters only."""
    if not budget_id:  # the view reads every budget for an empty id
        raise ValueError("a budget's history needs its budget id")
    where = ""
    if caller.org_id is not None:
        where = f" WHERE scope_values[1] = {quoted(caller.org_id)}"
    return (
        "SELECT period, scope_values, spent_nanos, limit_nanos, state, events "
        f"FROM budget_history_of(budget_id = {quoted(budget_id)}){where} "
        f"ORDER BY period DESC, scope_values LIMIT {MAX_HISTORY_ROWS}"
    )


async def budget_history(
    run: SpendQuery | None, budget_id: str, caller: Caller
) -> list[dict[str, Any]] | str:
    """The rows, or why there are none to show (no store configured, or it failed)."""
    rows = await page_rows(
        run,
        history_sql(budget_id, caller),
        "budget history",
        unconfigured="no ClickHouse store is configured for the history",
    )
    if isinstance(rows, str):
        return rows
    return [
        {
            "period": str(period),
            "counter": "/".join(str(v) for v in values) or "all",
            "spent_nanos": int(spent),
            "limit_nanos": None if limit is None else int(limit),
            "state": str(state),
            "events": int(events),
        }
        for period, values, spent, limit, state, events in map(tuple, rows)
    ]

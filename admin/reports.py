"""``GET /v1/admin/reports/spend``: spend by day, week or month and by org, project,
secret, user, model or tag, from ClickHouse.

The query runs through a function the CLI hands in (the worker's ``/sql`` when it owns the
embedded store, else a client on the current generation's store:
spendbus/commands/store_queries.py), so this room never opens a store itself. Ids and
tag names are the rollups' canonical ones; every value put into the SQL is checked or
quoted here (the worker's ``/sql`` takes no bound parameters).

By org, project, secret, user or model it reads the ``spend_daily`` rollup; by tag it
reads ``usage_events`` (the rollups carry no tags). A row's key always holds its org, so
two orgs' projects of the same name never add up.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from admin.access import Caller
from admin.errors import ApiError
from schemas.money import format_usd

log = logging.getLogger("spendbus.admin.reports")

#: runs one SELECT on the current store; rows as sequences
SpendQuery = Callable[[str], Sequence[Sequence[Any]]]

PERIODS: Final = {
    "day": "toDate({d})",
    "week": "toStartOfWeek({d}, 1)",
    "month": "toStartOfMonth({d})",
}
#: group -> its column in spend_daily
GROUPS: Final = {
    "org": "org_id",
    "project": "project_id",
    "secret": "secret_id",
    "user": "user_id",
    "model": "model",
}
TAG_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
#: the longest span one report covers, and the most rows it answers
MAX_DAYS: Final = 731
MAX_ROWS: Final = 100_000
DEFAULT_DAYS: Final = 30


def quoted(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _day(query: Mapping[str, str], name: str, default: date) -> date:
    text = query.get(name)
    if text is None:
        return default
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ApiError(422, f"query {name!r}: a date YYYY-MM-DD, got {text!r}", name) from None


def spend_sql(query: Mapping[str, str], caller: Caller, today: date) -> str:
    """The SELECT a report's query string asks for; ApiError naming a bad parameter."""
    unknown = sorted(set(query) - {"by", "group", "from", "to", "org_id"})
    if unknown:
        raise ApiError(422, f"query {unknown[0]!r}: not a parameter of this report", unknown[0])
    by = query.get("by", "day")
    if by not in PERIODS:
        raise ApiError(422, f"query 'by': one of {', '.join(PERIODS)}, got {by!r}", "by")
    group = query.get("group", "org")
    tag = group.removeprefix("tag:") if group.startswith("tag:") else None
    if tag is None and group not in GROUPS:
        raise ApiError(
            422, f"query 'group': one of {', '.join(GROUPS)} or tag:<name>, got {group!r}", "group"
        )
    if tag is not None and not TAG_NAME.fullmatch(tag):
        raise ApiError(422, f"query 'group': tag name {tag!r} is not one", "group")
    first = _day(query, "from", today - timedelta(days=DEFAULT_DAYS - 1))
    last = _day(query, "to", today)
    if last < first:
        raise ApiError(422, "query 'to': before 'from'", "to")
    if (last - first).days >= MAX_DAYS:
        raise ApiError(422, f"query 'to': a report spans at most {MAX_DAYS} days", "to")
    org = query.get("org_id")
    if caller.org_id is not None:
        if org is not None and org != caller.org_id:
            raise ApiError(403, f"query 'org_id': your token is fenced in org {caller.org_id!r}")
        org = caller.org_id
    if tag is None:
        key, source, day = GROUPS[group], "spend_daily", "day"
        events, tokens = "sum(events)", "sum(billed_tokens)"
    else:
        key, source, day = f"tags[{quoted(tag)}]", "usage_events", "toDate(occurred_at, 'UTC')"
        events = "count()"
        tokens = "sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens)"
    where = [f"{day} >= {quoted(first.isoformat())}", f"{day} <= {quoted(last.isoformat())}"]
    if org is not None:
        where.append(f"org_id = {quoted(org)}")
    period = PERIODS[by].format(d=day)
    return (
        f"SELECT {period} AS period, org_id, {key} AS key, {events} AS events, "
        f"sum(cost_nanos) AS cost_nanos, {tokens} AS billed_tokens "
        f"FROM {source} WHERE {' AND '.join(where)} "
        f"GROUP BY period, org_id, key ORDER BY period, org_id, key LIMIT {MAX_ROWS + 1}"
    )


async def spend_report(
    run: SpendQuery | None, query: Mapping[str, str], caller: Caller
) -> dict[str, Any]:
    sql = spend_sql(query, caller, datetime.now(UTC).date())
    if run is None:
        raise ApiError(503, "no ClickHouse store is configured for spend reports")
    try:
        rows = await asyncio.to_thread(run, sql)
    except Exception as exc:  # the store away or refusing: the report cannot be made now
        log.warning("spend report: the store did not answer (%s)", type(exc).__name__)
        raise ApiError(503, f"ClickHouse did not answer ({type(exc).__name__}); retry") from None
    if len(rows) > MAX_ROWS:
        raise ApiError(422, f"over {MAX_ROWS} rows: narrow 'from'/'to' or group by less")
    out: list[dict[str, Any]] = [
        {
            "period": str(period),
            "org_id": str(org_id),
            "key": str(key),
            "events": int(events),
            "cost_nanos": int(cost),
            "cost_usd": format_usd(int(cost)),
            "billed_tokens": int(tokens),
        }
        for period, org_id, key, events, cost, tokens in rows
    ]
    total: int = sum(r["cost_nanos"] for r in out)
    return {
        "by": query.get("by", "day"),
        "group": query.get("group", "org"),
        "rows": out,
        "total_cost_nanos": total,
        "total_events": sum(r["events"] for r in out),
    }

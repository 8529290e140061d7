"""``GET /v1/admin/reports/spend``: spend by day, week or month and by org, project,
secret, user, model or tag, from ClickHouse, a page at a time.

The query runs through a function the CLI hands in (the worker's ``/sql`` when it owns the
embedded store, else a client on the current generation's store:
spendbus/commands/store_queries.py), so this room never opens a store itself. Ids and
tag names are the rollups' canonical ones; every value put into the SQL is checked or
quoted here (the worker's ``/sql`` takes no bound parameters).

By org, project, secret, user or model it reads the ``spend_daily_by_dimension`` rollup
(one row per org, day and value of the one dimension asked: a by-user report reads a row
per user and day, not per key combination; by org, the ``model`` rows, which sum to the
org's total); by tag it reads ``usage_events`` (the rollups carry no tags). A row's key
always holds its org, so two orgs' projects of the same name never add up.

Pages: rows come in (period, org_id, key) order, ``limit`` at a time (DEFAULT_LIMIT, at
most MAX_LIMIT); ``next_cursor`` is the opaque key of a page's last row and the report it
belongs to, and the next page starts after that row (keyset: no row twice or missed
while the report's rows do not change).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
ROLLUP: Final = "spend_daily_by_dimension"
#: group -> (its dimension in the rollup, the column a row's key is)
GROUPS: Final = {
    "org": ("model", "org_id"),  # any one dimension sums to the org; model has fewest rows
    "project": ("project", "value"),
    "secret": ("secret", "value"),
    "user": ("user", "value"),
    "model": ("model", "value"),
}
#: group -> its column in usage_events, as the rollup's view reads it
EVENT_COLUMNS: Final = {
    "org": "org_id",
    "project": "ifNull(project_id, '')",
    "secret": "secret_id",
    "user": "ifNull(user_id, '')",
    "model": "toString(model)",
}
TAG_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
PARAMETERS: Final = ("by", "group", "from", "to", "org_id", "limit", "cursor")
#: the longest span one report covers
MAX_DAYS: Final = 731
DEFAULT_DAYS: Final = 30
#: rows a page answers unless ``limit`` says otherwise, and the most it may ask
DEFAULT_LIMIT: Final = 1_000
MAX_LIMIT: Final = 10_000
MAX_CURSOR_CHARS: Final = 2_000


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


def _limit(query: Mapping[str, str]) -> int:
    text = query.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ApiError(
            422, f"query 'limit': a whole number from 1 to {MAX_LIMIT}, got {text[:40]!r}", "limit"
        )
    return int(text)


@dataclass(frozen=True)
class Report:
    """One report's resolved parameters: what a cursor is bound to."""

    by: str
    group: str
    first: date
    last: date
    org: str | None

    def fingerprint(self) -> str:
        text = json.dumps([self.by, self.group, str(self.first), str(self.last), self.org])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_cursor(report: Report, row: tuple[str, str, str]) -> str:
    """The opaque cursor of the page after ``row`` (period, org_id, key) of ``report``."""
    text = json.dumps({"r": report.fingerprint(), "after": list(row)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(report: Report, cursor: str) -> tuple[date, str, str]:
    """The row a page starts after; ApiError naming 'cursor' unless it is one of this
    report's own cursors."""

    def bad(why: str) -> ApiError:
        return ApiError(422, f"query 'cursor': {why}; pass a next_cursor as given", "cursor")

    if not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise bad("empty or too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad("not a cursor of this API") from None
    after = value.get("after") if isinstance(value, dict) else None
    if not (isinstance(after, list) and len(after) == 3 and all(isinstance(v, str) for v in after)):
        raise bad("not a cursor of this API")
    if value.get("r") != report.fingerprint():
        raise bad("it belongs to another report (by, group, from, to or org_id differ)")
    try:
        period = date.fromisoformat(after[0])
    except ValueError:
        raise bad("not a cursor of this API") from None
    return period, after[1], after[2]


def resolve(query: Mapping[str, str], caller: Caller, today: date) -> Report:
    """The report a query string asks for; ApiError naming a bad parameter."""
    unknown = sorted(set(query) - set(PARAMETERS))
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
    return Report(by, group, first, last, org)


def spend_sql(
    report: Report, limit: int, after: tuple[date, str, str] | None = None, *, source: str = ROLLUP
) -> str:
    """The SELECT of one page of ``report``: up to ``limit + 1`` rows (one more tells that
    a next page exists) after the row ``after``. ``source="usage_events"`` reads the
    events themselves for any group (the rollup's check)."""
    tag = report.group.removeprefix("tag:") if report.group.startswith("tag:") else None
    where = []
    if tag is None and source == ROLLUP:
        dimension, key = GROUPS[report.group]
        day = "day"
        events, tokens = "sum(events)", "sum(billed_tokens)"
        where.append(f"dimension = {quoted(dimension)}")
    else:
        source = "usage_events"
        day = "toDate(occurred_at, 'UTC')"
        events = "count()"
        tokens = "sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens)"
        key = f"tags[{quoted(tag)}]" if tag is not None else EVENT_COLUMNS[report.group]
    where += [
        f"{day} >= {quoted(report.first.isoformat())}",
        f"{day} <= {quoted(report.last.isoformat())}",
    ]
    if report.org is not None:
        where.append(f"org_id = {quoted(report.org)}")
    having = ""
    if after is not None:
        period_start, org_id, value = after
        # a later period's days are all on or after the cursor's period's first day
        where.append(f"{day} >= {quoted(period_start.isoformat())}")
        having = (
            f" HAVING (period, org_id, key) > "
            f"(toDate({quoted(period_start.isoformat())}), {quoted(org_id)}, {quoted(value)})"
        )
    period = PERIODS[report.by].format(d=day)
    return (
        f"SELECT {period} AS period, org_id, {key} AS key, {events} AS events, "
        f"sum(cost_nanos) AS cost_nanos, {tokens} AS billed_tokens "
        f"FROM {source} WHERE {' AND '.join(where)} "
        f"GROUP BY period, org_id, key{having} ORDER BY period, org_id, key LIMIT {limit + 1}"
    )


async def spend_report(
    run: SpendQuery | None, query: Mapping[str, str], caller: Caller
) -> dict[str, Any]:
    report = resolve(query, caller, datetime.now(UTC).date())
    limit = _limit(query)
    cursor = query.get("cursor")
    after = decode_cursor(report, cursor) if cursor is not None else None
    sql = spend_sql(report, limit, after)
    if run is None:
        raise ApiError(503, "no ClickHouse store is configured for spend reports")
    try:
        rows = await asyncio.to_thread(run, sql)
    except Exception as exc:  # the store away or refusing: the report cannot be made now
        log.warning("spend report: the store did not answer (%s)", type(exc).__name__)
        raise ApiError(503, f"ClickHouse did not answer ({type(exc).__name__}); retry") from None
    more = len(rows) > limit
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
        for period, org_id, key, events, cost, tokens in rows[:limit]
    ]
    last = out[-1] if more else None
    return {
        "by": report.by,
        "group": report.group,
        "rows": out,
        "total_cost_nanos": sum(r["cost_nanos"] for r in out),
        "total_events": sum(r["events"] for r in out),
        "next_cursor": (
            encode_cursor(report, (last["period"], last["org_id"], last["key"]))
            if last is not None
            else None
        ),
    }

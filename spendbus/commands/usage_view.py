"""What `spendbus usage` shows: the rows (the enforcer's for one request context, or every
live counter from the current generation's verdicts), filtered, paged, and printed as a
table that fits the terminal (long values wrap, never cut), JSON or CSV.

A forecast (``exhausts_at``) is shown only when it falls within the counter's period: a
month budget that would run out in 2063 at its trailing hour's burn does not run out this
month, and its period resets first. Burn rates are shown at the precision that tells them
from zero.
"""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from runtime.topic_reader import read_latest_values
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, VERDICT
from schemas.counter_rows import counter_row
from schemas.errors import ContractError
from schemas.money import format_usd
from schemas.raises import RaiseBook
from spendbus.commands.output import limits_text
from spendbus.settings import Settings

#: the columns of --csv, in order (JSON rows carry these and more)
CSV_COLUMNS = (
    "budget_id",
    "scope",
    "scope_values",
    "period",
    "state",
    "spent_nanos",
    "spent_tokens",
    "spent_requests",
    "limit_nanos",
    "limit_tokens",
    "limit_requests",
    "raise",
    "reset_at",
    "burn_nanos_per_hour",
    "exhausts_at",
)


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def within_period(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``exhausts_at`` kept only when it falls before the period resets."""
    exhausts, reset = _parse(row.get("exhausts_at")), _parse(row.get("reset_at"))
    if exhausts is not None and reset is not None and exhausts >= reset:
        row = {**row, "exhausts_at": None}
    return row


async def _verdicts_and_raises(
    settings: Settings, bootstrap: str
) -> tuple[list[dict[str, Any]], RaiseBook, dict[str, list[float]]]:
    """The current generation's live verdicts, the raises in force, and each budget's
    alert thresholds (a rolling counter's state is told again once spend left it)."""
    from aggregator import current_generation

    security = settings.kafka_security
    generation = await current_generation(bootstrap, settings.topics, security=security)
    topic = settings.topics.of_generation(generation).budget_verdicts
    rows = []
    for value in (await read_latest_values(bootstrap, topic, security=security)).values():
        if value is None:
            continue
        try:
            rows.append(dict(VERDICT.decode(value)))
        except ContractError:
            continue
    book = RaiseBook()
    raises = await read_latest_values(bootstrap, settings.topics.budget_raises, security=security)
    for key, value in raises.items():
        book.apply(key.decode(), None if value is None else BUDGET_RAISE.decode(value))
    policies = await read_latest_values(
        bootstrap, settings.topics.budget_policies, security=security
    )
    alert_at = {}
    for key, value in policies.items():
        if value is None:
            continue
        try:
            alert_at[key.decode()] = list(BUDGET_POLICY.decode(value)["alert_at"])
        except ContractError:
            continue
    return rows, book, alert_at


def live_counters(
    settings: Settings,
    bootstrap: str,
    *,
    org_id: str | None,
    budget_ids: tuple[str, ...],
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Every counter of the current generation's verdicts whose period has not ended, of
    ``org_id`` (a counter's first scope value) and ``budget_ids`` when given."""
    now = now or datetime.now(UTC)
    verdicts, book, alert_at = asyncio.run(_verdicts_and_raises(settings, bootstrap))
    rows = []
    for v in verdicts:
        values = tuple(v["scope_values"])
        if org_id is not None and (not values or values[0] != org_id):
            continue
        if budget_ids and v["budget_id"] not in budget_ids:
            continue
        row = counter_row(v, book, alert_at.get(v["budget_id"], ()), now)
        if row is not None:
            rows.append(row)
    return sorted(rows, key=lambda r: (r["budget_id"], r["scope_values"]))


def burn_usd(nanos: int) -> str:
    """A burn rate at the precision that tells it from zero ($0.0004/h, not $0.00)."""
    if nanos == 0:
        return "$0"
    places = next((p for p in (2, 4, 6) if round(nanos, p - 9) != 0), 9)
    return format_usd(nanos, places)


def raise_text(granted: dict[str, Any] | None) -> str:
    if granted is None:
        return "-"
    sign = "+" if granted["mode"] == "by" else "="
    parts = []
    if granted["raise_nanos"] is not None:
        parts.append(f"{sign}{format_usd(granted['raise_nanos'], 2)}")
    if granted["raise_tokens"] is not None:
        parts.append(f"{sign}{granted['raise_tokens']:,} tok")
    if granted["raise_requests"] is not None:
        parts.append(f"{sign}{granted['raise_requests']:,} req")
    return f"{' '.join(parts)} until {granted['until']}"


def usage_table(rows: list[dict[str, Any]]) -> Table:
    """Ids fold onto more lines, amounts stay whole; the period's reset is in its key (JSON
    and CSV give ``reset_at``). Nothing is cut."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    table.add_column("budget", overflow="fold", ratio=3)
    table.add_column("scope", overflow="fold", ratio=2)
    table.add_column("period", overflow="fold", ratio=1)
    table.add_column("state", no_wrap=True)
    table.add_column("spent of limit", overflow="fold", ratio=2)
    table.add_column("raise", overflow="fold", ratio=2)
    table.add_column("burn/h", no_wrap=True)
    table.add_column("exhausts", overflow="fold", ratio=2)
    for r in rows:
        burn = r["burn_per_hour"]
        burn_parts = (
            None
            if burn is None
            else [
                burn_usd(burn["nanos"]) if r["limit_nanos"] is not None else None,
                f"{burn['tokens']:,} tok" if r["limit_tokens"] is not None else None,
                f"{burn['requests']:,} req" if r["limit_requests"] is not None else None,
            ]
        )
        spent = limits_text(
            r["spent_nanos"] if r["limit_nanos"] is not None else None,
            r["spent_tokens"] if r["limit_tokens"] is not None else None,
            r["spent_requests"] if r["limit_requests"] is not None else None,
        )
        table.add_row(
            r["budget_id"],
            "/".join(r["scope_values"]),
            r["period"],
            r["state"],
            f"{spent} of {limits_text(r['limit_nanos'], r['limit_tokens'], r['limit_requests'])}",
            raise_text(r.get("raise")),
            "-" if burn_parts is None else "\n".join(p for p in burn_parts if p),
            str(r["exhausts_at"] or "-"),
        )
    return table


def csv_text(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        burn = r["burn_per_hour"]
        writer.writerow(
            [
                r["budget_id"],
                r["scope"],
                "/".join(r["scope_values"]),
                r["period"],
                r["state"],
                r["spent_nanos"],
                r["spent_tokens"],
                r["spent_requests"],
                r["limit_nanos"] if r["limit_nanos"] is not None else "",
                r["limit_tokens"] if r["limit_tokens"] is not None else "",
                r["limit_requests"] if r["limit_requests"] is not None else "",
                "" if r.get("raise") is None else raise_text(r["raise"]),
                r["reset_at"] or "",
                "" if burn is None else burn["nanos"],
                r["exhausts_at"] or "",
            ]
        )
    return out.getvalue()


def show(
    rows: list[dict[str, Any]],
    *,
    fmt: str,
    limit: int,
    offset: int,
    console: Console,
) -> str | None:
    """Print one page of ``rows`` as ``fmt`` (table, json, csv); returns the note on what
    other pages hold (for standard error), or None."""
    import json

    page = [within_period(r) for r in rows[offset : offset + limit]]
    if fmt == "json":
        console.file.write(json.dumps(page, indent=2, default=str) + "\n")
    elif fmt == "csv":
        console.file.write(csv_text(page))
    else:
        console.print(usage_table(page))
    if offset + limit < len(rows) or offset:
        shown = f"{offset + 1}-{offset + len(page)}" if page else "none"
        more = f"; the next page: --offset {offset + limit}" if offset + limit < len(rows) else ""
        return f"counters {shown} of {len(rows)}{more}"
    return None

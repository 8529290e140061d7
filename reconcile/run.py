"""A reconciliation run: the covered days of each provider matched against the ledger,
stored in the ``reconciliation`` table (both sides, the delta and the causes of every
cell and token class; each cost cell as token class ``cost_nanos``) and returned with a
summary per day."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from schemas.money import format_usd
from schemas.pricing import PriceBook

from .mapping import CredentialMapping
from .matching import (
    CREDIT,
    Cell,
    CostCell,
    DaySummary,
    long_context_sql,
    match,
    match_costs,
    read_ledger,
    summarize,
)
from .provider_reports import IMPORT_PROVIDERS, TOKEN_CLASSES, CostReport, ProviderReport
from .store import ReconcileStore


@dataclass
class Reconciliation:
    run_id: str
    cells: list[Cell]
    days: list[DaySummary]
    costs: list[CostCell] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "days": [d.as_dict() for d in self.days],
            "cells": [c.as_dict() for c in self.cells],
            "costs": [c.as_dict() for c in self.costs],
        }


def import_report(store: ReconcileStore, report: ProviderReport | CostReport, source: str) -> str:
    """Store a usage or cost report read whole (it replaces earlier imports of the days it
    covers)."""
    if isinstance(report, CostReport):
        return store.import_costs(report, source)
    return store.import_report(report, source)


def reconcile(
    store: ReconcileStore,
    run_query: Callable[[str], Sequence[Sequence[Any]]],
    mapping: CredentialMapping,
    providers: Sequence[str] = IMPORT_PROVIDERS,
    since: date | None = None,
    prices: PriceBook | None = None,
) -> Reconciliation:
    """Match every imported day (from ``since``) of ``providers`` against the ledger, which
    ``run_query`` reads (plain SQL over ``usage_events``); the run is stored. ``prices``
    is the reference price table whose long-context tiers explain a cost (cause
    ``long_context``); None: that cause is not looked for."""
    run_id = uuid.uuid4().hex
    cells: list[Cell] = []
    costs: list[CostCell] = []
    credits: dict[tuple[str, date], int] = {}
    for provider in providers:
        days = [d for d in store.covered_days(provider) if since is None or d >= since]
        if not days:
            continue
        first, last = days[0], days[-1]
        rows = store.provider_usage(provider, first, last)
        ledger = read_ledger(run_query, provider, first, last)
        matched = match(provider, days, rows, ledger, mapping)
        cells += matched
        # costs on the days both reports cover (a cost without its tokens explains nothing)
        cost_days = sorted(set(days) & set(store.covered_days(provider, "costs")))
        if cost_days:
            cost_rows = store.provider_costs(provider, cost_days[0], cost_days[-1])
            for row in cost_rows:
                if row.token_class == CREDIT and row.day in cost_days:
                    key = (provider, row.day)
                    credits[key] = credits.get(key, 0) + row.nanos
            cost_rows = [r for r in cost_rows if r.token_class != CREDIT]
            provider_costs = match_costs(provider, cost_days, cost_rows, matched)
            if prices is not None:
                explain_long_context(provider_costs, run_query, prices)
            costs += provider_costs
    now = datetime.now(UTC)
    store.insert(
        "reconciliation",
        [
            [
                run_id,
                now,
                cell.provider,
                cell.day,
                cell.credential,
                cell.api_key_id,
                cell.model,
                cell.tier,
                token_class,
                cell.provider_tokens[token_class],
                cell.spendbus_tokens[token_class],
                cell.deltas[token_class],
                cell.causes,
            ]
            for cell in cells
            for token_class in TOKEN_CLASSES
        ]
        + [
            [
                run_id,
                now,
                cost.provider,
                cost.day,
                "",
                "",
                cost.model,
                cost.tier,
                COST_NANOS,
                cost.provider_nanos,
                cost.spendbus_nanos,
                cost.delta,
                cost.causes,
            ]
            for cost in costs
        ],
        (
            "run_id",
            "reconciled_at",
            "provider",
            "day",
            "credential",
            "api_key_id",
            "model",
            "tier",
            "token_class",
            "provider_amount",
            "spendbus_amount",
            "delta",
            "causes",
        ),
    )
    summaries = summarize(cells, costs)
    for summary in summaries:
        summary.credit_nanos = credits.get((summary.provider, summary.day), 0)
    return Reconciliation(run_id, cells, summaries, costs)


def explain_long_context(
    costs: Sequence[CostCell],
    run_query: Callable[[str], Sequence[Sequence[Any]]],
    prices: PriceBook,
) -> None:
    """Each cost explained by ``price`` alone whose whole delta is the long-context step of
    the ledger's calls above their model's edge in ``prices`` (each call priced by
    ``prices`` at its time, less what the ledger charged it) is ``long_context`` instead:
    the provider billed the tier the ledger's table did not apply. Anything short of exact
    stays ``price``."""
    for cost in costs:
        if cost.causes != ["price"]:
            continue
        # the version in force at the end of the day (or now, for today)
        end = datetime.combine(cost.day, time.max, UTC)
        table = prices.table_at(min(end, datetime.now(UTC)))
        entry = None if table is None else table.resolve(cost.model)
        if entry is None or entry.long_context is None:
            continue
        edge = entry.long_context.above_input_tokens
        sql = long_context_sql(cost.provider, cost.day, cost.model, cost.tier, edge)
        if sql is None:
            continue
        calls = run_query(sql)
        step = 0
        for at_us, inp, read, write, write_1h, out, charged, service_tier in calls:
            price = prices.price_event(
                {
                    "occurred_at": datetime(1970, 1, 1, tzinfo=UTC)
                    + timedelta(microseconds=int(at_us)),
                    "model": cost.model,
                    "input_tokens": int(inp),
                    "cache_read_tokens": int(read),
                    "cache_write_tokens": int(write),
                    "cache_write_1h_tokens": int(write_1h),
                    "output_tokens": int(out),
                    "service_tier": service_tier or None,
                }
            )
            if price.unpriced:
                break
            step += price.cost_nanos - int(charged)
        else:
            if calls and step == cost.delta:
                cost.causes = ["long_context"]
                cost.long_context_calls = len(calls)
                cost.long_context_edge = edge


def _credits(nanos: int) -> str:
    """A day's credits, beside its cost (never in it)."""
    if not nanos:
        return ""
    return f"; credits {'-' if nanos < 0 else '+'}{format_usd(abs(nanos), 9)}"


#: the ``token_class`` of a cost cell's row in the ``reconciliation`` table (amounts in nanos)
COST_NANOS = "cost_nanos"

#: the short names of the token classes in the table
_SHORT = {
    "input": "in",
    "cache_read": "c.read",
    "cache_write_5m": "c.w5m",
    "cache_write_1h": "c.w1h",
    "output": "out",
}


def render_table(result: Reconciliation) -> str:
    """The report as text: one line per day, then every cell with a delta or a cause."""
    lines = [
        f"{'provider':<10} {'day':<10} {'billed tok':>12} {'metered tok':>12} "
        f"{'residual':>8}  explained"
    ]
    for day in result.days:
        explained = ", ".join(f"{c} {n}" for c, n in sorted(day.explained.items())) or "-"
        if day.unpriced_calls:
            explained += f"; unpriced calls {day.unpriced_calls}"
        lines.append(
            f"{day.provider:<10} {day.day.isoformat():<10} {day.provider_tokens:>12} "
            f"{day.spendbus_tokens:>12} {day.residual:>8}  {explained}"
        )
    flagged = [c for c in result.cells if c.causes or any(c.deltas.values())]
    if flagged:
        lines += ["", "cells with a delta or a cause (delta = provider - spendbus):"]
        for cell in flagged:
            who = cell.credential or f"(unmapped {cell.api_key_id})"
            if not cell.api_key_id:
                who = f"{cell.credential} (no mapping)"
            deltas = " ".join(f"{_SHORT[c]} {d:+d}" for c, d in cell.deltas.items() if d)
            lines.append(
                f"  {cell.provider} {cell.day} {who} {cell.model} [{cell.tier}]: "
                f"{deltas or 'tokens agree'} <- {', '.join(cell.causes)}"
            )
    costs = [c for c in result.costs if c.causes]
    priced = [d for d in result.days if d.provider_nanos is not None]
    if priced:
        lines += [
            "",
            f"{'cost':<10} {'day':<10} {'billed':>12} {'metered':>12} {'residual':>10}  explained",
        ]
        for day in priced:
            explained = ", ".join(
                f"{c} {format_usd(n, 9)}" for c, n in sorted(day.cost_explained.items())
            )
            lines.append(
                f"{day.provider:<10} {day.day.isoformat():<10} "
                f"{format_usd(day.provider_nanos or 0, 9):>12} {format_usd(day.spendbus_nanos, 9):>12} "
                f"{format_usd(day.cost_residual, 9):>10}  {explained or '-'}"
                + _credits(day.credit_nanos)
            )
    if costs:
        lines += ["", "costs with a delta (provider - spendbus):"]
        for cost in costs:
            rates = ""
            if "long_context" in cost.causes:
                rates = (
                    f" ({cost.long_context_calls} call(s) above the "
                    f"{cost.long_context_edge:,}-token edge, billed at the long-context tier)"
                )
            if "price" in cost.causes:
                rates = (
                    " (billed $/Mtok: "
                    + ", ".join(
                        f"{_SHORT.get(c, c)} {r}" for c, r in cost.effective_rates().items()
                    )
                    + ")"
                )
            lines.append(
                f"  {cost.provider} {cost.day} {cost.model} [{cost.tier}]: "
                f"{'+' if cost.delta >= 0 else '-'}{format_usd(abs(cost.delta), 9)} "
                f"<- {', '.join(cost.causes)}{rates}"
            )
    if not result.days:
        lines.append("(no provider report imported: `spendbus reconcile fetch` or `import` first)")
    return "\n".join(lines)

"""The budget history and alerts a ledger must give, by brute force (issue 17).

Written apart from the fold on purpose: no counter state, no fences, no eviction, no
arrival order. It takes the distinct events that count (each event id once, none from
the future) and sums them per (counter, period) from the budgets' definitions; rolling
windows by bucket, their spend the newest 48 buckets, a threshold crossed when any 48
consecutive buckets reached it. Only which counters an event belongs to comes from the
contract (``schemas.budgets.applicable``), as both the fold and the enforcer use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from schemas.budgets import Budget, applicable
from schemas.forecast import (
    FORECAST_BUCKET_US,
    FORECAST_BUCKETS,
    burn_of,
    exhausts_at_us,
    forecast_alert_due,
)
from schemas.periods import ROLLING_BUCKETS, period_end, period_key, period_start, to_micros
from schemas.pricing import PriceBook

COUNTED = ("allowed", "failed_open")


@dataclass
class Row:
    """What ``budget_history`` must hold for one (counter, period)."""

    budget_id: str
    scope_values: tuple[str, ...]
    spent_nanos: int = 0
    spent_tokens: int = 0
    spent_requests: int = 0
    events: int = 0
    state: str = "ok"
    thresholds: tuple[float, ...] = ()
    #: rolling windows: bucket -> [nanos, tokens, requests]
    buckets: dict[int, list[int]] = field(default_factory=dict)


def counted_events(
    events: Iterable[tuple[Mapping[str, Any], datetime]], max_skew: timedelta
) -> list[Mapping[str, Any]]:
    """(event, when it reached Kafka) in publish order -> the events that count: the first
    publish of each id, unless it is more than ``max_skew`` ahead of when it reached Kafka."""
    taken: dict[str, Mapping[str, Any]] = {}
    for event, received in events:
        if event["event_id"] in taken:
            continue  # a duplicate publish of a counted event
        if event["occurred_at"] > received + max_skew:
            continue  # dead-lettered; its id stays free
        taken[event["event_id"]] = event
    return list(taken.values())


def _ratio(budget: Budget, nanos: int, tokens: int, requests: int) -> float:
    ratios = [0.0]
    if budget.limit_nanos:
        ratios.append(nanos / budget.limit_nanos)
    if budget.limit_tokens:
        ratios.append(tokens / budget.limit_tokens)
    if budget.limit_requests:
        ratios.append(requests / budget.limit_requests)
    return max(ratios)


def history(
    events: Iterable[Mapping[str, Any]], budgets: Sequence[Budget], prices: PriceBook
) -> dict[tuple[str, str], Row]:
    """(counter key, period) -> its Row, from the events that count."""
    rows: dict[tuple[str, str], Row] = {}
    by_id = {b.budget_id: b for b in budgets}
    for event in events:
        cost = prices.price_event(event).cost_nanos
        tokens = (
            event["input_tokens"]
            + event["cache_read_tokens"]
            + event["cache_write_tokens"]
            + event["output_tokens"]
        )
        for budget, key, values in applicable(budgets, event):
            requests = 1 if event["outcome"] in COUNTED or budget.count_denied else 0
            period = period_key(budget.window, event["occurred_at"])
            row = rows.setdefault((key, period), Row(budget.budget_id, tuple(values)))
            row.events += 1
            if budget.window.kind == "rolling":
                bucket = to_micros(event["occurred_at"]) // (budget.window.rolling_us // 48)
                sums = row.buckets.setdefault(bucket, [0, 0, 0])
                sums[0] += cost
                sums[1] += tokens
                sums[2] += requests
            else:
                row.spent_nanos += cost
                row.spent_tokens += tokens
                row.spent_requests += requests
    for row in rows.values():
        budget = by_id[row.budget_id]
        peak = 0.0
        if row.buckets:
            for end in row.buckets:
                window = [row.buckets.get(b, [0, 0, 0]) for b in range(end - 47, end + 1)]
                sums = [sum(w[i] for w in window) for i in range(3)]
                peak = max(peak, _ratio(budget, *sums))
            newest = max(row.buckets)
            live = [row.buckets.get(b, [0, 0, 0]) for b in range(newest - 47, newest + 1)]
            assert len(live) == ROLLING_BUCKETS
            row.spent_nanos, row.spent_tokens, row.spent_requests = (
                sum(w[i] for w in live) for i in range(3)
            )
        ratio = _ratio(budget, row.spent_nanos, row.spent_tokens, row.spent_requests)
        peak = max(peak, ratio)
        if ratio >= 1:
            row.state = "exceeded"
        elif budget.alert_at and ratio >= min(budget.alert_at):
            row.state = "alert"
        row.thresholds = tuple(t for t in budget.alert_at if peak >= t)
    return rows


def alert_ids(
    rows: Mapping[tuple[str, str], Row],
    events: Iterable[Mapping[str, Any]],
    prices: PriceBook,
    budgets: Sequence[Budget] = (),
) -> set[str]:
    """Every alert the ledger must raise, once: thresholds crossed, unpriced models, and
    (with ``budgets``) the exhausted alert of each (counter, period) of a budget that a
    refused event names in ``decision_budget_id``."""
    events = list(events)
    ids = {f"{key}|{period}|{t}" for (key, period), row in rows.items() for t in row.thresholds}
    ids |= {f"unpriced|{e['model']}" for e in events if prices.price_event(e).unpriced}
    for event in events:
        if event["outcome"] != "refused" or event.get("decision_budget_id") is None:
            continue
        for budget, key, _ in applicable(budgets, event):
            if budget.budget_id == event["decision_budget_id"]:
                period = period_key(budget.window, event["occurred_at"])
                ids.add(f"{key}|{period}|exhausted")
    return ids


def forecast_alert_ids(
    events: Iterable[Mapping[str, Any]], budgets: Sequence[Budget], prices: PriceBook
) -> set[str]:
    """The forecast alerts the final state of the ledger makes due: per (counter, period)
    of a window that ends, the events of the trailing hour up to its newest one summed by
    5-minute bucket (by brute force), projected with schemas/forecast.py's formula onto
    the budget's limits, before the period's end. (A live run may also send the alert of
    a projection that was due only part-way through: these are the ones it must send.)"""
    spent: dict[tuple[str, str], list[int]] = {}
    newest: dict[tuple[str, str], datetime] = {}
    by_key: dict[tuple[str, str], Budget] = {}
    counted: list[tuple[tuple[str, str], int, int, int, int]] = []
    for event in events:
        cost = prices.price_event(event).cost_nanos
        tokens = (
            event["input_tokens"]
            + event["cache_read_tokens"]
            + event["cache_write_tokens"]
            + event["output_tokens"]
        )
        for budget, key, _ in applicable(budgets, event):
            if budget.window.kind not in ("day", "week", "month"):
                continue
            requests = 1 if event["outcome"] in COUNTED or budget.count_denied else 0
            where = (key, period_key(budget.window, event["occurred_at"]))
            by_key[where] = budget
            sums = spent.setdefault(where, [0, 0, 0])
            sums[0] += cost
            sums[1] += tokens
            sums[2] += requests
            if where not in newest or event["occurred_at"] > newest[where]:
                newest[where] = event["occurred_at"]
            counted.append((where, to_micros(event["occurred_at"]), cost, tokens, requests))
    buckets: dict[tuple[str, str], dict[int, list[int]]] = {}
    for where, at_us, cost, tokens, requests in counted:
        first = to_micros(newest[where]) // FORECAST_BUCKET_US - FORECAST_BUCKETS + 1
        if at_us // FORECAST_BUCKET_US >= first:
            slot = buckets.setdefault(where, {}).setdefault(at_us // FORECAST_BUCKET_US, [0, 0, 0])
            slot[0] += cost
            slot[1] += tokens
            slot[2] += requests
    due = set()
    for where, budget in by_key.items():
        start = period_start(budget.window, newest[where])
        end = period_end(budget.window, newest[where])
        assert start is not None and end is not None
        burn = burn_of(buckets.get(where, {}), to_micros(newest[where]), to_micros(start))
        limits = (budget.limit_nanos, budget.limit_tokens, budget.limit_requests)
        n, t, r = spent[where]
        if forecast_alert_due(exhausts_at_us(burn, (n, t, r), limits), to_micros(end)):
            due.add(f"forecast|{where[0]}|{where[1]}")
    return due


# --- what ClickHouse holds -------------------------------------------------------------

HISTORY_SQL = """
SELECT counter_key, period, budget_id, scope_values, spent_nanos, spent_tokens,
       spent_requests, events, state, thresholds_crossed
FROM budget_history
"""


def stored_history(client: Any) -> dict[tuple[str, str], Row]:
    return history_of_rows(client.query(HISTORY_SQL).result_rows)


def history_of_rows(rows: Iterable[Sequence[Any]]) -> dict[tuple[str, str], Row]:
    """:data:`HISTORY_SQL`'s rows (from a client or a worker's /sql page) as Rows."""
    stored: dict[tuple[str, str], Row] = {}
    for key, period, budget_id, values, nanos, tokens, requests, events, state, crossed in rows:
        assert (key, period) not in stored, f"two history rows for {key} {period}"
        stored[(key, period)] = Row(
            budget_id,
            tuple(values),
            int(nanos),
            int(tokens),
            int(requests),
            int(events),
            state,
            tuple(float(t) for t in crossed),
        )
    return stored


def stored_alerts(client: Any) -> list[str]:
    """alert_id of every row of the ``alerts`` view (a list: a repeat must show)."""
    return [row[0] for row in client.query("SELECT alert_id FROM alerts").result_rows]


def comparable(rows: Mapping[tuple[str, str], Row]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        where: (
            r.budget_id,
            r.scope_values,
            r.spent_nanos,
            r.spent_tokens,
            r.spent_requests,
            r.events,
            r.state,
            r.thresholds,
        )
        for where, r in rows.items()
    }

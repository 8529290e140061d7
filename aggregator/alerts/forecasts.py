"""Forecast alerts from ClickHouse's record: the alert publisher's (``alerts.py``) third kind.

A counter of a day, week or month budget gets one forecast alert per period when its
projection (``schemas/forecast.py``: the burn over the trailing window, up to its newest
event) runs out before the period ends. The inputs are the stored events, each once
(``budget_history`` for the totals, ``budget_counts`` for the trailing buckets), so
what the publisher finds is what the fold of the same events ends with, however they
arrived: the same formula, by event time. The limits are the row's base limits (the
budget's when its newest event was priced) raised by the raise in force at that event in
the worker's reference (``schemas/raises.RaiseBook.active``, the fold's lookup, which
does not wait for the budget_raises copy); the period's bounds are the
budget's calendar (a deleted budget has no forecast alerts).

The alert id is ``forecast|<counter key>|<period>``: the publisher sends what the
shared topic lacks, so each goes out once across restarts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from aggregator.counting.fold import PeriodTotals, counter_state, forecast_alert_record
from schemas.budgets import Budget
from schemas.forecast import (
    FORECAST_BUCKET_US,
    FORECAST_BUCKETS,
    burn_of,
    exhausts_at_us,
    forecast_alert_due,
)
from schemas.periods import from_micros, period_end, period_start, to_micros
from schemas.raises import RaiseBook, raised_budget

Reader = Callable[[str], Awaitable[Sequence[Sequence[Any]]]]

#: the windows whose periods end (a total window never does: no forecast alert)
_ENDING: Final = "('day', 'week', 'month')"
_TOTALS: Final = f"""
SELECT counter_key, budget_id, scope_values, period, spent_nanos, spent_tokens,
       spent_requests, base_limit_nanos, base_limit_tokens, base_limit_requests,
       toUnixTimestamp64Micro(as_of)
FROM budget_history
WHERE window IN {_ENDING}
  AND (base_limit_nanos IS NOT NULL OR base_limit_tokens IS NOT NULL
       OR base_limit_requests IS NOT NULL)
  {{recent}}
"""
#: per (counter, period) its newest FORECAST_BUCKETS buckets (the trailing window lies in
#: them; burn_of keeps those within it)
_BUCKETS: Final = f"""
SELECT counter_key, period,
       intDiv(toUnixTimestamp64Micro(occurred_at), {FORECAST_BUCKET_US}) AS forecast_bucket,
       sum(cost_nanos), sum(billed_tokens), sum(requests)
FROM budget_counts
WHERE window IN {_ENDING}{{recent}}
GROUP BY counter_key, period, forecast_bucket
ORDER BY counter_key, period, forecast_bucket DESC
LIMIT {FORECAST_BUCKETS} BY counter_key, period
"""


async def forecast_alerts_found(
    read: Reader, recent: str, budgets: Mapping[str, Budget], raises: RaiseBook
) -> list[tuple[bytes, dict[str, Any]]]:
    """(message key, Alert) of every forecast alert due among the (counter, period)s
    ``recent`` selects (a condition on counter_key and period; empty: all)."""
    rows = await read(_TOTALS.format(recent=recent))
    if not rows:
        return []
    buckets: dict[tuple[str, str], dict[int, list[int]]] = {}
    for key, period, index, nanos, tokens, requests in await read(_BUCKETS.format(recent=recent)):
        slot = buckets.setdefault((str(key), str(period)), {})
        slot[int(index)] = [int(nanos), int(tokens), int(requests)]
    out = []
    for row in rows:
        key, budget_id, scope_values, period = str(row[0]), str(row[1]), row[2], str(row[3])
        budget = budgets.get(budget_id)
        if budget is None:
            continue
        as_of_us = int(row[10])
        spent = (int(row[4]), int(row[5]), int(row[6]))
        measured = replace(budget, limit_nanos=row[7], limit_tokens=row[8], limit_requests=row[9])
        granted = raises.active(budget_id, tuple(scope_values), as_of_us)
        if granted is not None:
            measured = raised_budget(measured, granted)
        at = from_micros(as_of_us)
        start, end = period_start(budget.window, at), period_end(budget.window, at)
        if start is None or end is None:
            continue
        limits = (measured.limit_nanos, measured.limit_tokens, measured.limit_requests)
        burn = burn_of(buckets.get((key, period), {}), as_of_us, to_micros(start))
        exhausts = exhausts_at_us(burn, spent, limits)
        if exhausts is None or not forecast_alert_due(exhausts, to_micros(end)):
            continue
        state = counter_state(measured, PeriodTotals(*spent))
        alert = forecast_alert_record(
            budget_id, key, period, state, spent, limits, as_of_us, exhausts
        )
        out.append((key.encode(), alert))
    return out

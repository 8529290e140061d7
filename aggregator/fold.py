"""The counter fold: how one priced event changes one budget counter. Pure; no Faust here.

A counter (one budget × one set of scope values) keeps its totals per period
(the newest few periods, so a late event still counts in its own period), the
rolling buckets of a rolling window, the thresholds already alerted in each
period, a sequence number for its verdicts, and the *fence*: per source
partition, the last ``usage.raw`` offset it applied. A re-delivered record
(offset <= fence) is skipped, so at-least-once delivery charges each event
once (DESIGN.md invariant 1). The fence lives in the same value as the totals
it protects: one table write updates both or neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from schemas.budgets import Budget
from schemas.periods import (
    from_micros,
    period_end,
    period_key,
    rolling_bucket,
    rolling_live_buckets,
    to_micros,
)
from schemas.usage import billed_tokens

#: how many periods a counter keeps (newest first); older late events open a fresh entry
KEPT_PERIODS: Final = 4
OK, ALERT, EXCEEDED = "ok", "alert", "exceeded"
_COUNTED_OUTCOMES: Final = frozenset({"allowed", "failed_open"})


@dataclass(slots=True)
class PeriodTotals:
    nanos: int = 0
    tokens: int = 0
    requests: int = 0
    as_of_us: int = 0
    alerted: list[float] = field(default_factory=list)
    #: rolling windows only: bucket index -> [nanos, tokens, requests]
    buckets: dict[int, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class CounterState:
    """The value of one counter in the aggregator's table."""

    period: str = ""
    seq: int = 0
    periods: dict[str, PeriodTotals] = field(default_factory=dict)
    fence: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "p": self.period,
            "s": self.seq,
            "f": {str(k): v for k, v in self.fence.items()},
            "t": {
                key: [
                    t.nanos,
                    t.tokens,
                    t.requests,
                    t.as_of_us,
                    t.alerted,
                    {str(b): v for b, v in t.buckets.items()},
                ]
                for key, t in self.periods.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CounterState:
        return cls(
            period=data["p"],
            seq=data["s"],
            fence={int(k): v for k, v in data["f"].items()},
            periods={
                key: PeriodTotals(n, t, r, a, list(al), {int(b): list(v) for b, v in bk.items()})
                for key, (n, t, r, a, al, bk) in data["t"].items()
            },
        )


@dataclass(frozen=True, slots=True)
class Change:
    """What applying one event did to a counter."""

    period: str
    #: the change touched the counter's newest period: its verdict must be re-sent
    current: bool
    #: thresholds crossed for the first time in this period
    new_alerts: tuple[float, ...]


def counts_request(budget: Budget, outcome: str) -> bool:
    return outcome in _COUNTED_OUTCOMES or budget.count_denied


def apply(
    state: CounterState,
    budget: Budget,
    event: dict[str, Any],
    cost_nanos: int,
    partition: int,
    offset: int,
) -> Change | None:
    """Add ``event`` to ``state`` in place; None when the fence says it was applied already."""
    if state.fence.get(partition, -1) >= offset:
        return None
    state.fence[partition] = offset
    occurred: datetime = event["occurred_at"]
    occurred_us = to_micros(occurred)
    key = period_key(budget.window, occurred)
    totals = state.periods.get(key)
    if totals is None:
        totals = state.periods[key] = PeriodTotals()
    tokens = billed_tokens(event)
    requests = 1 if counts_request(budget, event["outcome"]) else 0
    if budget.window.kind == "rolling":
        bucket = totals.buckets.setdefault(rolling_bucket(budget.window, occurred_us), [0, 0, 0])
        bucket[0] += cost_nanos
        bucket[1] += tokens
        bucket[2] += requests
        totals.as_of_us = max(totals.as_of_us, occurred_us)
        live = rolling_live_buckets(budget.window, totals.as_of_us)
        for index in [b for b in totals.buckets if b < live.start]:
            del totals.buckets[index]
        totals.nanos = sum(b[0] for b in totals.buckets.values())
        totals.tokens = sum(b[1] for b in totals.buckets.values())
        totals.requests = sum(b[2] for b in totals.buckets.values())
    else:
        totals.nanos += cost_nanos
        totals.tokens += tokens
        totals.requests += requests
        totals.as_of_us = max(totals.as_of_us, occurred_us)
    if key >= state.period:  # period keys of one window sort chronologically
        state.period = key
    for old in sorted(state.periods, reverse=True)[KEPT_PERIODS:]:
        del state.periods[old]
    current = key == state.period
    if current:
        state.seq += 1
    crossed = tuple(
        t for t in budget.alert_at if t not in totals.alerted and _ratio(budget, totals) >= t
    )
    totals.alerted.extend(crossed)
    return Change(period=key, current=current, new_alerts=crossed)


def _ratio(budget: Budget, totals: PeriodTotals) -> float:
    """The highest fraction of any limit spent."""
    ratios = [0.0]
    if budget.limit_nanos:
        ratios.append(totals.nanos / budget.limit_nanos)
    if budget.limit_tokens:
        ratios.append(totals.tokens / budget.limit_tokens)
    if budget.limit_requests:
        ratios.append(totals.requests / budget.limit_requests)
    return max(ratios)


def counter_state(budget: Budget, totals: PeriodTotals) -> str:
    """exceeded when any limit is reached (spent >= limit); alert past the lowest threshold."""
    ratio = _ratio(budget, totals)
    if ratio >= 1.0:
        return EXCEEDED
    if budget.alert_at and ratio >= min(budget.alert_at):
        return ALERT
    return OK


def verdict_record(
    budget: Budget,
    key: str,
    scope_values: tuple[str, ...],
    state: CounterState,
    emitted_at: datetime,
) -> dict[str, Any]:
    """The Verdict of the counter's newest period (schemas/avro/Verdict.avsc)."""
    totals = state.periods[state.period]
    as_of = from_micros(totals.as_of_us)
    return {
        "counter_key": key,
        "budget_id": budget.budget_id,
        "scope": budget.scope,
        "scope_values": list(scope_values),
        "period": state.period,
        "state": counter_state(budget, totals),
        "spent_nanos": totals.nanos,
        "spent_tokens": totals.tokens,
        "spent_requests": totals.requests,
        "limit_nanos": budget.limit_nanos,
        "limit_tokens": budget.limit_tokens,
        "limit_requests": budget.limit_requests,
        "action": budget.action,
        "refusal": budget.refusal,
        "reset_at": period_end(budget.window, as_of),
        "as_of": as_of,
        "seq": state.seq,
        "emitted_at": emitted_at,
    }


def alert_record(
    budget: Budget, key: str, period: str, threshold: float, totals: PeriodTotals
) -> dict[str, Any]:
    return {
        "alert_id": f"{key}|{period}|{threshold}",
        "kind": "threshold",
        "counter_key": key,
        "budget_id": budget.budget_id,
        "period": period,
        "threshold": threshold,
        "state": counter_state(budget, totals),
        "spent_nanos": totals.nanos,
        "spent_tokens": totals.tokens,
        "spent_requests": totals.requests,
        "limit_nanos": budget.limit_nanos,
        "limit_tokens": budget.limit_tokens,
        "limit_requests": budget.limit_requests,
        "model": None,
        "as_of": from_micros(totals.as_of_us),
    }


def unpriced_alert(model: str, event: dict[str, Any]) -> dict[str, Any]:
    """The alert that a model without a price is being used (its events are charged 0)."""
    return {
        "alert_id": f"unpriced|{model}",
        "kind": "unpriced_model",
        "counter_key": "",
        "budget_id": "",
        "period": "",
        "threshold": 0.0,
        "state": OK,
        "spent_nanos": 0,
        "spent_tokens": 0,
        "spent_requests": 0,
        "limit_nanos": None,
        "limit_tokens": None,
        "limit_requests": None,
        "model": model,
        "as_of": event["occurred_at"],
    }

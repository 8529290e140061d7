"""The counter fold: how one priced event changes one budget counter. Pure; no Faust here.

A counter (one budget × one set of scope values) keeps its totals per period
(the newest few periods, so a late event still counts in its own period), the
rolling buckets of a rolling window, the thresholds already alerted in each
period, a sequence number for its verdicts, and the *fence*: per source
partition, the last ``usage.raw`` offset it applied. A re-delivered record
(offset <= fence) is skipped, so at-least-once delivery charges each event
once (docs/design.md invariant 1). The fence lives in the same value as the totals
it protects: one table write updates both or neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NamedTuple

from schemas.budgets import Budget
from schemas.forecast import (
    FORECAST_BUCKET_US,
    FORECAST_BUCKETS,
    Burn,
    burn_of,
    exhausts_at_us,
    forecast_alert_due,
    forecast_alert_id,
)
from schemas.periods import (
    ROLLING_BUCKETS,
    Window,
    from_micros,
    period_end,
    period_key,
    period_start,
    to_micros,
)
from schemas.rolling import verdict_buckets
from schemas.usage import billed_tokens

#: how many periods a counter keeps in memory (newest first); a late event older than
#: those counts in a fresh entry that is dropped at once. The exact history of every
#: period is ClickHouse's (each priced event carries its counts: budget_history)
KEPT_PERIODS: Final = 4
OK, ALERT, EXCEEDED = "ok", "alert", "exceeded"
#: the outcomes that count as a request in every budget (others only with count_denied)
COUNTED_OUTCOMES: Final = frozenset({"allowed", "failed_open"})


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


class Change(NamedTuple):
    """What applying one event did to a counter."""

    period: str
    #: the change touched the counter's newest period: its verdict must be re-sent
    current: bool
    #: thresholds crossed for the first time in this period
    new_alerts: tuple[float, ...]


def counts_request(budget: Budget, outcome: str, charge_of: str | None = None) -> bool:
    """Whether an event counts as a request of ``budget``: an allowed one (or any, with
    count_denied), unless it is a further charge of another call (``charge_of``)."""
    return charge_of is None and (outcome in COUNTED_OUTCOMES or budget.count_denied)


def apply(
    state: CounterState,
    budget: Budget,
    # a UsageEvent, or a stored usage_events row (replay's counters_from_rows): read only
    event: Mapping[str, Any],
    cost_nanos: int,
    partition: int,
    offset: int,
    occurred_us: int | None = None,
    tokens: int | None = None,
    period: str | None = None,
    counted: bool | None = None,
    charge: bool | None = None,
) -> Change | None:
    """Add ``event`` to ``state`` in place; None when the fence says it was applied already.

    ``occurred_us``, ``tokens``, ``period`` (:func:`period_of`), ``counted`` (its outcome
    is in COUNTED_OUTCOMES) and ``charge`` (it is a further charge, ``charge_of``) may be
    passed when the caller already computed them for the event.
    """
    fence = state.fence
    if fence.get(partition, -1) >= offset:
        return None
    fence[partition] = offset
    if occurred_us is None:
        occurred_us = to_micros(event["occurred_at"])
    window = budget.window
    key = period if period is not None else period_of(window, occurred_us, event["occurred_at"])
    periods = state.periods
    totals = periods.get(key)
    if totals is None:
        totals = periods[key] = PeriodTotals()
        if len(periods) > KEPT_PERIODS:
            for old in sorted(periods, reverse=True)[KEPT_PERIODS:]:
                del periods[old]
    if tokens is None:
        tokens = billed_tokens(event)
    # a further charge of another call (UsageEvent v3 charge_of) is no request of its own
    if counted is None:
        counted = event["outcome"] in COUNTED_OUTCOMES
    if charge is None:
        charge = event.get("charge_of") is not None
    requests = 1 if (counted or budget.count_denied) and not charge else 0
    if window.kind == "rolling":
        _add_rolling(totals, window, occurred_us, cost_nanos, tokens, requests)
    else:
        totals.nanos += cost_nanos
        totals.tokens += tokens
        totals.requests += requests
        _add_trailing(totals, occurred_us, cost_nanos, tokens, requests)
    if key >= state.period:  # period keys of one window sort chronologically
        state.period = key
    # a late event may have opened an entry older than every kept one: it goes at once
    if key not in periods:
        return _quiet_change(key, False)
    current = key == state.period
    if current:
        state.seq += 1
    if not budget.alert_at:
        return _quiet_change(key, current)
    ratio = _ratio(budget, totals)
    crossed = tuple(t for t in budget.alert_at if t not in totals.alerted and ratio >= t)
    if not crossed:
        return _quiet_change(key, current)
    # kept sorted: a set in the changelog, the same however the batches fell
    totals.alerted.extend(crossed)
    totals.alerted.sort()
    return _change(Change, (key, current, crossed))


def _quiet_change(period: str, current: bool) -> Change:
    """The Change that crossed no threshold, one shared per (period, current): a Change is
    immutable, and a period key repeats for every event of its period (three per event)."""
    made = _QUIET_CHANGES.get(period)
    if made is None:
        if len(_QUIET_CHANGES) >= 10_000:
            _QUIET_CHANGES.clear()
        made = _QUIET_CHANGES[period] = (
            _change(Change, (period, False, ())),
            _change(Change, (period, True, ())),
        )
    return made[1] if current else made[0]


def period_of(window: Window, occurred_us: int, occurred_at: datetime) -> str:
    """``period_key(window, occurred_at)``, cached per window (its calendar included) and
    grain: every period starts on a whole ``window.grain_us`` (an hour UTC, or a quarter
    hour in a local zone)."""
    cache_key = (window, occurred_us // window.grain_us)
    key = _PERIOD_KEYS.get(cache_key)
    if key is None:
        if len(_PERIOD_KEYS) > 100_000:
            _PERIOD_KEYS.clear()
        key = _PERIOD_KEYS[cache_key] = period_key(window, occurred_at)
    return key


def _add_rolling(
    totals: PeriodTotals,
    window: Window,
    occurred_us: int,
    cost_nanos: int,
    tokens: int,
    requests: int,
) -> None:
    """Add to the event's bucket, drop the buckets that left the window, keep the sums.

    The sums are kept incrementally (add the event, subtract what is dropped), which
    equals summing the live buckets (the fold's reference definition, tested).
    """
    width = window.rolling_us // ROLLING_BUCKETS
    index = occurred_us // width
    buckets = totals.buckets
    bucket = buckets.get(index)
    if bucket is None:
        bucket = buckets[index] = [0, 0, 0]
    bucket[0] += cost_nanos
    bucket[1] += tokens
    bucket[2] += requests
    totals.nanos += cost_nanos
    totals.tokens += tokens
    totals.requests += requests
    previous_start = totals.as_of_us // width - ROLLING_BUCKETS + 1
    if occurred_us > totals.as_of_us:
        totals.as_of_us = occurred_us
    # the live buckets: the last ROLLING_BUCKETS up to the newest (periods.rolling_live_buckets)
    start = totals.as_of_us // width - ROLLING_BUCKETS + 1
    if start != previous_start or index < start:
        for old in [b for b in buckets if b < start]:
            dropped = buckets.pop(old)
            totals.nanos -= dropped[0]
            totals.tokens -= dropped[1]
            totals.requests -= dropped[2]


def _add_trailing(
    totals: PeriodTotals, occurred_us: int, cost_nanos: int, tokens: int, requests: int
) -> None:
    """A calendar or total window: move ``as_of`` and keep the trailing window's buckets
    (schemas/forecast.py, the burn a forecast reads). An event older than the window is
    in no bucket, so the buckets end as a fold in time order leaves them. Inline
    arithmetic (``first_live_bucket``): this runs per event and counter."""
    previous_as_of = totals.as_of_us
    as_of = previous_as_of
    if occurred_us > as_of:
        totals.as_of_us = as_of = occurred_us
    first = as_of // _TRAILING_BUCKET_US - _TRAILING_SPAN
    index = occurred_us // _TRAILING_BUCKET_US
    buckets = totals.buckets
    if index >= first:
        bucket = buckets.get(index)
        if bucket is None:
            buckets[index] = [cost_nanos, tokens, requests]
        else:
            bucket[0] += cost_nanos
            bucket[1] += tokens
            bucket[2] += requests
    if as_of != previous_as_of and first != previous_as_of // _TRAILING_BUCKET_US - _TRAILING_SPAN:
        for old in [b for b in buckets if b < first]:
            del buckets[old]


#: schemas/forecast.py's bucket width and the buckets before the newest one, as natives
_TRAILING_BUCKET_US: Final[int] = FORECAST_BUCKET_US
_TRAILING_SPAN: Final[int] = FORECAST_BUCKETS - 1


#: builds a Change without its Python-level ``__new__`` (half the cost; three per event)
_change: Final = tuple.__new__
#: period key -> its changes that crossed no threshold, (not current, current)
_QUIET_CHANGES: dict[str, tuple[Change, Change]] = {}
#: (window, grain since the epoch) -> period key
_PERIOD_KEYS: dict[tuple[Window, int], str] = {}


def _ratio(budget: Budget, totals: PeriodTotals) -> float:
    """The highest fraction of any limit spent."""
    ratio = 0.0
    if budget.limit_nanos:
        ratio = totals.nanos / budget.limit_nanos
    if budget.limit_tokens:
        ratio = max(ratio, totals.tokens / budget.limit_tokens)
    if budget.limit_requests:
        ratio = max(ratio, totals.requests / budget.limit_requests)
    return ratio


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
    as_of = from_micros(state.periods[state.period].as_of_us)
    start = period_start(budget.window, as_of)
    record = verdict_fields(
        budget,
        key,
        scope_values,
        state,
        reset_at=period_end(budget.window, as_of),
        as_of=as_of,
        emitted_at=emitted_at,
        period_start_us=None if start is None else to_micros(start),
    )
    if record["exhausts_at"] is not None:
        record["exhausts_at"] = from_micros(record["exhausts_at"])
    return record


def counter_burn(budget: Budget, totals: PeriodTotals, period_start_us: int | None) -> Burn | None:
    """The counter's burn over its trailing window (schemas/forecast.py); None for a
    rolling window, which has no forecast."""
    if budget.window.kind == "rolling":
        return None
    return burn_of(totals.buckets, totals.as_of_us, period_start_us)


def counter_exhausts_at(budget: Budget, totals: PeriodTotals, burn: Burn | None) -> int | None:
    """When the counter's first limit runs out at ``burn`` (µs), or None."""
    if burn is None:
        return None
    return exhausts_at_us(
        burn,
        (totals.nanos, totals.tokens, totals.requests),
        (budget.limit_nanos, budget.limit_tokens, budget.limit_requests),
    )


def verdict_fields(
    budget: Budget,
    key: str,
    scope_values: tuple[str, ...],
    state: CounterState,
    *,
    reset_at: Any,
    as_of: Any,
    emitted_at: Any,
    period_start_us: int | None,
) -> dict[str, Any]:
    """The Verdict's fields, its times as given: datetimes (:func:`verdict_record`) or
    integer microseconds (what the encoder takes as well, see verdict_codec.py);
    ``exhausts_at`` in microseconds."""
    totals = state.periods[state.period]
    burn = counter_burn(budget, totals, period_start_us)
    window = budget.window
    ages, nanos, tokens, requests = (
        verdict_buckets(window, totals.buckets, totals.as_of_us)
        if window.kind == "rolling"
        else _NO_BUCKETS
    )
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
        "reset_at": reset_at,
        "as_of": as_of,
        "seq": state.seq,
        "emitted_at": emitted_at,
        "burn_nanos": None if burn is None else burn.nanos,
        "burn_tokens": None if burn is None else burn.tokens,
        "burn_requests": None if burn is None else burn.requests,
        "burn_span_us": None if burn is None else burn.span_us,
        "exhausts_at": counter_exhausts_at(budget, totals, burn),
        # a rolling window's buckets in the window (Verdict v3): readers drop them as
        # they leave it by their own clock (schemas/rolling.py)
        "bucket_ages": ages,
        "bucket_nanos": nanos,
        "bucket_tokens": tokens,
        "bucket_requests": requests,
    }


#: the bucket fields of a calendar or total window's verdict: none (never written to)
_NO_BUCKETS: Final[tuple[list[int], list[int], list[int], list[int]]] = ([], [], [], [])


def threshold_alert_id(key: str, period: str, threshold: float) -> str:
    """The deterministic id of a threshold alert (consumers drop a repeat by it)."""
    return f"{key}|{period}|{float(threshold)}"


def exhausted_alert_id(key: str, period: str) -> str:
    """The deterministic id of a counter's exhausted alert in one period."""
    return f"{key}|{period}|exhausted"


def alert_record(
    budget: Budget, key: str, period: str, threshold: float, totals: PeriodTotals
) -> dict[str, Any]:
    return {
        "alert_id": threshold_alert_id(key, period, threshold),
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
        "exhausts_at": None,
    }


#: in a period's ``alerted``: its forecast alert went out (thresholds are all > 0)
FORECAST_ALERTED: Final = -1.0
#: in a period's ``alerted``: its exhausted alert went out
EXHAUSTED_ALERTED: Final = -2.0


def exhausted_alert(
    budget: Budget, key: str, period: str, totals: PeriodTotals
) -> dict[str, Any] | None:
    """The counter's ``exhausted`` alert, once per period (marked in its ``alerted``): an
    enforcer refused a request for this budget (the event's ``decision_budget_id``). A
    refusal keeps the spend under the limit (a request that does not fit what is left is
    refused), so no threshold of 1.0 is ever crossed by spend alone: this is the alert
    that says the budget stops requests."""
    if EXHAUSTED_ALERTED in totals.alerted:
        return None
    totals.alerted.append(EXHAUSTED_ALERTED)
    totals.alerted.sort()
    record = alert_record(budget, key, period, 1.0, totals)
    record["alert_id"] = exhausted_alert_id(key, period)
    record["kind"] = "exhausted"
    return record


def forecast_alert(
    budget: Budget, key: str, state: CounterState, bounds: tuple[int, int] | None
) -> dict[str, Any] | None:
    """The counter's forecast alert, once per period (marked in its ``alerted``), when its
    newest period's projection (schemas/forecast.py) falls before the period's end
    (``bounds``: its start and end in µs; None for a window that never ends)."""
    if bounds is None or not state.period:
        return None
    totals = state.periods[state.period]
    if FORECAST_ALERTED in totals.alerted or (
        budget.limit_nanos is None and budget.limit_tokens is None and budget.limit_requests is None
    ):
        return None
    exhausts = counter_exhausts_at(budget, totals, counter_burn(budget, totals, bounds[0]))
    if exhausts is None or not forecast_alert_due(exhausts, bounds[1]):
        return None
    totals.alerted.append(FORECAST_ALERTED)
    totals.alerted.sort()
    return forecast_alert_record(
        budget.budget_id,
        key,
        state.period,
        counter_state(budget, totals),
        (totals.nanos, totals.tokens, totals.requests),
        (budget.limit_nanos, budget.limit_tokens, budget.limit_requests),
        totals.as_of_us,
        exhausts,
    )


def forecast_alert_record(
    budget_id: str,
    key: str,
    period: str,
    state: str,
    spent: tuple[int, int, int],
    limits: tuple[int | None, int | None, int | None],
    as_of_us: int,
    exhausts_at_us: int,
) -> dict[str, Any]:
    """A forecast Alert (v2): the counter runs out at ``exhausts_at`` at its burn."""
    return {
        "alert_id": forecast_alert_id(key, period),
        "kind": "forecast",
        "counter_key": key,
        "budget_id": budget_id,
        "period": period,
        "threshold": 0.0,
        "state": state,
        "spent_nanos": spent[0],
        "spent_tokens": spent[1],
        "spent_requests": spent[2],
        "limit_nanos": limits[0],
        "limit_tokens": limits[1],
        "limit_requests": limits[2],
        "model": None,
        "as_of": from_micros(as_of_us),
        "exhausts_at": from_micros(exhausts_at_us),
    }


#: unpriced models alerted one by one; the rest share UNPRICED_OVERFLOW's alert (the model
#: names are the clients': a new one per request must not make an alert per request)
MAX_UNPRICED_MODEL_ALERTS: Final = 100
#: the model name of the one alert that stands for every model past the bound
UNPRICED_OVERFLOW: Final = "*"


def unpriced_alert(model: str, first_seen: datetime) -> dict[str, Any]:
    """The alert that a model without a price is being used (its events are charged 0),
    as of the first event seen with it."""
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
        "as_of": first_seen,
        "exhausts_at": None,
    }

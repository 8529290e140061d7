"""Refusals as the console shows them: which counter the gateways refuse calls by, why in
plain words, when they last did, and how many calls a key had refused today.

The data is what a refusal really leaves behind: the gateway publishes every refused call
as a usage event (outcome ``refused``, ``decision`` the refusal's kind,
``decision_budget_id`` the refusing budget; enforcer/decision.py), which the aggregator
writes to ClickHouse's ``usage_events``. One bounded query a page reads the last day's
refused events of the budgets on the page, grouped by who made them (newest first), through
the spend reports' query function (admin/reports.py), fenced by the caller's org; each group
is mapped to the counter it refused by its budget's own scope rule (schemas/budgets.py).

A refused event carries no estimate: a refusal of a call whose worst case does not fit what
is left says what is left (from the live counter), not what the call would have cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from admin.access import Caller
from admin.console.page_query import page_rows
from admin.reports import SpendQuery, quoted
from schemas.budgets import Budget
from schemas.money import format_usd
from schemas.periods import from_micros, period_key
from schemas.usage import (
    APPROVAL_DENIED,
    APPROVAL_REQUIRED,
    IN_FLIGHT_BUDGET_EXCEEDED,
    POLICY_DENIED,
    THROTTLED,
)

#: how far back a page looks for refused events (usage_events is ordered by org and time,
#: so an org's last day is a narrow range)
LOOK_BACK: Final = timedelta(days=1)
#: a counter still under its limit that refused a call this recently is shown as refusing
#: now (an exhausted one is refusing whatever its events say)
REFUSING_WITHIN: Final = timedelta(minutes=10)
#: the most (budget, caller) groups one page reads, newest first
MAX_REFUSAL_ROWS: Final = 2_000
#: the most keys the keys page's count covers
MAX_KEY_ROWS: Final = 10_000
#: the columns a budget's scope reads of an event (Budget.scope_values)
_SCOPE_COLUMNS: Final = ("org_id", "secret_id", "project_id", "grant_id", "user_id", "session_id")

#: ``(budget_id, scope_values)``: a counter as the counters route lists it
CounterId = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A counter's refused calls of the last day: the newest one's kind, time, key and
    model, and how many."""

    decision: str
    last_at: datetime
    secret_id: str
    model: str
    calls: int


def refusals_sql(budget_ids: Iterable[str], caller: Caller, since: datetime) -> str:
    """The SELECT of the refused events since ``since`` by ``budget_ids``, one row per
    budget and scope attributes, newest first; an org-scoped caller's org only."""
    ids = ", ".join(quoted(b) for b in sorted(set(budget_ids)))
    where = [
        "outcome = 'refused'",
        f"occurred_at >= toDateTime64({quoted(since.strftime('%Y-%m-%d %H:%M:%S'))}, 6, 'UTC')",
        f"decision_budget_id IN ({ids})",
    ]
    if caller.org_id is not None:
        where.append(f"org_id = {quoted(caller.org_id)}")
    keys = ", ".join(_SCOPE_COLUMNS)
    return (
        f"SELECT decision_budget_id, {keys}, toJSONString(groups), toJSONString(tags), "
        "argMax(decision, occurred_at), toUnixTimestamp64Micro(max(occurred_at)), "
        "argMax(toString(model), occurred_at), count() "
        f"FROM usage_events WHERE {' AND '.join(where)} "
        f"GROUP BY decision_budget_id, {keys}, groups, tags "
        f"ORDER BY max(occurred_at) DESC LIMIT {MAX_REFUSAL_ROWS}"
    )


async def counter_refusals(
    run: SpendQuery | None,
    budgets: Mapping[str, Budget],
    counters: Sequence[Mapping[str, Any]],
    caller: Caller,
    now: datetime,
) -> dict[CounterId, Refusal] | str:
    """The last day's refusals of each of ``counters`` (the counters route's rows, fenced
    already), or why they cannot be shown."""
    shown = {(c["budget_id"], tuple(c["scope_values"])): c for c in counters}
    budget_ids = {budget_id for budget_id, _ in shown if budget_id in budgets}
    if not budget_ids:
        return {}
    rows = await page_rows(run, refusals_sql(budget_ids, caller, now - LOOK_BACK), "refusals")
    if isinstance(rows, str):
        return rows
    found: dict[CounterId, Refusal] = {}
    for row in rows:
        budget_id, *scope, groups, tags, decision, last_us, model, calls = tuple(row)
        attrs = dict(zip(_SCOPE_COLUMNS, scope, strict=True))
        attrs |= {"groups": json.loads(groups), "tags": json.loads(tags)}
        candidates = [
            (budget_id, values)
            for values in budgets[str(budget_id)].scope_values(attrs)
            if (budget_id, values) in shown
        ]
        if not candidates:
            continue  # a counter of a past period, or one the caller is not shown
        # an event in several groups counts in each: the one with least left refused it
        counter = min(candidates, key=lambda c: _left_share(shown[c]))
        refusal = Refusal(
            str(decision),
            from_micros(int(last_us)),
            str(attrs["secret_id"]),
            str(model),
            int(calls),
        )
        had = found.get(counter)
        if had is None:
            found[counter] = refusal
        else:  # rows come newest first: the first one's kind, time, key and model stand
            found[counter] = Refusal(
                had.decision, had.last_at, had.secret_id, had.model, had.calls + refusal.calls
            )
    return found


def _left_share(counter: Mapping[str, Any]) -> float:
    """The smallest share left under any of a counter's limits (1.0: no limit)."""
    shares = [1.0]
    for unit in ("nanos", "tokens", "requests"):
        limit = counter[f"limit_{unit}"]
        if limit:
            shares.append(max(limit - counter[f"spent_{unit}"], 0) / limit)
    return min(shares)


def _amount(unit: str, amount: int) -> str:
    if unit != "nanos":
        return f"{amount:,} {unit}"
    # cents hide what a refusal turns on below a dollar ($0.004 left is not $0.00)
    return format_usd(amount, 2 if abs(amount) >= 10**9 else 4)


def left_text(counter: Mapping[str, Any]) -> str:
    """What is left under the limit closest to running out, in its own unit."""
    best: tuple[float, str] | None = None
    for unit in ("nanos", "tokens", "requests"):
        limit = counter[f"limit_{unit}"]
        if limit:
            left = max(limit - counter[f"spent_{unit}"], 0)
            if best is None or left / limit < best[0]:
                best = (left / limit, _amount(unit, left))
    return "nothing" if best is None else best[1]


def _spent_text(counter: Mapping[str, Any]) -> str:
    """The spend of the limit a counter reached, as '$0.02 of $0.01'."""
    for unit in ("nanos", "tokens", "requests"):
        limit, spent = counter[f"limit_{unit}"], counter[f"spent_{unit}"]
        if limit and spent >= limit:
            if unit == "nanos":
                return f"{_amount(unit, spent)} of {_amount(unit, limit)}"
            return f"{spent:,} of {_amount(unit, limit)}"
    return "its limit"


def _in_period(budget: Budget | None, counter: Mapping[str, Any], moment: datetime) -> bool:
    return budget is not None and period_key(budget.window, moment) == counter["period"]


def refusing_now(
    counter: Mapping[str, Any], refusal: Refusal | None, budget: Budget | None, now: datetime
) -> bool:
    """The gateways refuse this counter's calls now: exhausted and enforced, or a call of
    its current period was refused within :data:`REFUSING_WITHIN`."""
    if counter["state"] == "exceeded" and counter["action"] == "enforce":
        return True
    return (
        refusal is not None
        and now - refusal.last_at <= REFUSING_WITHIN
        and _in_period(budget, counter, refusal.last_at)
    )


def refusal_reason(counter: Mapping[str, Any], refusal: Refusal | None) -> str:
    """Why the gateways refuse this counter's calls, in plain words."""
    decision = "" if refusal is None else refusal.decision
    if decision == THROTTLED:
        return "over its rate limit (requests or tokens per second or minute)"
    if decision == APPROVAL_REQUIRED:
        return "the job waits for a person's approval"
    if decision in (POLICY_DENIED, APPROVAL_DENIED):
        return "the policy or a person refused the job"
    if counter["state"] == "exceeded":
        return f"exhausted: {_spent_text(counter)} spent"
    if decision == IN_FLIGHT_BUDGET_EXCEEDED:
        return f"calls in flight could use the {left_text(counter)} left: retried once they end"
    return (
        f"a call's worst-case estimate does not fit the {left_text(counter)} left "
        "(the gateway holds a call's estimate before sending it)"
    )


async def refused_today_by_key(
    run: SpendQuery | None, caller: Caller, now: datetime
) -> dict[tuple[str, str], int] | str:
    """Refused calls since the UTC day began per (org, secret), fenced by org."""
    start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    where = [
        "outcome = 'refused'",
        f"occurred_at >= toDateTime64({quoted(start.strftime('%Y-%m-%d %H:%M:%S'))}, 6, 'UTC')",
    ]
    if caller.org_id is not None:
        where.append(f"org_id = {quoted(caller.org_id)}")
    sql = (
        f"SELECT org_id, secret_id, count() FROM usage_events WHERE {' AND '.join(where)} "
        f"GROUP BY org_id, secret_id LIMIT {MAX_KEY_ROWS}"
    )
    rows = await page_rows(run, sql, "refused calls by key")
    if isinstance(rows, str):
        return rows
    return {(str(org), str(secret)): int(calls) for org, secret, calls in map(tuple, rows)}

"""One applicable counter as a check saw it: :class:`CounterStatus`.

Spend (the verdict's), this replica's holds, the limits checked (the budget's or
its raise's) and the state the check gave it; what decisions, refusals and
``usage`` report per counter.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, final

from enforcer.plans import STATE_NAMES, Plan
from enforcer.response import iso, iso_us
from enforcer.state import CounterId, CounterVerdict
from schemas.forecast import Burn, exhausts_at_us
from schemas.ids import compose
from schemas.periods import from_micros
from schemas.raises import BudgetRaise

#: counter state names
OK: Final = "ok"
ALERT: Final = "alert"
EXCEEDED: Final = "exceeded"
IN_FLIGHT: Final = "in_flight"
TOO_LARGE: Final = "too_large"


@final
class CounterStatus:
    """One applicable counter as the check saw it (read-only for callers).

    ``state``: ok | alert | exceeded | in_flight (this request's estimate and the
    holds would pass the limit) | too_large (the estimate alone would) | failed_open |
    failed_closed (verdicts stale: not evaluated).
    The check builds one per counter (a compiled class: its integers are stored
    unboxed, one allocation per counter).
    """

    __slots__ = (
        "counter_id",
        "end_us",
        "granted",
        "held_nanos",
        "held_requests",
        "held_tokens",
        "limit_nanos",
        "limit_requests",
        "limit_tokens",
        "period",
        "plan",
        "spent_nanos",
        "spent_requests",
        "spent_tokens",
        "state_i",
        "verdict",
    )

    plan: Plan
    counter_id: CounterId
    period: str
    end_us: int | None
    verdict: CounterVerdict | None
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    held_nanos: int
    held_tokens: int
    held_requests: int
    #: the state as an index into STATE_NAMES (what the hot path compares)
    state_i: int
    #: the limits checked: the budget's, or those of the raise it has now (``granted``)
    limit_nanos: int | None
    limit_tokens: int | None
    limit_requests: int | None
    granted: BudgetRaise | None

    def __init__(
        self,
        plan: Plan,
        counter_id: CounterId,
        period: str,
        end_us: int | None,
        verdict: CounterVerdict | None,
        spent_nanos: int,
        spent_tokens: int,
        spent_requests: int,
        held_nanos: int,
        held_tokens: int,
        held_requests: int,
        state_i: int,
        limit_nanos: int | None,
        limit_tokens: int | None,
        limit_requests: int | None,
        granted: BudgetRaise | None,
    ) -> None:
        self.plan = plan
        self.counter_id = counter_id
        self.period = period
        self.end_us = end_us
        self.verdict = verdict
        self.spent_nanos = spent_nanos
        self.spent_tokens = spent_tokens
        self.spent_requests = spent_requests
        self.held_nanos = held_nanos
        self.held_tokens = held_tokens
        self.held_requests = held_requests
        self.state_i = state_i
        self.limit_nanos = limit_nanos
        self.limit_tokens = limit_tokens
        self.limit_requests = limit_requests
        self.granted = granted

    @property
    def state(self) -> str:
        return STATE_NAMES[self.state_i]

    @property
    def budget_id(self) -> str:
        return self.plan.budget_id

    @property
    def counter(self) -> str:
        """The counter key (``schemas.ids.counter_key``), as on the verdict topic."""
        return compose(self.counter_id)

    @property
    def scope_values(self) -> tuple[str, ...]:
        return self.counter_id[1:]

    @property
    def action(self) -> str:
        return "enforce" if self.plan.enforce else "warn"

    @property
    def reset_at(self) -> datetime | None:
        return None if self.end_us is None else from_micros(self.end_us)

    def used_fraction(self) -> float:
        """The largest spent/limit over the budget's limits (verdict spend, holds excluded)."""
        return used_fraction_of(self, self.spent_nanos, self.spent_tokens, self.spent_requests)

    def remaining(self) -> dict[str, int | None]:
        """What is left under each limit after verdict spend and holds (None: no such limit)."""
        return {
            "nanos": _left(self.limit_nanos, self.spent_nanos + self.held_nanos),
            "tokens": _left(self.limit_tokens, self.spent_tokens + self.held_tokens),
            "requests": _left(self.limit_requests, self.spent_requests + self.held_requests),
        }

    def burn(self) -> Burn | None:
        """The trailing-window burn of the verdict counted (None: no verdict of this
        period, a v1 verdict, a rolling window)."""
        verdict = self.verdict
        if verdict is None or verdict.period != self.period:
            return None
        return verdict.burn()

    def exhausts_at_us(self) -> int | None:
        """When the first limit checked runs out at the verdict's burn (schemas/forecast.py),
        over the spend counted (holds excluded); None when none would or one has."""
        burn = self.burn()
        if burn is None:
            return None
        return exhausts_at_us(
            burn,
            (self.spent_nanos, self.spent_tokens, self.spent_requests),
            (self.limit_nanos, self.limit_tokens, self.limit_requests),
        )

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        burn = self.burn()
        exhausts = self.exhausts_at_us()
        return {
            "budget_id": plan.budget_id,
            "scope": plan.scope,
            "scope_values": list(self.scope_values),
            "counter": self.counter,
            "action": self.action,
            "window": plan.window.spec,
            "period": self.period,
            "state": self.state,
            "spent_nanos": self.spent_nanos,
            "spent_tokens": self.spent_tokens,
            "spent_requests": self.spent_requests,
            "held_nanos": self.held_nanos,
            "held_tokens": self.held_tokens,
            "held_requests": self.held_requests,
            "limit_nanos": self.limit_nanos,
            "limit_tokens": self.limit_tokens,
            "limit_requests": self.limit_requests,
            "base_limit_nanos": plan.limit_nanos,
            "base_limit_tokens": plan.limit_tokens,
            "base_limit_requests": plan.limit_requests,
            "raise": None if self.granted is None else self.granted.to_json(),
            "remaining": self.remaining(),
            "used_pct": round(self.used_fraction() * 100, 2),
            "reset_at": iso(self.reset_at),
            "burn_per_hour": None if burn is None else burn.per_hour(),
            "exhausts_at": None if exhausts is None else iso_us(exhausts),
            "as_of": None if self.verdict is None else iso_us(self.verdict.as_of_us),
            "seq": None if self.verdict is None else self.verdict.seq,
        }


def used_fraction_of(
    row: CounterStatus, spent_nanos: int, spent_tokens: int, spent_requests: int
) -> float:
    """The largest spent / limit over the counter's limits (0.0 for none)."""
    used = 0.0
    if (limit := row.limit_nanos) and spent_nanos / limit > used:
        used = spent_nanos / limit
    if (limit := row.limit_tokens) and spent_tokens / limit > used:
        used = spent_tokens / limit
    if (limit := row.limit_requests) and spent_requests / limit > used:
        used = spent_requests / limit
    return used


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)

"""Per-policy plans: each budget with what a check needs precomputed.

A :class:`Plan` is one budget as the checker reads it (interned ids, limits, the
scope's kind, the current period cached until it ends, per-state check counts);
an :class:`Index` holds every plan of one policy version, those pinned to orgs by
``match: org_id`` apart. Rebuilt when the policies change, never per check. The
counter states a check counts per plan are numbered here (``STATE_NAMES``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from enforcer.context import Context
from enforcer.state import CounterId
from schemas.budgets import UNPRICED_REFUSE, Budget
from schemas.ids import compose
from schemas.periods import from_micros, period_end, period_key

#: the context attribute each scope reads its counter's value from
_SCOPE_ATTRIBUTE: Final = {
    "secret": "secret_id",
    "project": "project_id",
    "grant": "grant_id",
    "group": "group",
    "user": "user_id",
}
#: a time no period reaches (µs): "no end"
NEVER_US: Final = 1 << 62
#: counter states, as the hot path keeps them (indexes into per-budget metric slots)
#: (each one ``Final``: compiled, a constant is inlined; a plain module global is a dict
#: lookup at every use)
OK_I: Final = 0
ALERT_I: Final = 1
EXCEEDED_I: Final = 2
IN_FLIGHT_I: Final = 3
FAILED_OPEN_I: Final = 4
FAILED_CLOSED_I: Final = 5
#: this request's worst case alone does not fit what is left (no holds needed to refuse it)
TOO_LARGE_I: Final = 6
#: the budget's ``rate`` refuses it for now (this replica's token bucket is empty)
THROTTLED_I: Final = 7
#: an enforce USD budget whose unpriced policy is ``refuse``, for a model without a price
UNPRICED_I: Final = 8
#: a session budget's counter for a session id new to the key when the key already opened
#: ``max_sessions_per_key`` sessions today (UTC): refused, so no new counter is made
SESSIONS_I: Final = 9
STATE_NAMES: Final = (
    "ok",
    "alert",
    "exceeded",
    "in_flight",
    "failed_open",
    "failed_closed",
    "too_large",
    "throttled",
    "unpriced",
    "too_many_sessions",
)
#: how a plan reads its scope values from the context (Plan.kind)
KIND_ORG: Final = 0
KIND_ONE: Final = 1
KIND_MANY: Final = 2
KIND_SESSION: Final = 3
KIND_SECRET: Final = 4
KIND_USER: Final = 5


class Plan:
    """One budget, with what a check needs precomputed (key prefix, period cache, limits)."""

    __slots__ = (
        "alert_min",
        "budget",
        "budget_id",
        "counts",
        "enforce",
        "holdable",
        "kind",
        "limit_nanos",
        "limit_requests",
        "limit_tokens",
        "match",
        "period",
        "period_end_us",
        "period_from_us",
        "period_until_us",
        "rates",
        "refuse_unpriced",
        "scope",
        "scope_attribute",
        "spend_headers",
        "window",
    )

    def __init__(
        self, budget: Budget, counts: list[int] | None = None, unpriced_default: str = "refuse"
    ) -> None:
        self.budget = budget
        self.budget_id = sys.intern(budget.budget_id)
        self.scope = budget.scope
        self.scope_attribute = _SCOPE_ATTRIBUTE.get(budget.scope, budget.scope)
        self.window = budget.window
        self.enforce = budget.action == "enforce"
        self.limit_nanos = budget.limit_nanos
        self.limit_tokens = budget.limit_tokens
        self.limit_requests = budget.limit_requests
        self.holdable = self.enforce and (
            budget.limit_nanos is not None
            or budget.limit_tokens is not None
            or budget.limit_requests is not None
        )
        #: a request for a model without a price cannot be counted against a USD limit:
        #: refused unless the budget (or the enforcer's default) allows it at $0
        self.refuse_unpriced = (
            self.enforce
            and budget.limit_nanos is not None
            and (budget.unpriced or unpriced_default) == UNPRICED_REFUSE
        )
        self.alert_min = min(budget.alert_at) if budget.alert_at else None
        #: the budget's rate limits: (tokens, not requests; count; window µs); enforce only
        self.rates: tuple[tuple[bool, int, int], ...] = (
            tuple(
                (unit == "tokens", count, seconds * 1_000_000)
                for unit, count, seconds in budget.rate.limits()
            )
            if budget.rate is not None and self.enforce
            else ()
        )
        self.match = tuple((a, frozenset(v)) for a, v in budget.match.items())
        #: how keys() reads the scope (the hot path inlines the common kinds)
        if budget.scope == "org":
            self.kind = KIND_ORG
        elif budget.scope == "session":
            self.kind = KIND_SESSION
        elif budget.scope == "group":
            self.kind = KIND_MANY
        elif budget.scope == "secret":
            self.kind = KIND_SECRET
        elif budget.scope == "user":
            self.kind = KIND_USER
        else:  # ids and tags: one value at most
            self.kind = KIND_ONE
        #: X-Spend-Budget headers by (state, period end µs, whole percent used): warned
        #: counters repeat them request after request
        self.spend_headers: dict[tuple[int, int | None, int], tuple[str, str]] = {}
        #: per-state check counts (metrics), shared across plan rebuilds of one budget
        self.counts = counts if counts is not None else [0] * len(STATE_NAMES)
        # the current period, valid for now_us in [period_from_us, period_until_us)
        self.period = ""
        self.period_end_us: int | None = None
        self.period_from_us = NEVER_US
        self.period_until_us = 0

    def current_period(self, now_us: int) -> tuple[str, int | None]:
        """(period key, end of the period in µs or None), recomputed only when it ends."""
        if self.period_from_us <= now_us < self.period_until_us:
            return self.period, self.period_end_us
        now = from_micros(now_us)
        end = period_end(self.window, now)
        end_us = None if end is None else epoch_micros(end)
        self.period = sys.intern(period_key(self.window, now))
        self.period_end_us = end_us
        self.period_from_us = now_us if end_us is not None else 0
        self.period_until_us = NEVER_US if end_us is None else end_us
        return self.period, end_us

    def matches(self, canon: dict[str, tuple[str, ...]]) -> bool:
        """Every ``match`` attribute has a canonical value among the allowed ones."""
        for attribute, allowed in self.match:
            for value in canon.get(attribute, ()):
                if value in allowed:
                    break
            else:
                return False
        return True

    def keys(self, ctx: Context) -> Sequence[CounterId]:
        """The id (budget id, *scope values) of every counter of this budget ``ctx`` counts in.

        ``compose`` of each is what ``Budget.counter_keys(ctx)`` returns (a property test
        holds them equal; :meth:`enforcer.check.Checker.counter_ids` inlines the same rules).
        """
        if self.match and not self.matches(ctx.canon):
            return ()
        return self.scoped(ctx)

    def scoped(self, ctx: Context) -> Sequence[CounterId]:
        """:meth:`keys` without the ``match`` test."""
        canon = ctx.canon
        scope = self.scope
        if scope == "org":
            return ((self.budget_id, ctx.org),)
        if scope == "session":
            sessions = canon["session_id"]
            if not sessions:
                return ()
            identity = canon["user_id"] or canon["secret_id"]
            return ((self.budget_id, ctx.org, identity[0], sessions[0]),)
        values = canon.get(self.scope_attribute, ())
        if len(values) == 1:
            return ((self.budget_id, ctx.org, values[0]),)
        return [(self.budget_id, ctx.org, value) for value in values]


class Index:
    """Every budget as a :class:`Plan`; budgets pinned to orgs by ``match: org_id``."""

    def __init__(
        self,
        budgets: Mapping[str, Budget],
        counts: Callable[[str], list[int]] | None = None,
        unpriced_default: str = UNPRICED_REFUSE,
    ) -> None:
        self.general: list[Plan] = []
        self.by_org: dict[str, list[Plan]] = {}
        for budget_id in sorted(budgets):
            plan = Plan(
                budgets[budget_id], None if counts is None else counts(budget_id), unpriced_default
            )
            orgs = budgets[budget_id].match.get("org_id")
            if orgs:
                for org in set(orgs):
                    self.by_org.setdefault(org, []).append(plan)
            else:
                self.general.append(plan)

    def plans(self, ctx: Context) -> list[Plan]:
        pinned = self.by_org.get(ctx.org)
        return self.general if pinned is None else self.general + pinned

    def applicable(self, ctx: Context) -> list[tuple[Plan, str, tuple[str, ...]]]:
        """(plan, counter key, scope values) for every counter ``ctx`` counts in: the
        contract's ``applicable(budgets, ctx)``, computed from the index."""
        return [(plan, compose(cid), cid[1:]) for plan in self.plans(ctx) for cid in plan.keys(ctx)]


def epoch_micros(ts: datetime) -> int:
    """``ts`` in µs since the epoch (exact: no float on the way)."""
    delta = ts - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def counter_ids(plan: Plan, ctx: Context) -> tuple[CounterId | None, Sequence[CounterId] | None]:
    """(the first counter of ``plan`` that ``ctx`` counts in or None, all of them when
    several): :meth:`Plan.scoped`, inlined for org, session and one-value scopes (the
    common scopes name one counter: its id is built without a sequence around it; the
    property test against ``applicable`` covers every path)."""
    kind = plan.kind
    org = ctx.org
    if kind == KIND_ORG:
        return (plan.budget_id, org), None
    if kind == KIND_USER:
        return ((plan.budget_id, org, ctx.user), None) if ctx.user else (None, None)
    if kind == KIND_SECRET:
        return (plan.budget_id, org, ctx.secret), None
    if kind == KIND_SESSION:
        if not ctx.session:
            return None, None
        return (plan.budget_id, org, ctx.user or ctx.secret, ctx.session), None
    if kind == KIND_MANY:  # groups: one counter each
        groups = ctx.group
        if not groups:
            return None, None
        if len(groups) == 1:
            return (plan.budget_id, org, groups[0]), None
    else:  # one value (other ids, tags)
        values = ctx.canon.get(plan.scope_attribute)
        if not values:
            return None, None
        if len(values) == 1:
            return (plan.budget_id, org, values[0]), None
    many = plan.scoped(ctx)
    return many[0], many


def alert_reached(
    plan: Plan,
    limit_nanos: int | None,
    limit_tokens: int | None,
    limit_requests: int | None,
    spent_nanos: int,
    spent_tokens: int,
    spent_requests: int,
) -> bool:
    """The counter's largest spent / limit is past the budget's lowest alert threshold."""
    alert_min = plan.alert_min
    if alert_min is None or not (spent_nanos or spent_tokens or spent_requests):
        return False
    used = spent_nanos / limit_nanos if limit_nanos else 0.0
    if limit_tokens and spent_tokens / limit_tokens > used:
        used = spent_tokens / limit_tokens
    if limit_requests and spent_requests / limit_requests > used:
        used = spent_requests / limit_requests
    return used >= alert_min

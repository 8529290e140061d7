"""Which counters an event counts in, memoised: ``schemas.budgets.applicable`` keyed on
the attributes the budgets read, and per grain of time the periods and ``counts`` bytes
every event of one such set shares (the fold's plan of an event, ``process.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from aggregator.counting.priced import CountEntry, counts_bytes
from schemas.budgets import Budget

#: an hour in µs: every calendar period starts on a UTC hour
_HOUR_US = 3_600_000_000
#: the (budget, counter key, scope values, rolling bucket width in µs or 0) an event counts in
Applicable = list[tuple[Budget, str, tuple[str, ...], int]]


class EventCounts:
    """What every event of one applicable set, time grain and request flag counts in: the
    period of each counter (in ``Applicable`` order) and the PricedUsage ``counts``."""

    def __init__(self, periods: list[str], entries: list[CountEntry], month: int) -> None:
        self.periods = periods
        self.entries = entries
        self.data = counts_bytes(entries)
        #: YYYYMM of the events' occurred_at in UTC (a grain never spans two months)
        self.month = month


class ApplicableCache:
    """``schemas.budgets.applicable`` memoised on the attributes the budgets read.

    Events of one org, secret and user count in the same counters; working out the
    counter keys (canonical ids, matches, key composition) costs more than folding the
    event, so it is done once per distinct combination of the attributes any budget
    looks at, and forgotten whenever the budgets change. A new combination asks each
    budget, which answers from its own memory of the attributes it reads.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._plain: tuple[str, ...] = ()
        self._tags: tuple[str, ...] = ()
        self._groups = False
        self._each: list[_BudgetKeys] = []
        self._cache: dict[tuple[Any, ...], Applicable] = {}
        #: (id of an Applicable of ``_cache``, occurred µs // grain, counted, a further
        #: charge) -> its counts; cleared with ``_cache``, so an id always names a live list
        self.counts: dict[tuple[int, int, bool, bool], EventCounts] = {}
        #: the time within which every period key and rolling bucket stays the same
        self.grain_us = _HOUR_US

    def reset(self, budgets: Sequence[Budget]) -> None:
        self._cache.clear()
        self.counts.clear()
        self.grain_us = math.gcd(
            _HOUR_US,
            *[
                b.window.bucket_us if b.window.kind == "rolling" else b.window.grain_us
                for b in budgets
            ],
        )
        read: set[str] = set()
        self._each = []
        for budget in budgets:
            reads = _attributes_read(budget)
            read.update(reads)
            self._each.append(_BudgetKeys(budget, reads))
        self._groups, self._tags, self._plain = _split(read)

    def lookup(self, event: dict[str, Any]) -> Applicable:
        signature = _signature(event, self._plain, self._tags, self._groups)
        found = self._cache.get(signature)
        if found is None:
            if len(self._cache) >= self.limit:
                self._cache.clear()
                self.counts.clear()
                for each in self._each:
                    each.cache.clear()
            found = self._cache[signature] = []
            # a new combination mostly differs in one attribute (a new user): each budget
            # answers from its own memory unless an attribute it reads is new to it
            for each in self._each:
                found.extend(each.lookup(event))
        return found


_SCOPE_ATTRIBUTE = {
    "secret": "secret_id",
    "project": "project_id",
    "grant": "grant_id",
    "user": "user_id",
    "org": "org_id",
    "session": "session_id",
}


def _attributes_read(budget: Budget) -> set[str]:
    """The event attributes ``budget``'s counter keys depend on."""
    read = {"org_id", *budget.match, _SCOPE_ATTRIBUTE.get(budget.scope, budget.scope)}
    if budget.scope == "session":
        read.update(("session_id", "user_id", "secret_id"))
    return read


def _split(read: set[str]) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """(groups read, tag names read, plain attributes read), in a fixed order."""
    tags = tuple(sorted(a[4:] for a in read if a.startswith("tag:")))
    plain = tuple(sorted(a for a in read if a != "group" and not a.startswith("tag:")))
    return "group" in read, tags, plain


def _signature(
    event: dict[str, Any], plain: tuple[str, ...], tags: tuple[str, ...], groups: bool
) -> tuple[Any, ...]:
    signature: tuple[Any, ...] = tuple([event.get(a) for a in plain])
    if groups:
        signature += (tuple(event.get("groups") or ()),)
    if tags:
        found = event.get("tags") or {}
        signature += tuple([found.get(t) for t in tags])
    return signature


class _BudgetKeys:
    """One budget's ``counter_keys``, memoised on the attributes that budget reads."""

    def __init__(self, budget: Budget, reads: set[str]) -> None:
        self.budget = budget
        self.bucket_us = budget.window.bucket_us if budget.window.kind == "rolling" else 0
        self.groups, self.tags, self.plain = _split(reads)
        self.cache: dict[tuple[Any, ...], Applicable] = {}

    def lookup(self, event: dict[str, Any]) -> Applicable:
        signature = _signature(event, self.plain, self.tags, self.groups)
        found = self.cache.get(signature)
        if found is None:
            budget = self.budget
            bucket_us = self.bucket_us
            found = self.cache[signature] = [
                (budget, key, values, bucket_us) for key, values in budget.counter_keys(event)
            ]
        return found

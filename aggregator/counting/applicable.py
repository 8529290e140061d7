"""Which counters an event counts in, memoised: ``schemas.budgets.applicable`` keyed on
the attributes the budgets read, and per grain of time the periods and ``counts`` bytes
every event of one such set shares (the fold's plan of an event, ``process.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from aggregator.counting.priced import CountEntry, counts_bytes
from schemas.budgets import Budget, applicable

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
    looks at, and forgotten whenever the budgets change.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._budgets: Sequence[Budget] = ()
        self._plain: tuple[str, ...] = ()
        self._tags: tuple[str, ...] = ()
        self._groups = False
        self._cache: dict[tuple[Any, ...], Applicable] = {}
        #: (id of an Applicable of ``_cache``, occurred µs // grain, counted, a further
        #: charge) -> its counts; cleared with ``_cache``, so an id always names a live list
        self.counts: dict[tuple[int, int, bool, bool], EventCounts] = {}
        #: the time within which every period key and rolling bucket stays the same
        self.grain_us = _HOUR_US

    def reset(self, budgets: Sequence[Budget]) -> None:
        self._budgets = budgets
        self._cache.clear()
        self.counts.clear()
        self.grain_us = math.gcd(
            _HOUR_US,
            *[
                b.window.bucket_us if b.window.kind == "rolling" else b.window.grain_us
                for b in budgets
            ],
        )
        read: set[str] = {"org_id"}
        for budget in budgets:
            read.update(budget.match)
            read.add(_SCOPE_ATTRIBUTE.get(budget.scope, budget.scope))
            if budget.scope == "session":
                read.update(("session_id", "user_id", "secret_id"))
        self._groups = "group" in read
        self._tags = tuple(sorted(a[4:] for a in read if a.startswith("tag:")))
        self._plain = tuple(sorted(a for a in read if a != "group" and not a.startswith("tag:")))

    def lookup(self, event: dict[str, Any]) -> Applicable:
        signature: tuple[Any, ...] = tuple([event.get(a) for a in self._plain])
        if self._groups:
            signature += (tuple(event.get("groups") or ()),)
        if self._tags:
            tags = event.get("tags") or {}
            signature += tuple([tags.get(t) for t in self._tags])
        found = self._cache.get(signature)
        if found is None:
            if len(self._cache) >= self.limit:
                self._cache.clear()
                self.counts.clear()
            found = self._cache[signature] = [
                (b, key, values, b.window.bucket_us if b.window.kind == "rolling" else 0)
                for b, key, values in applicable(self._budgets, event)
            ]
        return found


_SCOPE_ATTRIBUTE = {
    "secret": "secret_id",
    "project": "project_id",
    "grant": "grant_id",
    "user": "user_id",
    "org": "org_id",
    "session": "session_id",
}

"""Reserve-and-settle: what in-flight requests may still cost, per counter.

Post-paid checks overshoot under concurrency: twenty requests that each fit
in what is left all pass before the first one's usage reaches a verdict. So,
before forwarding, an allowed request *holds* its worst-case estimate on
every enforce counter it counts in; the check adds the holds to the verdict
spend. A hold's life, per counter::

    reserve ──► held (estimate) ──settle(usage event)──► held (actual cost)
       │                                                      │
       └── release / timeout ──► dropped   verdict with as_of ≥ the event's
                                           time and a newer seq ──► dropped

* A hold is kept per (counter, period): at rollover the new period starts
  without the old period's holds.
* A settled hold is dropped on one counter when a verdict for that counter and
  period arrives whose ``as_of`` (event time of the last event applied) reaches
  the usage event's time and whose ``seq`` is newer than the verdict held when
  the hold was settled: the verdict then covers the cost, and keeping the hold
  would count it twice.
* Any hold is dropped after ``hold_timeout`` without progress (a proxy that
  crashed mid-request, a verdict that never comes): holds can only over-count
  for a bounded time.
"""

from __future__ import annotations

import itertools
from typing import Final

#: a counter's identity (enforcer.state.CounterId) and a period key
CounterId = tuple[str, ...]
CounterPeriod = tuple[CounterId, str]
#: emptied per-counter totals kept for reuse (a reserve then allocates nothing per counter)
SPARE_TOTALS: Final = 1024


class CounterHolds:
    """Running totals held on one (counter, period), and which holds make them."""

    __slots__ = ("hold_ids", "nanos", "requests", "tokens")

    def __init__(self) -> None:
        self.nanos = 0
        self.tokens = 0
        self.requests = 0
        self.hold_ids: set[int] = set()


class Hold:
    """One request's hold: its amount and the (counter, period) totals still holding it."""

    __slots__ = (
        "counters",
        "expires_us",
        "hold_id",
        "nanos",
        "occurred_us",
        "requests",
        "seq_at_settle",
        "tokens",
        "totals",
    )

    def __init__(
        self,
        hold_id: int,
        nanos: int,
        tokens: int,
        requests: int,
        expires_us: int,
        counters: list[CounterPeriod],
        totals: list[CounterHolds],
    ) -> None:
        self.hold_id = hold_id
        self.nanos = nanos
        self.tokens = tokens
        self.requests = requests
        self.expires_us = expires_us
        #: counters (and periods) still holding this hold's amount, each once
        self.counters = counters
        #: their running totals (parallel to ``counters``)
        self.totals = totals
        #: event time of the usage event once settled (None while in flight)
        self.occurred_us: int | None = None
        #: per counter: seq of the verdict held when the hold was settled
        self.seq_at_settle: dict[CounterPeriod, int] = {}


class Holds:
    """Every outstanding hold of this process. Single-threaded (one event loop)."""

    def __init__(self, timeout_us: int) -> None:
        self.timeout_us = timeout_us
        #: counter id -> period -> totals (only counters with outstanding holds)
        self.by_counter: dict[CounterId, dict[str, CounterHolds]] = {}
        self._holds: dict[int, Hold] = {}
        self._ids = itertools.count(1)
        #: emptied totals (all zero, no hold ids), reused by reserve; at most SPARE_TOTALS
        self._spare: list[CounterHolds] = []
        self.dropped_by_verdict = 0
        self.dropped_by_timeout = 0

    def __len__(self) -> int:
        return len(self._holds)

    @property
    def held_nanos(self) -> int:
        """Sum over outstanding holds (each counted once, whatever its number of counters)."""
        return sum(h.nanos for h in self._holds.values())

    def get(self, hold_id: int) -> Hold | None:
        return self._holds.get(hold_id)

    def totals(self, counter: CounterId, period: str) -> CounterHolds | None:
        periods = self.by_counter.get(counter)
        return None if periods is None else periods.get(period)

    def reserve(
        self, counters: list[CounterPeriod], *, nanos: int, tokens: int, requests: int, now_us: int
    ) -> int:
        """Hold the amounts on every counter (once each); returns the hold id."""
        hold_id = next(self._ids)
        by_counter = self.by_counter
        spare = self._spare
        held: list[CounterPeriod] = []
        held_totals: list[CounterHolds] = []
        for cp in counters:
            counter, period = cp
            periods = by_counter.get(counter)
            if periods is None:
                periods = by_counter[counter] = {}
            totals = periods.get(period)
            if totals is None:
                totals = periods[period] = spare.pop() if spare else CounterHolds()
            elif hold_id in totals.hold_ids:
                continue  # the same counter twice
            totals.nanos += nanos
            totals.tokens += tokens
            totals.requests += requests
            totals.hold_ids.add(hold_id)
            held.append(cp)
            held_totals.append(totals)
        self._holds[hold_id] = Hold(
            hold_id, nanos, tokens, requests, now_us + self.timeout_us, held, held_totals
        )
        return hold_id

    def settle(
        self,
        hold_id: int,
        *,
        nanos: int,
        tokens: int,
        requests: int,
        occurred_us: int,
        now_us: int,
        seqs: dict[CounterPeriod, int] | None = None,
    ) -> bool:
        """Replace the estimate with the actual cost; False if the hold is gone (expired)."""
        hold = self._holds.get(hold_id)
        if hold is None or hold.occurred_us is not None:
            return False
        dn, dt, dr = nanos - hold.nanos, tokens - hold.tokens, requests - hold.requests
        for totals in hold.totals:
            totals.nanos += dn
            totals.tokens += dt
            totals.requests += dr
        hold.nanos, hold.tokens, hold.requests = nanos, tokens, requests
        hold.occurred_us = occurred_us
        hold.seq_at_settle = dict(seqs or {})
        hold.expires_us = now_us + self.timeout_us
        return True

    def release(self, hold_id: int) -> bool:
        """Drop a hold entirely (the request never reached the provider)."""
        hold = self._holds.pop(hold_id, None)
        if hold is None:
            return False
        nanos, tokens, requests = hold.nanos, hold.tokens, hold.requests
        for (counter, period), totals in zip(hold.counters, hold.totals, strict=True):
            ids = totals.hold_ids
            ids.discard(hold_id)
            if ids:
                totals.nanos -= nanos
                totals.tokens -= tokens
                totals.requests -= requests
            else:
                self._forget(counter, period, totals)
        hold.counters = []
        hold.totals = []
        return True

    def on_verdict(self, counter: CounterId, period: str, as_of_us: int, seq: int) -> int:
        """A verdict arrived: drop the settled holds it covers on that counter."""
        totals = self.totals(counter, period)
        if totals is None:
            return 0
        cp = (counter, period)
        dropped = 0
        for hold_id in list(totals.hold_ids):
            hold = self._holds[hold_id]
            if (
                hold.occurred_us is not None
                and hold.occurred_us <= as_of_us
                and seq > hold.seq_at_settle.get(cp, -1)
            ):
                self._unhold(hold, cp)
                dropped += 1
                if not hold.counters:
                    del self._holds[hold_id]
        self.dropped_by_verdict += dropped
        return dropped

    def expire(self, now_us: int) -> int:
        """Drop every hold past its deadline; returns how many."""
        expired = [h for h in self._holds.values() if h.expires_us <= now_us]
        for hold in expired:
            self.release(hold.hold_id)
        self.dropped_by_timeout += len(expired)
        return len(expired)

    def _unhold(self, hold: Hold, cp: CounterPeriod) -> None:
        i = hold.counters.index(cp)
        del hold.counters[i]
        totals = hold.totals.pop(i)
        totals.hold_ids.discard(hold.hold_id)
        if totals.hold_ids:
            totals.nanos -= hold.nanos
            totals.tokens -= hold.tokens
            totals.requests -= hold.requests
        else:
            self._forget(cp[0], cp[1], totals)

    def _forget(self, counter: CounterId, period: str, totals: CounterHolds) -> None:
        """The last hold left (counter, period): drop its totals, keep the object for reuse."""
        periods = self.by_counter[counter]
        del periods[period]
        if not periods:
            del self.by_counter[counter]
        if len(self._spare) < SPARE_TOTALS:
            totals.nanos = totals.tokens = totals.requests = 0
            self._spare.append(totals)

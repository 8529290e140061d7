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
from dataclasses import dataclass, field

#: a counter's identity (enforcer.state.CounterId) and a period key
CounterId = tuple[str, ...]
CounterPeriod = tuple[CounterId, str]


@dataclass(slots=True)
class Hold:
    hold_id: int
    nanos: int
    tokens: int
    requests: int
    expires_us: int
    #: counters (and periods) still holding this hold's amount
    counters: set[CounterPeriod] = field(default_factory=set)
    #: event time of the usage event once settled (None while in flight)
    occurred_us: int | None = None
    #: per counter: seq of the verdict held when the hold was settled
    seq_at_settle: dict[CounterPeriod, int] = field(default_factory=dict)


class CounterHolds:
    """Running totals held on one (counter, period), and which holds make them."""

    __slots__ = ("hold_ids", "nanos", "requests", "tokens")

    def __init__(self) -> None:
        self.nanos = 0
        self.tokens = 0
        self.requests = 0
        self.hold_ids: set[int] = set()


class Holds:
    """Every outstanding hold of this process. Single-threaded (one event loop)."""

    def __init__(self, timeout_us: int) -> None:
        self.timeout_us = timeout_us
        #: counter id -> period -> totals (only counters with outstanding holds)
        self.by_counter: dict[CounterId, dict[str, CounterHolds]] = {}
        self._holds: dict[int, Hold] = {}
        self._ids = itertools.count(1)
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
        """Hold the amounts on every counter; returns the hold id."""
        hold_id = next(self._ids)
        hold = Hold(hold_id, nanos, tokens, requests, now_us + self.timeout_us, set(counters))
        self._holds[hold_id] = hold
        by_counter = self.by_counter
        for counter, period in hold.counters:
            periods = by_counter.get(counter)
            if periods is None:
                periods = by_counter[counter] = {}
            totals = periods.get(period)
            if totals is None:
                totals = periods[period] = CounterHolds()
            totals.nanos += nanos
            totals.tokens += tokens
            totals.requests += requests
            totals.hold_ids.add(hold_id)
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
        for counter, period in hold.counters:
            totals = self.by_counter[counter][period]
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
        for cp in list(hold.counters):
            self._unhold(hold, cp)
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
        hold.counters.discard(cp)
        counter, period = cp
        periods = self.by_counter[counter]
        totals = periods[period]
        totals.nanos -= hold.nanos
        totals.tokens -= hold.tokens
        totals.requests -= hold.requests
        totals.hold_ids.discard(hold.hold_id)
        if not totals.hold_ids:
            del periods[period]
            if not periods:
                del self.by_counter[counter]

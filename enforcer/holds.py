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

Layout (every check reserves and most release or settle within seconds, so both
are kept to a few dict operations): one flat map (counter, period) → running
totals; a hold is an immutable tuple naming the totals objects it counts in
(not new (counter, period) tuples: a check's key tuples die with the check, so
a hold in flight leaves two young objects for the garbage collector, not ten),
replaced when settled;
only *settled* holds are indexed by counter, since only they wait for a verdict.
Holds are kept in the order of their deadlines (a settled hold moves to the end),
so a timeout sweep stops at the first live hold: O(expired), not O(holds) (tens of
thousands in flight at a few thousand checks/s). A clock that steps back breaks
the order; the next sweep sorts once and carries on.
"""

from __future__ import annotations

import itertools
from typing import Final, NamedTuple, final

#: a counter's identity (enforcer.state.CounterId) and a period key
CounterId = tuple[str, ...]
CounterPeriod = tuple[CounterId, str]
#: emptied per-counter totals kept for reuse (a reserve then allocates nothing per counter)
SPARE_TOTALS: Final = 1024


@final
class CounterHolds:
    """Running totals held on one (counter, period), and how many holds make them."""

    __slots__ = ("holds", "key", "last_hold", "nanos", "requests", "tokens")

    #: the (counter id, period) these totals are held on (set by reserve)
    key: CounterPeriod

    def __init__(self) -> None:
        self.nanos = 0
        self.tokens = 0
        self.requests = 0
        #: holds counted in the totals
        self.holds = 0
        #: the last hold added (a counter named twice in one reserve is held once)
        self.last_hold = 0


class Hold(NamedTuple):
    """One request's hold: its amount and the (counter, period) totals still holding it."""

    hold_id: int
    nanos: int
    tokens: int
    requests: int
    expires_us: int
    #: the totals of the counters (and periods) still holding this hold's amount, each once
    counters: tuple[CounterHolds, ...]
    #: event time of the usage event once settled (None while in flight)
    occurred_us: int | None = None
    #: parallel to ``counters``: seq of the verdict held when settled (-1: none)
    seqs: tuple[int, ...] = ()


class Holds:
    """Every outstanding hold of this process. Single-threaded (one event loop)."""

    def __init__(self, timeout_us: int) -> None:
        self.timeout_us = timeout_us
        #: (counter id, period) -> totals (only those with outstanding holds)
        self.held: dict[CounterPeriod, CounterHolds] = {}
        #: hold id -> hold, in the order of their deadlines while ``_in_order``
        self._holds: dict[int, Hold] = {}
        self._in_order = True
        #: the latest deadline given so far (a new one below it breaks the order)
        self._last_expiry = 0
        #: (counter id, period) -> ids of the settled holds on it (what a verdict may drop)
        self._settled: dict[CounterPeriod, set[int]] = {}
        self._ids = itertools.count(1)
        #: emptied totals, reused by reserve (which sets every field); at most SPARE_TOTALS
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
        return self.held.get((counter, period))

    def reserve(
        self,
        counters: list[CounterPeriod],
        *,
        nanos: int,
        tokens: int,
        requests: int,
        now_us: int,
        found: list[CounterHolds | None] | None = None,
    ) -> int:
        """Hold the amounts on every counter (once each); returns the hold id.

        ``found``: parallel to ``counters``, the totals a caller already looked up in
        :attr:`held` (None where there were none), so they are not looked up again."""
        hold_id = next(self._ids)
        held = self.held
        spare = self._spare
        named: list[CounterHolds] = []
        for i in range(len(counters)):
            totals = None if found is None else found[i]
            if totals is None:
                # one hash of the key: insert a fresh totals object, or get the one held
                cp = counters[i]
                fresh = spare.pop() if spare else CounterHolds()
                totals = held.setdefault(cp, fresh)
                if totals is fresh:  # every field set: a reused spare keeps stale values
                    totals.key = cp
                    totals.nanos = nanos
                    totals.tokens = tokens
                    totals.requests = requests
                    totals.holds = 1
                    totals.last_hold = hold_id
                    named.append(totals)
                    continue
                if len(spare) < SPARE_TOTALS:
                    spare.append(fresh)
            if totals.last_hold == hold_id:
                continue  # the same counter twice: held once
            totals.nanos += nanos
            totals.tokens += tokens
            totals.requests += requests
            totals.holds += 1
            totals.last_hold = hold_id
            named.append(totals)
        expires_us = now_us + self.timeout_us
        if expires_us >= self._last_expiry:
            self._last_expiry = expires_us
        else:
            self._in_order = False
        # tuple.__new__: the NamedTuple without its Python-level __new__ (half the cost)
        self._holds[hold_id] = tuple.__new__(
            Hold, (hold_id, nanos, tokens, requests, expires_us, tuple(named), None, ())
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
        settled = self._settled
        for totals in hold.counters:
            totals.nanos += dn
            totals.tokens += dt
            totals.requests += dr
            cp = totals.key
            ids = settled.get(cp)
            if ids is None:
                settled[cp] = {hold_id}
            else:
                ids.add(hold_id)
        at = seqs or {}
        expires_us = now_us + self.timeout_us
        if expires_us >= self._last_expiry:
            self._last_expiry = expires_us
        else:
            self._in_order = False
        del self._holds[hold_id]  # re-inserted last: its new deadline is the latest
        self._holds[hold_id] = Hold(
            hold_id,
            nanos,
            tokens,
            requests,
            expires_us,
            hold.counters,
            occurred_us,
            tuple(at.get(totals.key, -1) for totals in hold.counters),
        )
        return True

    def release(self, hold_id: int) -> bool:
        """Drop a hold entirely (the request never reached the provider)."""
        hold = self._holds.pop(hold_id, None)
        if hold is None:
            return False
        if hold.occurred_us is not None:
            for totals in hold.counters:
                self._unsettle(totals.key, hold_id)
        held = self.held
        spare = self._spare
        nanos, tokens, requests = hold.nanos, hold.tokens, hold.requests
        for totals in hold.counters:
            if totals.holds > 1:
                totals.nanos -= nanos
                totals.tokens -= tokens
                totals.requests -= requests
                totals.holds -= 1
            else:  # _forget, inlined: every check's hold comes through here
                del held[totals.key]
                if len(spare) < SPARE_TOTALS:
                    spare.append(totals)
        return True

    def on_verdict(self, counter: CounterId, period: str, as_of_us: int, seq: int) -> int:
        """A verdict arrived: drop the settled holds it covers on that counter."""
        if not self._settled:
            return 0
        cp = (counter, period)
        ids = self._settled.get(cp)
        if ids is None:
            return 0
        dropped = 0
        for hold_id in list(ids):
            hold = self._holds[hold_id]
            assert hold.occurred_us is not None  # only settled holds are indexed
            i = [totals.key for totals in hold.counters].index(cp)
            if hold.occurred_us <= as_of_us and seq > hold.seqs[i]:
                self._unhold(hold, i)
                dropped += 1
        self.dropped_by_verdict += dropped
        return dropped

    def expire(self, now_us: int) -> int:
        """Drop every hold past its deadline; returns how many."""
        holds = self._holds
        if not self._in_order:  # the clock stepped back: sort once, by deadline
            ordered = sorted(holds.values(), key=lambda hold: hold.expires_us)
            holds.clear()
            holds.update((hold.hold_id, hold) for hold in ordered)
            self._last_expiry = ordered[-1].expires_us if ordered else 0
            self._in_order = True
        expired = []
        for hold_id, hold in holds.items():  # by deadline: the first live one ends the sweep
            if hold.expires_us > now_us:
                break
            expired.append(hold_id)
        for hold_id in expired:
            self.release(hold_id)
        self.dropped_by_timeout += len(expired)
        return len(expired)

    def _unhold(self, hold: Hold, i: int) -> None:
        """Drop a settled hold from its ``i``-th counter (a verdict covers it there)."""
        totals = hold.counters[i]
        cp = totals.key
        if totals.holds > 1:
            totals.nanos -= hold.nanos
            totals.tokens -= hold.tokens
            totals.requests -= hold.requests
            totals.holds -= 1
        else:
            self._forget(cp, totals)
        self._unsettle(cp, hold.hold_id)
        counters = hold.counters[:i] + hold.counters[i + 1 :]
        if counters:
            seqs = hold.seqs[:i] + hold.seqs[i + 1 :]
            self._holds[hold.hold_id] = hold._replace(counters=counters, seqs=seqs)
        else:
            del self._holds[hold.hold_id]

    def _unsettle(self, cp: CounterPeriod, hold_id: int) -> None:
        ids = self._settled[cp]
        ids.discard(hold_id)
        if not ids:
            del self._settled[cp]

    def _forget(self, cp: CounterPeriod, totals: CounterHolds) -> None:
        """The last hold left (counter, period): drop its totals, keep the object for reuse."""
        del self.held[cp]
        if len(self._spare) < SPARE_TOTALS:
            self._spare.append(totals)  # reserve sets every field when it reuses it

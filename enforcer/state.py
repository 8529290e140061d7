"""The enforcer's whole state, in memory: budgets, prices, verdicts.

Fed by :mod:`enforcer.follower` from three compacted topics, read from the
beginning (or directly by tests). Rules applied here, once:

* ``budget.policies`` key = budget id; a null value deletes the budget.
* ``pricing`` key = price version; a null value removes the version.
* ``budget.verdicts`` key = counter key (no period in it). A verdict whose
  ``seq`` is lower than the one held for the same period is ignored (a
  re-delivered or reordered older state). Periods are judged by this
  enforcer's clock: the verdict held for the period current *now* is the one
  enforced, and a verdict of any other period never replaces it. One of a
  later period (the aggregator's clock or an event a little ahead of ours) is
  kept aside in ``ahead`` and takes over when our clock reaches its period; one
  of an earlier period (a late event, a lagging partition) is ignored. Without
  a known budget the newer period wins. A null value deletes the counter.

Whether a held verdict's spend counts for the current period is decided at
check time (:mod:`enforcer.check`), because periods roll over with the clock,
not with messages.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from schemas import records
from schemas.budgets import Budget
from schemas.errors import ContractError
from schemas.forecast import Burn
from schemas.ids import decompose
from schemas.jobs import ApprovalBook, ApprovalStep
from schemas.periods import Window, from_micros, period_end, period_key, to_micros
from schemas.pricing import PriceBook, PriceTable
from schemas.raises import RaiseBook
from schemas.rolling import RollingSpend, rolling_spend

#: a time after every period's end (µs)
_NEVER = 1 << 62
#: a time after every bucket leaves its window (µs): the largest integer compiled code
#: keeps unboxed, so the check's comparison with it stays a machine comparison
NO_BUCKET_LEAVES: Final = (1 << 62) - 1


#: a counter's identity in memory: ``decompose(counter_key)`` = (budget id, *scope values).
#: Hashing it reuses the cached hashes of its strings; the composed key string is only
#: built for display (``compose`` is one-to-one, so both identify the same counter).
CounterId = tuple[str, ...]


@dataclass(slots=True)
class CounterVerdict:
    """The last verdict held for one counter (a trimmed Verdict record, times in µs)."""

    counter_key: str
    budget_id: str
    scope: str
    scope_values: tuple[str, ...]
    period: str
    state: str
    spent_nanos: int
    spent_tokens: int
    spent_requests: int
    reset_at_us: int | None
    as_of_us: int
    seq: int
    emitted_at_us: int
    #: the counter's trailing-window burn (Verdict v2; None in v1 records and for rolling
    #: windows): what a forecast projects from (schemas/forecast.py)
    burn_nanos: int | None = None
    burn_tokens: int | None = None
    burn_requests: int | None = None
    burn_span_us: int | None = None
    #: a rolling window's spend as its buckets leave the window (Verdict v3; None for
    #: other windows), and when the first of them leaves (``NO_BUCKET_LEAVES``: none will); the
    #: check reads the spend at its own clock once that time has come
    rolling: RollingSpend | None = None
    first_leaves_us: int = NO_BUCKET_LEAVES

    def spent_at(self, now_us: int) -> tuple[int, int, int]:
        """(nanos, tokens, requests) the verdict counts at ``now_us``: a rolling window's
        buckets that left the window by then are dropped (schemas/rolling.py)."""
        rolling = self.rolling
        if rolling is None or now_us < self.first_leaves_us:
            return self.spent_nanos, self.spent_tokens, self.spent_requests
        return rolling.at(now_us)

    @classmethod
    def from_record(cls, record: records.Verdict, cid: CounterId | None = None) -> CounterVerdict:
        """``cid``: the counter id of the message key; its strings are shared when the
        record names the same scope values (100k verdicts: less memory, fewer cache misses)."""
        reset_at = record.get("reset_at")
        scope_values = tuple(record["scope_values"])
        if cid is not None and cid[1:] == scope_values:
            scope_values = cid[1:]
        rolling = rolling_spend(record)
        first_leaves = None if rolling is None else rolling.first_leaves_at_us
        return cls(
            counter_key=record["counter_key"],
            # budget ids, scopes, states and periods repeat across counters: one string each
            budget_id=sys.intern(record["budget_id"]),
            scope=sys.intern(record["scope"]),
            scope_values=scope_values,
            period=sys.intern(record["period"]),  # compared by identity on the hot path
            state=sys.intern(record["state"]),
            spent_nanos=int(record["spent_nanos"]),
            spent_tokens=int(record["spent_tokens"]),
            spent_requests=int(record["spent_requests"]),
            reset_at_us=None if reset_at is None else to_micros(reset_at),
            as_of_us=to_micros(record["as_of"]),
            seq=int(record["seq"]),
            emitted_at_us=to_micros(record["emitted_at"]),
            burn_nanos=_optional_int(record.get("burn_nanos")),
            burn_tokens=_optional_int(record.get("burn_tokens")),
            burn_requests=_optional_int(record.get("burn_requests")),
            burn_span_us=_optional_int(record.get("burn_span_us")),
            rolling=rolling,
            first_leaves_us=NO_BUCKET_LEAVES if first_leaves is None else first_leaves,
        )

    def burn(self) -> Burn | None:
        """The verdict's trailing-window burn, or None (a v1 verdict, a rolling window)."""
        if (
            self.burn_nanos is None
            or self.burn_tokens is None
            or self.burn_requests is None
            or self.burn_span_us is None
            or self.burn_span_us <= 0
        ):
            return None
        return Burn(
            self.burn_nanos, self.burn_tokens, self.burn_requests, self.burn_span_us, self.as_of_us
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def period_is_older(candidate: str, held: str) -> bool:
    """True when both are calendar periods of one kind and ``candidate`` comes first.

    ``d:YYYY-MM-DD``, ``w:YYYY-Www`` and ``m:YYYY-MM`` sort as text; ``t`` and
    ``r:<dur>`` have one period only; different kinds (the window changed) are
    not comparable, so the newer message wins by seq.
    """
    return (
        len(candidate) > 2
        and len(held) > 2
        and candidate[0] == held[0]
        and candidate[0] in "dwm"
        and candidate < held
    )


#: called with (counter id, period, as_of µs, seq) for every verdict applied
VerdictListener = Callable[[CounterId, str, int, int], object]


class EnforcerState:
    """Budgets, price book and one verdict per counter. Single-threaded (one event loop)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: seconds since the epoch: which period is current (the enforcer's, injectable)
        self.clock = clock
        self.budgets: dict[str, Budget] = {}
        #: bumped on every policy change; the checker rebuilds its index when it moves
        self.policy_version = 0
        self.prices = PriceBook()
        self.price_version = 0
        #: temporary raises of budget limits (budget.raises), looked up per counter
        self.raises = RaiseBook()
        #: jobs' approval requests and decisions (budget.approvals), by job key
        self.approvals = ApprovalBook()
        #: counter id (decomposed counter key) -> its last verdict
        self.verdicts: dict[CounterId, CounterVerdict] = {}
        #: counter id -> a verdict of a period our clock has not reached yet (see above)
        self.ahead: dict[CounterId, CounterVerdict] = {}
        #: window -> (current period key, valid from µs, valid until µs)
        self._current: dict[Window, tuple[str, int, int]] = {}
        self.verdicts_applied = 0
        self.verdicts_ignored = 0
        #: emitted_at of the newest verdict applied (for the verdict-lag metric)
        self.last_emitted_at_us: int | None = None
        self._listeners: list[VerdictListener] = []
        #: set by the follower: caught up with the end offsets seen at start
        self.ready = False
        #: set by the follower: when (clock, µs) the verdict stream was last confirmed caught up
        self.fresh_at_us: int | None = None

    def on_verdict(self, listener: VerdictListener) -> None:
        self._listeners.append(listener)

    # --- budget.policies -------------------------------------------------------------
    def apply_policy(self, budget_id: str, record: records.BudgetPolicy | None) -> None:
        """Add, replace (``record``) or delete (None) one budget. Raises on a bad record."""
        if record is None:
            if self.budgets.pop(budget_id, None) is not None:
                self.policy_version += 1
            return
        self.budgets[budget_id] = Budget.from_record(record)
        self.policy_version += 1

    # --- budget.approvals -------------------------------------------------------------
    def apply_approval(self, job_key: str, record: records.JobApproval | None) -> None:
        """One approval step (a request or a decision); raises on a bad record."""
        if record is not None:
            self.approvals.apply(ApprovalStep.from_record(record))

    # --- budget.raises ---------------------------------------------------------------
    def apply_raise(self, raise_id: str, record: records.BudgetRaise | None) -> None:
        """Add, replace (a revocation) or remove one raise. Raises on a bad record."""
        self.raises.apply(raise_id, record)

    # --- pricing ---------------------------------------------------------------------
    def apply_price(self, version: str, record: records.PriceTable | None) -> None:
        """Add/replace (``record``) or remove (None) one price version. Raises on a bad record."""
        if record is None:
            self.prices.remove(version)
        else:
            self.prices.add(PriceTable.from_record(record))  # replaces the same version
        self.price_version += 1

    # --- budget.verdicts -------------------------------------------------------------
    def apply_verdict(self, key: str, record: records.Verdict | None) -> bool:
        """Apply one verdict (``key``: the message key, a counter key); False when ignored
        (lower seq, older period). Raises on a bad record or a malformed key."""
        parts = decompose(key)
        if not parts:
            raise ContractError(f"empty counter key {key!r}", reason="bad_key")
        # budget ids and orgs repeat across many counters: one shared string each (memory,
        # and lookups compare them by identity against the interned ids of a check)
        parts[0] = sys.intern(parts[0])
        if len(parts) > 1:
            parts[1] = sys.intern(parts[1])
        cid = tuple(parts)
        if record is None:
            self.ahead.pop(cid, None)
            return self.verdicts.pop(cid, None) is not None
        verdict = CounterVerdict.from_record(record, cid)
        held = self.verdicts.get(cid)
        if held is not None and verdict.period != held.period:
            current = self._current_period(verdict.budget_id)
            if current is None or (verdict.period != current and held.period != current):
                # neither is enforced now: the newer period wins (it is the nearer one)
                if period_is_older(verdict.period, held.period):
                    self.verdicts_ignored += 1
                    return False
            elif verdict.period == current:
                if period_is_older(current, held.period):  # the held one was ahead of us
                    self._keep_ahead(cid, held)
            else:  # the held verdict is the current period's: nothing else replaces it
                if not period_is_older(current, verdict.period) or not self._keep_ahead(
                    cid, verdict
                ):
                    self.verdicts_ignored += 1
                    return False
                self._applied(cid, verdict)
                return True
        elif held is not None and verdict.seq < held.seq:
            self.verdicts_ignored += 1
            return False
        self.verdicts[cid] = verdict
        self._applied(cid, verdict)
        return True

    def promote(self, cid: CounterId, period: str) -> CounterVerdict | None:
        """The verdict kept ahead for ``cid`` once ``period`` (current now) is its period:
        it becomes the enforced one. Called by the check when the held verdict is of
        another period and ``ahead`` is not empty."""
        verdict = self.ahead.get(cid)
        if verdict is None or verdict.period != period:
            return None
        del self.ahead[cid]
        self.verdicts[cid] = verdict
        return verdict

    def _keep_ahead(self, cid: CounterId, verdict: CounterVerdict) -> bool:
        """Keep ``verdict`` for its later period unless a newer one is kept already."""
        kept = self.ahead.get(cid)
        if kept is not None and (
            period_is_older(verdict.period, kept.period)
            or (verdict.period == kept.period and verdict.seq < kept.seq)
        ):
            return False
        self.ahead[cid] = verdict
        return True

    def _current_period(self, budget_id: str) -> str | None:
        """The period of ``budget_id`` current by this enforcer's clock (None: unknown)."""
        budget = self.budgets.get(budget_id)
        if budget is None:
            return None
        now_us = int(self.clock() * 1_000_000)
        cached = self._current.get(budget.window)
        if cached is not None and cached[1] <= now_us < cached[2]:
            return cached[0]
        now = from_micros(now_us)
        end = period_end(budget.window, now)
        key = sys.intern(period_key(budget.window, now))
        self._current[budget.window] = (key, now_us, _NEVER if end is None else to_micros(end))
        return key

    def _applied(self, cid: CounterId, verdict: CounterVerdict) -> None:
        self.verdicts_applied += 1
        if self.last_emitted_at_us is None or verdict.emitted_at_us > self.last_emitted_at_us:
            self.last_emitted_at_us = verdict.emitted_at_us
        for listener in self._listeners:
            listener(cid, verdict.period, verdict.as_of_us, verdict.seq)

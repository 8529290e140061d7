"""One counter of a check against its budget: :class:`Counting`.

Every applicable budget must pass. For one counter (spend = the verdict's, less a
rolling window's buckets that left the window by this enforcer's clock, or zero when
the verdict is of another period; limits = the budget's, or its raise's):

=========  =========================================  ==============================
action     condition                                  outcome
=========  =========================================  ==============================
enforce    spent ≥ limit                              refused: budget.refusal
                                                      (budget_exceeded, or
                                                      job_budget_exceeded for session)
enforce    spent + R × estimate > limit               refused: budget.refusal, reason
                                                      request_too_large (this request's
                                                      worst case alone does not fit)
enforce    spent + R × (held + estimate) > limit      refused: in_flight_budget_exceeded
                                                      (holds are what keeps it out)
enforce    its ``rate:`` bucket cannot admit now      refused: throttled (checked last:
                                                      a budget refusal takes no rate)
enforce    spent ≥ an alert threshold × limit         allowed, X-Spend-Budget state=alert
warn       spent ≥ limit / ≥ an alert threshold      allowed, X-Spend-Budget state=exceeded|alert
=========  =========================================  ==============================

``held`` is this process's holds and R is ``EnforcerConfig.replicas``, the number
of enforcers admitting against the same budgets: each may commit at most 1/R of
what the verdict leaves (``limit − spent``), so together they stay within it.
R = 1 is one enforcer; the multiplier is precomputed, the hot path has no branch on it.
The rate limits are the checker's last step (:mod:`enforcer.throttle`).
"""

from __future__ import annotations

from typing import Final, final

from enforcer.counters import CounterStatus
from enforcer.estimates import PriceEstimates
from enforcer.holds import CounterHolds
from enforcer.plans import (
    ALERT_I,
    EXCEEDED_I,
    IN_FLIGHT_I,
    KIND_SESSION,
    OK_I,
    SESSIONS_I,
    TOO_LARGE_I,
    UNPRICED_I,
    Plan,
    alert_reached,
)
from enforcer.sessions import SessionBound
from enforcer.state import CounterId, CounterVerdict, EnforcerState
from enforcer.tally import Tally
from schemas.rolling import RollingSpend

#: the refusals a rolling window lifts by itself, once enough old buckets left it
_REOPENING: Final = frozenset((EXCEEDED_I, TOO_LARGE_I))


@final
class Counting:
    """Counts each counter of a check into its :class:`Tally`: the counter's row (limits,
    spend, holds, state), whether it refuses, what it holds."""

    def __init__(
        self,
        state: EnforcerState,
        estimates: PriceEstimates,
        sessions: SessionBound,
        default_output: int,
    ) -> None:
        self.state = state
        self.estimates = estimates
        self.sessions = sessions
        #: output tokens held for a request that does not say its max output tokens
        self.default_output = default_output

    def count(
        self, tally: Tally, plan: Plan, counter_id: CounterId, period: str, end_us: int | None
    ) -> None:
        """One counter: its row and its state (exhausted, a session past the key's bound,
        what holding this request says (:meth:`_hold`), alerting or ok); whether it refuses.

        The limits checked are the budget's, or those of its counter's raise now
        (``raised`` lists the budgets with raises: one dict lookup when none has one); the
        spend is the verdict's, zero when the verdict is of another period."""
        granted = None
        raised = tally.raised
        if raised and plan.budget_id in raised:
            granted = tally.raises.active(plan.budget_id, counter_id[1:], tally.now_us)
        if granted is None:
            limit_nanos = plan.limit_nanos
            limit_tokens = plan.limit_tokens
            limit_requests = plan.limit_requests
        else:
            limit_nanos, limit_tokens, limit_requests = granted.limits(
                plan.limit_nanos, plan.limit_tokens, plan.limit_requests
            )
        verdict = tally.verdicts.get(counter_id)
        counted: CounterVerdict | None = None
        if verdict is not None and verdict.period == period:
            counted = verdict
        elif tally.ahead and (promoted := self.state.promote(counter_id, period)) is not None:
            # a verdict received before our clock reached its period: current now
            verdict = counted = promoted
        if counted is None:
            spent_nanos = spent_tokens = spent_requests = 0
        elif tally.now_us < counted.first_leaves_us:
            spent_nanos = counted.spent_nanos
            spent_tokens = counted.spent_tokens
            spent_requests = counted.spent_requests
        else:  # rolling buckets left the window since the verdict, by our clock
            spent_nanos, spent_tokens, spent_requests = counted.spent_at(tally.now_us)
        row = CounterStatus(
            plan=plan,
            counter_id=counter_id,
            period=period,
            end_us=end_us,
            verdict=verdict,
            spent_nanos=spent_nanos,
            spent_tokens=spent_tokens,
            spent_requests=spent_requests,
            held_nanos=0,
            held_tokens=0,
            held_requests=0,
            state_i=OK_I,
            limit_nanos=limit_nanos,
            limit_tokens=limit_tokens,
            limit_requests=limit_requests,
            granted=granted,
        )
        if (
            (limit_nanos is not None and spent_nanos >= limit_nanos)
            or (limit_tokens is not None and spent_tokens >= limit_tokens)
            or (limit_requests is not None and spent_requests >= limit_requests)
        ):
            state = EXCEEDED_I
        elif (
            plan.kind == KIND_SESSION
            and verdict is None
            and plan.enforce
            and tally.in_flight
            and not self.sessions.admits(tally.ctx, tally.now_us, tally.reserve)
        ):
            # a session id new to the key past the key's bound: its own counter would be
            # one more for every id a client makes up, each escaping the session budget
            state = SESSIONS_I
        else:
            state = self._hold(tally, plan, row) if plan.holdable else OK_I
            if (
                state == OK_I
                and (spent_nanos or spent_tokens or spent_requests)
                and plan.alert_min is not None
                and alert_reached(
                    plan,
                    limit_nanos,
                    limit_tokens,
                    limit_requests,
                    spent_nanos,
                    spent_tokens,
                    spent_requests,
                )
            ):
                state = ALERT_I
        if (
            state >= EXCEEDED_I  # one integer comparison for the common ok and alert
            and counted is not None
            and counted.rolling is not None
            and state in _REOPENING
        ):
            # a rolling window never resets as a whole: it reopens when enough of its
            # buckets have left for this request to fit (None: waiting cannot help)
            row.end_us = self._reopens_at(tally, row, counted.rolling)
            end_us = row.end_us
        row.state_i = state
        if tally.reserve:
            plan.counts[state] += 1
        if state >= EXCEEDED_I and plan.enforce:
            tally.consider_refusal(state, end_us)
        if plan.rates and tally.in_flight:
            if tally.rated is None:
                tally.rated = []
            tally.rated.append(len(tally.rows))
        tally.rows.append(row)

    def _hold(self, tally: Tally, plan: Plan, row: CounterStatus) -> int:
        """This replica's holds on the counter (into ``row``) and, checking, whether this
        request's worst case fits beside them, scaled to all replicas, within what is
        left: OK (to be held), else refused as unpriced, too large or in flight."""
        counter_period = (row.counter_id, row.period)
        held: CounterHolds | None = None
        held_nanos = held_tokens = held_requests = 0
        if tally.look_up_holds:
            held = tally.held.get(counter_period)
            if held is not None:
                held_nanos = row.held_nanos = held.nanos
                held_tokens = row.held_tokens = held.tokens
                held_requests = row.held_requests = held.requests
        if not tally.in_flight:
            return OK_I
        limit_nanos = row.limit_nanos
        self._estimate(tally, limit_nanos is not None)
        est_nanos = tally.est_nanos
        est_tokens = tally.est_tokens
        if (
            est_nanos == 0
            and plan.refuse_unpriced
            and self.estimates.unpriced(tally.ctx.model or "", tally.now_us)
        ):
            # a cost that cannot be priced cannot be held against the limit
            return UNPRICED_I
        limit_tokens = row.limit_tokens
        limit_requests = row.limit_requests
        spent_nanos = row.spent_nanos
        spent_tokens = row.spent_tokens
        spent_requests = row.spent_requests
        share = tally.share
        if (
            (
                limit_nanos is not None
                and spent_nanos + share * (held_nanos + est_nanos) > limit_nanos
            )
            or (
                limit_tokens is not None
                and spent_tokens + share * (held_tokens + est_tokens) > limit_tokens
            )
            or (
                limit_requests is not None
                and spent_requests + share * (held_requests + 1) > limit_requests
            )
        ):
            # refused: because of what is in flight, or because this request's worst case
            # alone does not fit (then waiting for the holds to settle cannot help)
            if (
                (limit_nanos is not None and spent_nanos + share * est_nanos > limit_nanos)
                or (limit_tokens is not None and spent_tokens + share * est_tokens > limit_tokens)
                or (limit_requests is not None and spent_requests + share > limit_requests)
            ):
                return TOO_LARGE_I
            return IN_FLIGHT_I
        tally.to_hold.append(counter_period)
        tally.found.append(held)
        return OK_I

    def _estimate(self, tally: Tally, priced: bool) -> None:
        """The request's worst case into ``tally``, once: its tokens, and with ``priced``
        (a USD limit is checked) its cost."""
        if tally.est_tokens < 0:
            tally.estimate_tokens(self.default_output)
        if priced and tally.est_nanos < 0:
            tally.est_nanos = self.estimates.nanos(
                tally.ctx.model or "",
                tally.est_input,
                tally.est_output,
                tally.now_us,
                tally.ctx.units,
            )

    def _reopens_at(self, tally: Tally, row: CounterStatus, rolling: RollingSpend) -> int | None:
        """When enough of a rolling window's buckets have left for this request's worst
        case, times the replicas, to fit (checking; for usage: for the counter to be under
        its limits again), by this enforcer's clock; None when it never will."""
        needs = (0, 0, 0)
        if tally.in_flight:
            self._estimate(tally, row.limit_nanos is not None)
            share = tally.share
            needs = (share * max(tally.est_nanos, 0), share * tally.est_tokens, share)
        return rolling.fits_at(
            tally.now_us, (row.limit_nanos, row.limit_tokens, row.limit_requests), needs
        )

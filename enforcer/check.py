"""The checker: check(ctx) → Decision, pure, in memory, no I/O.

The counters a request counts in are exactly those of
``schemas.budgets.applicable(budgets, ctx)`` (a property test holds the fast
path below to it); this module only precomputes, per policy version, what
``applicable`` would recompute on every call:

* budgets whose ``match`` pins ``org_id`` are indexed by org, so a check only
  looks at the budgets that can apply to its org;
* counters are looked up by id, ``(budget_id, *scope_values)`` (the decomposed
  counter key, with budget ids and orgs interned), so no key string is built
  or hashed per check; the string key is composed only for display;
* the current period of each budget is cached until the period ends, and
  worst-case estimates per (model, input, max output) until prices change.

Every applicable budget must pass. For one counter (spend = the verdict's, or
zero when the verdict is of another period; limits = the budget's):

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

When the verdicts are not ready or stale beyond ``grace``, a request that an
enforce budget applies to is decided by ``fail_mode`` (failed_open /
failed_closed); warn budgets never block.

``held`` is this process's holds and R is ``EnforcerConfig.replicas``, the number
of enforcers admitting against the same budgets: each may commit at most 1/R of
what the verdict leaves (``limit − spent``), so together they stay within it.
R = 1 is one enforcer; the multiplier is precomputed, the hot path has no branch on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from enforcer import rates
from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.estimates import PriceEstimates
from enforcer.fitting import fitting_max_tokens
from enforcer.holds import CounterHolds, Holds
from enforcer.metrics import EnforcerMetrics
from enforcer.plans import (
    ALERT_I,
    EXCEEDED_I,
    FAILED_CLOSED_I,
    FAILED_OPEN_I,
    IN_FLIGHT_I,
    KIND_SESSION,
    OK_I,
    SESSIONS_I,
    STATE_NAMES,
    THROTTLED_I,
    TOO_LARGE_I,
    UNPRICED_I,
    Index,
    Plan,
    alert_reached,
    counter_ids,
    epoch_micros,
)
from enforcer.rates import RateBucket
from enforcer.state import CounterId, EnforcerState
from enforcer.tally import Tally
from schemas.usage import (
    ALLOWED,
    FAILED_CLOSED,
    FAILED_OPEN,
    IN_FLIGHT_BUDGET_EXCEEDED,
    MAX_TOKENS_PER_EVENT,
    PRICED_TOKEN_FIELDS,
    THROTTLED,
    billed_tokens,
)

log = logging.getLogger("spendbus.enforcer.decisions")

#: a request's input is estimated at one token per this many bytes when no token
#: estimate is given (typical text runs ~4 bytes/token: 3 errs on the side of holding more)
BYTES_PER_TOKEN_ESTIMATE: Final = 3
#: the period of the bound on new session ids per key: a UTC day (µs)
SESSION_BOUND_US: Final = 86_400_000_000

Clock = Callable[[], float]


class Checker:
    """Answers check(ctx) from an :class:`EnforcerState` and :class:`Holds`."""

    def __init__(
        self,
        state: EnforcerState,
        holds: Holds,
        config: EnforcerConfig,
        metrics: EnforcerMetrics,
        clock: Clock,
    ) -> None:
        self.state = state
        self.holds = holds
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self._grace_us = config.grace_us
        self._default_output = config.default_max_output_tokens
        #: each of ``replicas`` enforcers may hold at most 1/replicas of the headroom
        self._replicas = config.replicas
        self._index = Index({})
        self._index_version = -1
        self.estimates = PriceEstimates(state)
        #: rate limits: one bucket per (counter id, index into the plan's rates)
        self._buckets: rates.Buckets = {}
        #: hold id -> the token buckets it took its worst case from (settle refunds)
        self._rate_charges: dict[int, list[tuple[RateBucket, int]]] = {}
        #: new session ids a key may open per UTC day (None: no bound), and the ones this
        #: enforcer counted today per (org, secret): a session no verdict knows yet
        self._max_sessions = config.max_sessions_per_key
        self._sessions: dict[tuple[str, str], set[str]] = {}
        self._sessions_day = -1
        #: the metric counters bumped per check (plain dicts, held here: one lookup less)
        self._decisions = metrics.decisions
        self._peeks = metrics.peeks

    @property
    def replicas(self) -> int:
        """The replica count each check's share is taken with (1/replicas of the headroom)."""
        return self._replicas

    def set_replicas(self, replicas: int) -> None:
        """A new count (enforcer.membership): the next check uses it."""
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self._replicas = replicas

    @property
    def index(self) -> Index:
        if self._index_version != self.state.policy_version:
            self._index = Index(
                self.state.budgets, self.metrics.budget_counts, self.config.unpriced_models
            )
            self._index_version = self.state.policy_version
        return self._index

    def stale_reason(self, now_us: int) -> str | None:
        state = self.state
        if not state.ready:
            return "not_ready"
        if state.fresh_at_us is None or now_us - state.fresh_at_us > self._grace_us:
            return "stale"
        return None

    def estimate_tokens(self, ctx: Context) -> tuple[int, int]:
        """(input estimate, max output) of the request, in tokens: the max output is per
        candidate (``n``), so the worst case counts every candidate's."""
        if ctx.input_tokens is not None:
            input_tokens = ctx.input_tokens
        elif ctx.request_bytes:
            input_tokens = min(
                MAX_TOKENS_PER_EVENT, -(-ctx.request_bytes // BYTES_PER_TOKEN_ESTIMATE)
            )
        else:
            input_tokens = 0
        output = ctx.max_output_tokens
        if output is None:
            output = self._default_output
        candidates = ctx.candidates
        if candidates is not None and candidates > 1:
            output = min(MAX_TOKENS_PER_EVENT, output * candidates)
        return input_tokens, output

    def check(self, ctx: Context, *, reserve: bool = True) -> Decision:
        """Decide for one request. With ``reserve``, an allowed request holds its estimate
        and the decision is counted as a check; without, it is a peek (no hold, no count)."""
        now_us = int(self.clock() * 1_000_000)
        state = self.state
        fresh_at = state.fresh_at_us
        if state.ready and fresh_at is not None and now_us - fresh_at <= self._grace_us:
            decision = self._evaluate(ctx, now_us, reserve, True)
        else:
            decision = self._stale(ctx, now_us, reserve)
        if reserve:
            self._decisions[decision.decision] += 1
        else:
            self._peeks[decision.decision] += 1
        return decision

    def usage(self, ctx: Context) -> list[CounterStatus]:
        """Every counter ``ctx`` counts in, with spend, holds and limits; holds and counts nothing."""
        now_us = int(self.clock() * 1_000_000)
        return list(self._evaluate(ctx, now_us, False, False).counters)

    # --- one check, step by step ----------------------------------------------------------
    def _evaluate(self, ctx: Context, now_us: int, reserve: bool, in_flight: bool) -> Decision:
        """Every applicable counter against its budget (the table in the module docstring):
        each counter counted (:meth:`_count`: limits, spend, holds and estimate, state),
        then the refusal (:meth:`_refused`) or the rate limits and holds of an admitted
        request (:meth:`_admit`).

        ``in_flight=False`` reports verdict states only and holds nothing (usage).
        """
        tally = Tally(ctx, now_us, reserve, in_flight, self._replicas, self.state, self.holds.held)
        canon = ctx.canon
        for plan in self._plans(ctx):
            if plan.match and not plan.matches(canon):
                continue
            counter_id, many = counter_ids(plan, ctx)
            if counter_id is None:
                continue
            if plan.period_from_us <= now_us < plan.period_until_us:
                period = plan.period
                end_us = plan.period_end_us
            else:
                period, end_us = plan.current_period(now_us)
            self._count(tally, plan, counter_id, period, end_us)
            if many is not None:
                for next_key in range(1, len(many)):
                    self._count(tally, plan, many[next_key], period, end_us)
        if tally.refusal >= 0:
            return self._refused(tally)
        return self._admit(tally)

    def _plans(self, ctx: Context) -> list[Plan]:
        """The plans of the policy version in force that can apply to ``ctx``'s org."""
        index = self._index
        if self._index_version != self.state.policy_version:
            index = self.index
        plans = index.general
        if index.by_org:
            pinned = index.by_org.get(ctx.org)
            if pinned is not None:
                plans = plans + pinned
        return plans

    def _count(
        self, tally: Tally, plan: Plan, counter_id: CounterId, period: str, end_us: int | None
    ) -> None:
        """One counter: its limits, spend and state; whether it refuses; its row.

        The limits checked are the budget's, or those of its counter's raise now
        (``raised`` lists the budgets with raises: one dict lookup when none has one); the
        spend is the verdict's, zero when the verdict is of another period. Both are read
        inline: this runs once per counter of every check."""
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
        if verdict is not None and verdict.period == period:
            spent_nanos = verdict.spent_nanos
            spent_tokens = verdict.spent_tokens
            spent_requests = verdict.spent_requests
        elif tally.ahead and (promoted := self.state.promote(counter_id, period)) is not None:
            # a verdict received before our clock reached its period: current now
            verdict = promoted
            spent_nanos = verdict.spent_nanos
            spent_tokens = verdict.spent_tokens
            spent_requests = verdict.spent_requests
        else:
            spent_nanos = spent_tokens = spent_requests = 0
        held_nanos = held_tokens = held_requests = 0
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
            and not self._session_fits(tally.ctx, tally.now_us, tally.reserve)
        ):
            # a session id new to the key past the key's bound: its own counter would be
            # one more for every id a client makes up, each escaping the session budget
            state = SESSIONS_I
        else:
            state = OK_I
            if plan.holdable:
                # this request's worst case and this replica's holds, scaled to all
                # replicas, within what is left; else refused as unpriced, too large or
                # in flight (inline: a call per counter cost more than this reads)
                counter_period = (counter_id, period)
                held: CounterHolds | None = None
                if tally.look_up_holds:
                    held = tally.held.get(counter_period)
                    if held is not None:
                        held_nanos = held.nanos
                        held_tokens = held.tokens
                        held_requests = held.requests
                if tally.in_flight:
                    if tally.est_tokens < 0:
                        tally.est_input, tally.est_output = self.estimate_tokens(tally.ctx)
                        tally.est_tokens = tally.est_input + tally.est_output
                    if limit_nanos is not None and tally.est_nanos < 0:
                        tally.est_nanos = self.estimates.nanos(
                            tally.ctx.model or "",
                            tally.est_input,
                            tally.est_output,
                            tally.now_us,
                            tally.ctx.units,
                        )
                    est_nanos = tally.est_nanos
                    est_tokens = tally.est_tokens
                    share = tally.share
                    if (
                        est_nanos == 0
                        and plan.refuse_unpriced
                        and self.estimates.unpriced(tally.ctx.model or "", tally.now_us)
                    ):
                        # a cost that cannot be priced cannot be held against the limit
                        state = UNPRICED_I
                    elif (
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
                        # refused: because of what is in flight, or because this request's
                        # worst case alone does not fit (then waiting for the holds to
                        # settle cannot help)
                        if (
                            (
                                limit_nanos is not None
                                and spent_nanos + share * est_nanos > limit_nanos
                            )
                            or (
                                limit_tokens is not None
                                and spent_tokens + share * est_tokens > limit_tokens
                            )
                            or (
                                limit_requests is not None
                                and spent_requests + share > limit_requests
                            )
                        ):
                            state = TOO_LARGE_I
                        else:
                            state = IN_FLIGHT_I
                    else:
                        tally.to_hold.append(counter_period)
                        tally.found.append(held)
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
        if tally.reserve:
            plan.counts[state] += 1
        if state >= EXCEEDED_I and plan.enforce:
            tally.consider_refusal(state, end_us)
        if plan.rates and tally.in_flight:
            if tally.rated is None:
                tally.rated = []
            tally.rated.append(len(tally.rows))
        tally.rows.append(
            CounterStatus(
                plan=plan,
                counter_id=counter_id,
                period=period,
                end_us=end_us,
                verdict=verdict,
                spent_nanos=spent_nanos,
                spent_tokens=spent_tokens,
                spent_requests=spent_requests,
                held_nanos=held_nanos,
                held_tokens=held_tokens,
                held_requests=held_requests,
                state_i=state,
                limit_nanos=limit_nanos,
                limit_tokens=limit_tokens,
                limit_requests=limit_requests,
                granted=granted,
            )
        )

    def _session_fits(self, ctx: Context, now_us: int, reserve: bool) -> bool:
        """May ``ctx``'s session, which no verdict knows, have a counter of its own? Yes
        while its key opened fewer than ``max_sessions_per_key`` sessions today (UTC);
        a reserving check counts it (a peek only asks)."""
        limit = self._max_sessions
        if limit is None:
            return True
        day = now_us // SESSION_BOUND_US
        if day != self._sessions_day:
            self._sessions = {}
            self._sessions_day = day
        key = (ctx.org, ctx.secret)
        seen = self._sessions.get(key)
        if seen is None:
            if not reserve:
                return True
            seen = self._sessions[key] = set()
        session = ctx.session
        if session in seen:
            return True
        if len(seen) >= limit:
            return False
        if reserve:
            seen.add(session)
        return True

    def _refused(self, tally: Tally) -> Decision:
        """The refusal by the refusing row; one by what is left says what would fit."""
        rows = tally.rows
        refusal = tally.refusal
        refusing = rows[refusal].plan
        value = refusing.budget.refusal if tally.hard else IN_FLIGHT_BUDGET_EXCEEDED
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "refused %s by %s counter %r", value, refusing.budget_id, rows[refusal].counter_id
            )
        ctx = tally.ctx
        decision = Decision(ctx, value, "refused", rows, refusal, tally.now_us, self.config)
        refusing_state = rows[refusal].state_i
        if (
            refusing_state != EXCEEDED_I
            and refusing_state != UNPRICED_I
            and refusing_state != SESSIONS_I
            and tally.est_tokens >= 0
        ):
            # what the request asked for, and what would fit now (the refusal says so)
            decision.request_nanos = max(tally.est_nanos, 0)
            decision.request_tokens = tally.est_tokens
            decision.replicas = tally.share
            fitting = fitting_max_tokens(
                self.state.prices,
                tally.share,
                rows,
                ctx.model or "",
                tally.est_input,
                tally.est_output,
                tally.now_us,
                ctx.units,
            )
            candidates = ctx.candidates
            if fitting is not None and candidates is not None and candidates > 1:
                fitting //= candidates  # max_tokens is per candidate
            decision.fitting_max_tokens = fitting
        return decision

    def _admit(self, tally: Tally) -> Decision:
        """No budget refuses: the rate limits may (throttled); else the request takes its
        rate and holds its worst case (with ``reserve``) and is allowed."""
        ctx = tally.ctx
        charges: list[tuple[RateBucket, int]] | None = None
        rated = tally.rated
        if rated is not None:
            if tally.est_tokens < 0:
                tally.est_input, tally.est_output = self.estimate_tokens(ctx)
                tally.est_tokens = tally.est_input + tally.est_output
            throttled = self._rate_check(
                ctx, tally.rows, rated, tally.est_tokens, tally.now_us, tally.reserve
            )
            if throttled is not None:
                return throttled
            if tally.reserve:
                charges = rates.take(self._buckets, tally.rows, rated, tally.est_tokens)
        hold_id = None
        if tally.reserve and (tally.to_hold or charges):
            hold_id = self.holds.reserve(
                tally.to_hold,
                nanos=max(tally.est_nanos, 0),
                tokens=tally.est_tokens,
                requests=1,
                now_us=tally.now_us,
                found=tally.found if tally.look_up_holds else None,
            )
            if charges:
                self._rate_charges[hold_id] = charges
        return Decision(ctx, ALLOWED, "allowed", tally.rows, -1, tally.now_us, self.config, hold_id)

    # --- rate limits ---------------------------------------------------------------------
    def _rate_check(
        self,
        ctx: Context,
        rows: list[CounterStatus],
        rated: list[int],
        tokens: int,
        now_us: int,
        reserve: bool,
    ) -> Decision | None:
        """The throttled decision when a bucket of a rated counter cannot admit now (the
        one admitting last is reported), else None."""
        share = self._replicas
        worst, worst_wait, worst_spec = rates.slowest_bucket(
            self._buckets, rows, rated, share, now_us
        )
        if worst < 0:
            return None
        row = rows[worst]
        if reserve:
            row.plan.counts[row.state_i] -= 1
            row.plan.counts[THROTTLED_I] += 1
        row.state_i = THROTTLED_I
        decision = Decision(ctx, THROTTLED, "refused", rows, worst, now_us, self.config)
        decision.throttle = (worst_spec[0], worst_spec[1], worst_spec[2], worst_wait)
        decision.replicas = share
        decision.request_tokens = tokens
        return decision

    def _rate_refund(self, hold_id: int, used_tokens: int, sent: bool) -> None:
        """Settle: give back the tokens the worst case took beyond what was used; release
        (never sent): give back everything, the request included."""
        charges = self._rate_charges.pop(hold_id, None)
        if charges is None:
            return
        rates.refund(charges, used_tokens, sent)
        if len(self._rate_charges) > 2 * len(self.holds) + 1024:
            # holds that timed out without a settle or release: their charges go too
            self._rate_charges = {
                h: c for h, c in self._rate_charges.items() if self.holds.get(h) is not None
            }

    def release(self, hold_id: int) -> bool:
        """The request never reached the provider: drop its hold, give back its rate."""
        self._rate_refund(hold_id, 0, False)
        return self.holds.release(hold_id)

    # --- stale verdicts ------------------------------------------------------------------
    def _stale(self, ctx: Context, now_us: int, reserve: bool) -> Decision:
        """Verdicts not loaded or stale: fail_mode decides requests an enforce budget covers."""
        reason = self.stale_reason(now_us) or "stale"
        index = self.index
        hits = [(plan, counter_id) for plan in index.plans(ctx) for counter_id in plan.keys(ctx)]
        if reason != "not_ready" and not any([plan.enforce for plan, _ in hits]):
            return self._evaluate(ctx, now_us, reserve, True)  # warn budgets never block
        closed = self.config.fail_mode == "closed"
        state = FAILED_CLOSED_I if closed else FAILED_OPEN_I
        rows: list[CounterStatus] = []
        first = -1
        for plan, counter_id in hits:
            period, end_us = plan.current_period(now_us)
            if first < 0 and plan.enforce:
                first = len(rows)
            if reserve:
                plan.counts[state] += 1
            granted = self.state.raises.active(plan.budget_id, counter_id[1:], now_us)
            limit_nanos, limit_tokens, limit_requests = (
                (plan.limit_nanos, plan.limit_tokens, plan.limit_requests)
                if granted is None
                else granted.limits(plan.limit_nanos, plan.limit_tokens, plan.limit_requests)
            )
            rows.append(
                CounterStatus(
                    plan=plan,
                    counter_id=counter_id,
                    period=period,
                    end_us=end_us,
                    verdict=None,
                    spent_nanos=0,
                    spent_tokens=0,
                    spent_requests=0,
                    held_nanos=0,
                    held_tokens=0,
                    held_requests=0,
                    state_i=state,
                    limit_nanos=limit_nanos,
                    limit_tokens=limit_tokens,
                    limit_requests=limit_requests,
                    granted=granted,
                )
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s (%s) for org %r", STATE_NAMES[state], reason, ctx.org_id)
        if closed:
            return Decision(
                ctx, FAILED_CLOSED, "failed_closed", rows, first, now_us, self.config, None, reason
            )
        return Decision(
            ctx, FAILED_OPEN, "failed_open", rows, -1, now_us, self.config, None, reason
        )

    # --- settle --------------------------------------------------------------------------
    def settle(self, hold_id: int, event: Mapping[str, Any]) -> bool:
        """The usage event of a held request was published: hold its actual cost instead."""
        hold = self.holds.get(hold_id)
        if hold is None:
            return False
        occurred = event["occurred_at"]
        tokens = {name: event.get(name, 0) for name in PRICED_TOKEN_FIELDS}
        price = self.state.prices.price(
            event["model"],
            at=occurred,
            units=event.get("units"),
            service_tier=event.get("service_tier"),
            **tokens,
        )
        counts = event.get("outcome", "allowed") in ("allowed", "failed_open")
        self._rate_refund(hold_id, billed_tokens(tokens), True)
        if not hold.counters:  # held for its rate limits only: nothing waits for a verdict
            self.holds.release(hold_id)
            return True
        verdicts = self.state.verdicts
        seqs = {}
        for totals in hold.counters:
            verdict = verdicts.get(totals.key[0])
            if verdict is not None:
                seqs[totals.key] = verdict.seq
        return self.holds.settle(
            hold_id,
            nanos=price.cost_nanos,
            tokens=billed_tokens(tokens),
            requests=1 if counts else 0,
            occurred_us=epoch_micros(occurred),
            now_us=int(self.clock() * 1_000_000),
            seqs=seqs,
        )

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

A check, step by step: every applicable counter counted against its budget
(:mod:`enforcer.counting`, the rules' table), then the refusal, or the rate limits
(:mod:`enforcer.throttle`) and the holds of an admitted request. Verdicts not ready
or stale: :mod:`enforcer.fail_mode`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.counting import Counting
from enforcer.decision import Decision
from enforcer.estimates import PriceEstimates, request_tokens
from enforcer.fail_mode import fail_mode_decision, stale_reason
from enforcer.fitting import fitting_max_tokens
from enforcer.holds import Holds
from enforcer.metrics import EnforcerMetrics
from enforcer.plans import (
    EXCEEDED_I,
    SESSIONS_I,
    UNPRICED_I,
    Index,
    Plan,
    counter_ids,
    epoch_micros,
)
from enforcer.sessions import SessionBound
from enforcer.state import EnforcerState
from enforcer.tally import Tally
from enforcer.throttle import Charges, RateLimits
from schemas.usage import ALLOWED, IN_FLIGHT_BUDGET_EXCEEDED, PRICED_TOKEN_FIELDS, billed_tokens

log = logging.getLogger("spendbus.enforcer.decisions")

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
        self._counting = Counting(
            state,
            self.estimates,
            SessionBound(config.max_sessions_per_key),
            config.default_max_output_tokens,
        )
        self.rate_limits = RateLimits(holds, config)
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
        return stale_reason(self.state, now_us, self._grace_us)

    def estimate_tokens(self, ctx: Context) -> tuple[int, int]:
        """(input estimate, max output) of the request, in tokens (every candidate's)."""
        return request_tokens(ctx, self._default_output)

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
        """Every applicable counter against its budget (:mod:`enforcer.counting`), then the
        refusal (:meth:`_refused`) or the rate limits and holds of an admitted request
        (:meth:`_admit`).

        ``in_flight=False`` reports verdict states only and holds nothing (usage).
        """
        tally = Tally(ctx, now_us, reserve, in_flight, self._replicas, self.state, self.holds.held)
        counting = self._counting
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
            counting.count(tally, plan, counter_id, period, end_us)
            if many is not None:
                for next_key in range(1, len(many)):
                    counting.count(tally, plan, many[next_key], period, end_us)
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
        charges: Charges | None = None
        rated = tally.rated
        if rated is not None:
            if tally.est_tokens < 0:
                tally.estimate_tokens(self._default_output)
            rate_limits = self.rate_limits
            throttled = rate_limits.throttled(
                ctx,
                tally.rows,
                rated,
                tally.est_tokens,
                tally.now_us,
                tally.reserve,
                self._replicas,
            )
            if throttled is not None:
                return throttled
            if tally.reserve:
                charges = rate_limits.take(tally.rows, rated, tally.est_tokens)
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
                self.rate_limits.keep(hold_id, charges)
        return Decision(ctx, ALLOWED, "allowed", tally.rows, -1, tally.now_us, self.config, hold_id)

    def release(self, hold_id: int) -> bool:
        """The request never reached the provider: drop its hold, give back its rate."""
        self.rate_limits.refund(hold_id, 0, False)
        return self.holds.release(hold_id)

    # --- stale verdicts ------------------------------------------------------------------
    def _stale(self, ctx: Context, now_us: int, reserve: bool) -> Decision:
        """Verdicts not loaded or stale: fail_mode decides requests an enforce budget covers."""
        reason = self.stale_reason(now_us) or "stale"
        index = self.index
        hits = [(plan, counter_id) for plan in index.plans(ctx) for counter_id in plan.keys(ctx)]
        if reason != "not_ready" and not any([plan.enforce for plan, _ in hits]):
            return self._evaluate(ctx, now_us, reserve, True)  # warn budgets never block
        return fail_mode_decision(ctx, hits, reason, now_us, reserve, self.state, self.config)

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
        self.rate_limits.refund(hold_id, billed_tokens(tokens), True)
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

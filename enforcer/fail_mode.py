"""Deciding without verdicts: when they are not loaded, or stale beyond ``grace``.

A request that an enforce budget applies to is decided by ``fail_mode``
(failed_open / failed_closed), as is every request before the state is ready (the
budgets are not known yet); once ready, warn budgets never block, so a request only
warn budgets apply to is checked as usual (the checker does that).
"""

from __future__ import annotations

import logging

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.decision import Decision
from enforcer.plans import FAILED_CLOSED_I, FAILED_OPEN_I, STATE_NAMES, Plan
from enforcer.state import CounterId, EnforcerState
from schemas.usage import FAILED_CLOSED, FAILED_OPEN

log = logging.getLogger("spendbus.enforcer.decisions")


def stale_reason(state: EnforcerState, now_us: int, grace_us: int) -> str | None:
    """Why the verdicts cannot be trusted now ("not_ready", "stale"), None when they can."""
    if not state.ready:
        return "not_ready"
    if state.fresh_at_us is None or now_us - state.fresh_at_us > grace_us:
        return "stale"
    return None


def fail_mode_decision(
    ctx: Context,
    hits: list[tuple[Plan, CounterId]],
    reason: str,
    now_us: int,
    reserve: bool,
    state: EnforcerState,
    config: EnforcerConfig,
) -> Decision:
    """``fail_mode``'s answer for ``ctx``, one failed row per counter it counts in
    (``hits``: the plans and counter ids), the first enforce one refusing when closed."""
    closed = config.fail_mode == "closed"
    failed = FAILED_CLOSED_I if closed else FAILED_OPEN_I
    rows: list[CounterStatus] = []
    first = -1
    for plan, counter_id in hits:
        period, end_us = plan.current_period(now_us)
        if first < 0 and plan.enforce:
            first = len(rows)
        if reserve:
            plan.counts[failed] += 1
        granted = state.raises.active(plan.budget_id, counter_id[1:], now_us)
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
                state_i=failed,
                limit_nanos=limit_nanos,
                limit_tokens=limit_tokens,
                limit_requests=limit_requests,
                granted=granted,
            )
        )
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s (%s) for org %r", STATE_NAMES[failed], reason, ctx.org_id)
    if closed:
        return Decision(
            ctx, FAILED_CLOSED, "failed_closed", rows, first, now_us, config, None, reason
        )
    return Decision(ctx, FAILED_OPEN, "failed_open", rows, -1, now_us, config, None, reason)

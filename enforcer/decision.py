"""What the enforcer decided for one request: :class:`Decision`.

The counters the check saw, the refusing one, the HTTP answer (built on first
read: an allowed answer here, a refusal by :mod:`enforcer.refusals`), the policy
hook's flags and the refusal's UsageEvent.
"""

from __future__ import annotations

from typing import Any, Final

from enforcer import refusals
from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus, used_fraction_of
from enforcer.plans import (
    ALERT_I,
    EXCEEDED_I,
    IN_FLIGHT_I,
    SESSIONS_I,
    STATE_NAMES,
    TOO_LARGE_I,
    UNPRICED_I,
)
from enforcer.response import Response, spend_header_of
from schemas.periods import from_micros
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

#: X-Spend-Budget headers kept per plan (cleared when full)
SPEND_HEADER_CACHE_SIZE: Final = 1024
#: an allowed request without warnings: the same answer every time
_ALLOWED_ANSWER: Final = Response(200, (), None, None)


class Decision:
    """What the enforcer decided for one request; every attribute is read-only.

    The policy-hook flags (``over_budget``, ``job_over_budget``,
    ``exceeded_budgets``, ``counters``, ``remaining``) only read what the check
    computed: reading them never counts as a request and changes nothing.
    """

    __slots__ = (
        "_config",
        "_counters",
        "_refusal",
        "_response",
        "_rows",
        "ctx",
        "decision",
        "fitting_max_tokens",
        "hold_id",
        "job_key",
        "now_us",
        "outcome",
        "reason",
        "replicas",
        "request_nanos",
        "request_tokens",
        "throttle",
    )

    def __init__(
        self,
        ctx: Context,
        decision: str,
        outcome: str,
        rows: list[CounterStatus],
        refusal: int,
        now_us: int,
        config: EnforcerConfig,
        hold_id: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.decision = decision
        self.outcome = outcome
        self._rows = rows
        self._counters: tuple[CounterStatus, ...] | None = None
        #: index of the refusing row, -1 for none
        self._refusal = refusal
        self.now_us = now_us
        self._config = config
        self.hold_id = hold_id
        #: failed_* only: ``not_ready`` or ``stale``
        self.reason = reason
        self._response: Response | None = None
        #: a refusal by what is left (too large, in flight): the request's worst case,
        #: the replica count its share was taken with, and the largest max output tokens
        #: that would be admitted now (None: not even 0); -1 / None when not computed
        self.request_nanos = -1
        self.request_tokens = -1
        self.replicas = 1
        self.fitting_max_tokens: int | None = None
        #: a throttled request: (tokens?, count, window µs, µs until it would pass)
        self.throttle: tuple[bool, int, int, int] | None = None
        #: a policy's refusal (enforcer/policy.py): the job's opaque key
        self.job_key: str | None = None

    def __repr__(self) -> str:
        return f"<Decision {self.decision} status={self.status} budget={self.budget_id!r}>"

    @property
    def allowed(self) -> bool:
        return self.outcome == "allowed" or self.outcome == "failed_open"

    @property
    def counters(self) -> tuple[CounterStatus, ...]:
        """Every applicable counter, as the check saw it."""
        if self._counters is None:
            self._counters = tuple(self._rows)
        return self._counters

    @property
    def refusing(self) -> CounterStatus | None:
        """The counter that refused (the one resetting last when several do)."""
        return None if self._refusal < 0 else self.counters[self._refusal]

    @property
    def budget_id(self) -> str | None:
        return None if self._refusal < 0 else self._rows[self._refusal].plan.budget_id

    @property
    def warnings(self) -> tuple[CounterStatus, ...]:
        """Counters past an alert threshold or a warn budget's limit (X-Spend-Budget)."""
        return tuple(
            [
                r
                for r in self._rows
                if (r.state_i == ALERT_I or r.state_i == EXCEEDED_I) and r.verdict is not None
            ]
        )

    def warning_headers(self) -> tuple[tuple[str, str], ...]:
        """``X-Spend-Budget`` of each of :attr:`warnings`, cached per plan."""
        headers = []
        for r in self._rows:
            state = r.state_i
            if state in (ALERT_I, EXCEEDED_I) and r.verdict is not None:
                plan = r.plan
                used = used_fraction_of(r, r.spent_nanos, r.spent_tokens, r.spent_requests)
                # the header reads the plan, the state, the period end and the whole percent
                key = (state, r.end_us, int(used * 100))
                cache = plan.spend_headers
                header = cache.get(key)
                if header is None:
                    if len(cache) >= SPEND_HEADER_CACHE_SIZE:
                        cache.clear()
                    header = cache[key] = spend_header_of(plan, STATE_NAMES[state], r.end_us, used)
                headers.append(header)
        return tuple(headers)

    # --- the HTTP answer --------------------------------------------------------------
    def _answer(self) -> Response:
        if self._response is None:
            outcome = self.outcome
            if outcome == "allowed" or outcome == "failed_open":
                # refusals.respond's allowed branch, here (no call into the interpreted
                # module for the common answer)
                warnings = self.warning_headers()
                self._response = (
                    Response(200, warnings, None, None) if warnings else _ALLOWED_ANSWER
                )
            else:
                self._response = refusals.respond(self, self._config)
        return self._response

    @property
    def response(self) -> Response:
        """status, headers, body and retry_after in one (built once, on first read)."""
        return self._answer()

    @property
    def status(self) -> int:
        return self._answer().status

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Refusal headers (Retry-After...), or X-Spend-Budget warnings on an allowed request."""
        return self._answer().headers

    @property
    def body(self) -> dict[str, Any] | None:
        """The JSON refusal body (None when allowed)."""
        return self._answer().body

    @property
    def retry_after(self) -> int | None:
        return self._answer().retry_after

    # --- the policy hook ----------------------------------------------------------------
    def _refusing_rows(self) -> list[CounterStatus]:
        return [
            r
            for r in self._rows
            if (
                r.state_i == EXCEEDED_I
                or r.state_i == IN_FLIGHT_I
                or r.state_i == TOO_LARGE_I
                or r.state_i == UNPRICED_I
                or r.state_i == SESSIONS_I
            )
            and r.plan.enforce
        ]

    @property
    def over_budget(self) -> bool:
        """Some enforce budget refuses this request (exhausted or in flight)."""
        return bool(self._refusing_rows())

    @property
    def job_over_budget(self) -> bool:
        """A per-job (session) ceiling refuses this request."""
        return any([r.plan.scope == "session" for r in self._refusing_rows()])

    @property
    def exceeded_budgets(self) -> tuple[str, ...]:
        """The enforce budgets refusing this request (exhausted or in flight)."""
        return tuple(dict.fromkeys([r.plan.budget_id for r in self._refusing_rows()]))

    def remaining(self) -> dict[str, dict[str, int | None]]:
        """Per counter key: what is left under each limit."""
        return {c.counter: c.remaining() for c in self.counters}

    # --- decisions are usage too -------------------------------------------------------------
    def usage_fields(self) -> dict[str, Any]:
        """Fields to set on the request's UsageEvent (outcome, decision, decision budget)."""
        return {
            "outcome": self.outcome,
            "decision": self.decision,
            "decision_budget_id": self.budget_id,
        }

    def refusal_event(
        self, *, gateway_id: str | None = None, event_id: str | None = None, **fields: Any
    ) -> UsageEvent | None:
        """The UsageEvent of a refused request (zero tokens); None when the request was allowed."""
        if self.allowed:
            return None
        ctx = self.ctx
        optional = {
            name: getattr(ctx, name)
            for name in ("project_id", "grant_id", "permission_id", "user_id", "session_id")
        }
        if any([r.state_i == SESSIONS_I for r in self._rows]):
            # a session past the key's bound: its id would open the very counter refused
            # (an aggregator counter and a verdict every enforcer holds, per new id)
            optional["session_id"] = None
        optional.update(fields)
        return new_usage_event(
            provider=ctx.provider or "unknown",
            api=ctx.api or "unknown",
            model=ctx.model or "unknown",
            secret_id=ctx.secret_id,
            org_id=ctx.org_id,
            gateway_id=gateway_id or self._config.gateway_id,
            input_tokens=0,
            output_tokens=0,
            status_code=self.status,
            occurred_at=from_micros(self.now_us),
            event_id=event_id,
            groups=list(ctx.groups),
            tags=dict(ctx.tags or {}),
            usage_source="none",
            outcome=self.outcome,
            decision=self.decision,
            decision_budget_id=self.budget_id,
            **optional,
        )

    def to_json(self, *, counters: bool = True) -> dict[str, Any]:
        """The decision as JSON (the sidecar's and ``spendbus check``'s answer)."""
        answer = self._answer()
        outcome = self.outcome
        budget_id = self.budget_id
        # only a budget refusal has refusing rows: skip the scans otherwise
        if outcome == "refused":
            refusing = self._refusing_rows()
            job = any([r.plan.scope == "session" for r in refusing])
            exceeded = list(dict.fromkeys([r.plan.budget_id for r in refusing]))
        else:
            refusing, job, exceeded = [], False, []
        out = {
            "allowed": outcome == "allowed" or outcome == "failed_open",
            "decision": self.decision,
            "outcome": outcome,
            "status": answer.status,
            "budget_id": budget_id,
            "reason": self.reason,
            "retry_after": answer.retry_after,
            "headers": [list(h) for h in answer.headers],
            "body": answer.body,
            "hold_id": self.hold_id,
            "over_budget": bool(refusing),
            "job_over_budget": job,
            "exceeded_budgets": exceeded,
            # usage_fields(), without a second lookup of the budget
            "usage_fields": {
                "outcome": outcome,
                "decision": self.decision,
                "decision_budget_id": budget_id,
            },
        }
        if counters:
            out["counters"] = [c.to_json() for c in self.counters]
        return out

"""What a refused (or warned) request is answered with, per refusal style.

``refusal_style: default`` — spendbus's own JSON::

    402  {"error": "budget_exceeded", "budget_id", "counter", "period",
          "limit_nanos", "spent_nanos", "reset_at", ...}       Retry-After: <s to reset>
    429  {"error": "job_budget_exceeded", ...}                  (session = per-job ceiling)
    402/429 {"error": "in_flight_budget_exceeded", ...}         Retry-After: in_flight_retry_after
    429  {"error": "throttled", "limit", ...}                   Retry-After: until the bucket admits
    402  {"error": "budget_exceeded", "reason": "model_unpriced", "model", ...}  (no Retry-After)
    429  {"error": "job_budget_exceeded", "reason": "too_many_sessions", "session_id",
          "max_sessions_per_key", ...}                      Retry-After: to the UTC day's end
    503  {"error": "failed_closed", "reason": ...}              Retry-After: 30
    429  {"error": "approval_required", "job", "budget_id", ...} Retry-After: approval_retry_after_s
    403  {"error": "policy_denied" | "approval_denied", "job", ...}   (the policy: enforcer/policy.py)

``refusal_style: seed000`` — seed 000's 402 body for every budget refusal.

``refusal_style: native`` — the error each provider's SDK already understands
(chosen by ``ctx.provider``; an unknown provider gets the default style):

=========  ======  ======================================================
anthropic  429     {"type":"error","error":{"type":"rate_limit_error",...}}
openai     429     {"error":{"type":"insufficient_quota","code":"insufficient_quota",...}}
gemini     429     {"error":{"code":429,"status":"RESOURCE_EXHAUSTED",...}}
bedrock    429     {"message": ...} + ``x-amzn-ErrorType: ThrottlingException``
=========  ======  ======================================================

Retry-After is the seconds until the refusing counter's period resets (for a
rolling window, until enough old buckets leave for the request to fit; absent for
``total``, and for a request no rolling window's limit can hold). Allowed requests past
an alert threshold, and warn budgets past their limit, carry one
``X-Spend-Budget: <budget>; scope=…; used=…%; state=alert|exceeded; reset=…``
header per counter.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from enforcer.config import EnforcerConfig
from enforcer.context import Context
from enforcer.counters import CounterStatus
from enforcer.response import Response, header_text, iso_us, spend_header_of
from schemas.money import format_usd
from schemas.usage import (
    APPROVAL_DENIED,
    APPROVAL_REQUIRED,
    BUDGET_EXCEEDED,
    FAILED_CLOSED,
    JOB_BUDGET_EXCEEDED,
    POLICY_DENIED,
    THROTTLED,
)

RETRY_AFTER: Final = "Retry-After"
#: not standard, but the openai and anthropic SDKs obey it over their own retry rules
SHOULD_RETRY: Final = "x-should-retry"
#: the refusal's message, where a style's body has no field for it
REFUSAL_HEADER: Final = "X-Spend-Refusal"
#: provider names (as proxies spell them) → native refusal dialect
NATIVE_DIALECTS: Final = {
    "anthropic": "anthropic",
    "openai": "openai",
    "azure": "openai",
    "azure_openai": "openai",
    "azure-openai": "openai",
    "openai_compatible": "openai",
    "gemini": "gemini",
    "google": "gemini",
    "google_ai": "gemini",
    "vertex": "gemini",
    "vertex_ai": "gemini",
    "bedrock": "bedrock",
    "aws_bedrock": "bedrock",
    "aws-bedrock": "bedrock",
}
_JSON: Final = ("Content-Type", "application/json")


class Decision(Protocol):
    """What a refusal reads of a decision (``enforcer.decision.Decision``, which calls
    :func:`respond` with itself: a shape here, so this module does not import it)."""

    ctx: Context
    decision: str
    reason: str | None
    now_us: int
    request_nanos: int
    request_tokens: int
    replicas: int
    fitting_max_tokens: int | None
    throttle: tuple[bool, int, int, int] | None
    job_key: str | None

    @property
    def allowed(self) -> bool: ...

    @property
    def refusing(self) -> CounterStatus | None: ...

    @property
    def budget_id(self) -> str | None: ...

    def warning_headers(self) -> tuple[tuple[str, str], ...]: ...


#: an allowed request without warnings: the same answer every time
_ALLOWED: Final = Response(200, (), None, None)


def dialect(provider: str | None) -> str | None:
    return None if provider is None else NATIVE_DIALECTS.get(provider.strip().lower())


def spend_header(status: CounterStatus) -> tuple[str, str]:
    return spend_header_of(status.plan, status.state, status.end_us, status.used_fraction())


def _seconds_until(end_us: int, now_us: int) -> int:
    return max(1, -(-(end_us - now_us) // 1_000_000))


def budget_retry_after(status: CounterStatus, now_us: int) -> int | None:
    """Seconds until the refusing counter resets, or until enough of a rolling window's
    buckets leave for the request to fit (its ``end_us``); None when waiting cannot help
    (a total window, or a request a rolling window's limit cannot hold)."""
    if status.end_us is not None:
        return _seconds_until(status.end_us, now_us)
    return None


def respond(decision: Decision, config: EnforcerConfig) -> Response:
    if decision.allowed:
        warnings = decision.warning_headers()
        if not warnings:
            return _ALLOWED
        return Response(200, warnings, None, None)
    style = dialect(decision.ctx.provider) if config.refusal_style == "native" else None
    if decision.decision == FAILED_CLOSED:
        return _failed_closed(decision, config, style)
    if decision.decision in _POLICY_REFUSALS:
        return _policy_refusal(decision, config, style)
    refusing = decision.refusing
    assert refusing is not None
    if decision.decision == THROTTLED:
        return _throttled(decision, refusing, style)
    if config.refusal_style == SEED000:
        style = SEED000
    value = decision.decision
    reason = _REASONS[refusing.state]
    budget = refusing.plan.budget_id
    retry_after: int | None
    if reason == MODEL_UNPRICED:
        # no price to hold or count: retrying cannot help until a price is applied
        retry_after = None
        message = (
            f"Budget {budget!r} has a USD limit and refuses model {decision.ctx.model or ''!r}: "
            "no price in force prices it, so its cost could not be counted against the "
            "limit (apply a price for it, a price-table fallback, or unpriced: allow_free)."
        )
    elif reason == TOO_MANY_SESSIONS:
        # a session the key already opened passes; a new id only once the day turns (UTC)
        retry_after = _seconds_until((decision.now_us // _DAY_US + 1) * _DAY_US, decision.now_us)
        message = (
            f"Budget {budget!r}: key {decision.ctx.secret_id!r} opened "
            f"{config.max_sessions_per_key} sessions today (UTC), the most it may "
            f"(max_sessions_per_key); session {decision.ctx.session_id!r} is new and is "
            "refused until the day ends: reuse a session id."
        )
    elif reason == IN_FLIGHT:
        # the holds of requests in flight (or not yet in a verdict) keep this one out: they
        # settle within seconds, so a retry soon may pass
        retry_after = config.in_flight_retry_after_s
        message = (
            f"Budget {budget!r}: the requests in flight could use what is left; retry when "
            "they finish." + _fit_text(decision)
        )
    else:
        retry_after = budget_retry_after(refusing, decision.now_us)
        reset = iso_us(refusing.end_us)
        until = f" until {reset}." if reset else "."
        if reason == EXHAUSTED:
            message = f"Budget {budget!r} is exhausted{until}"
        else:
            message = (
                f"Budget {budget!r}: this request's worst case "
                f"({_request_text(decision)}) does not fit what is left "
                f"({_left_text(decision, refusing)}).{_fit_text(decision)} "
                f"A retry of this request is refused{until}"
            )
    headers: list[tuple[str, str]] = [_JSON]
    if retry_after is not None:
        headers.append((RETRY_AFTER, str(retry_after)))
    # the SDKs' own retries (openai, anthropic) obey this: retrying an exhausted budget or a
    # request too large for what is left only waits for nothing
    headers.append((SHOULD_RETRY, "true" if reason == IN_FLIGHT else "false"))
    if refusing.state == "exceeded":
        headers.append(spend_header(refusing))
    session = refusing.plan.scope == "session"
    if style is None:
        status = 429 if value == JOB_BUDGET_EXCEEDED or session else 402
        body = _default_body(value, refusing)
        body["reason"] = reason
        if reason == MODEL_UNPRICED:
            body["model"] = decision.ctx.model
        elif reason == TOO_MANY_SESSIONS:
            body["session_id"] = decision.ctx.session_id
            body["max_sessions_per_key"] = config.max_sessions_per_key
        elif reason != EXHAUSTED:
            body.update(_left_fields(decision, refusing))
        body["message"] = message
        return Response(status, tuple(headers), body, retry_after)
    if style == SEED000:
        return _seed000(decision, refusing, message, headers, retry_after)
    if reason == MODEL_UNPRICED:  # the SDK's bad-request error: never retried
        return _native(style, 400, message, headers, None, quota=False, invalid=True)
    return _native(style, 429, message, headers, retry_after, quota=True)


#: why a budget refused, by the refusing counter's state (the body's ``reason``)
EXHAUSTED: Final = "exhausted"
REQUEST_TOO_LARGE: Final = "request_too_large"
IN_FLIGHT: Final = "in_flight"
MODEL_UNPRICED: Final = "model_unpriced"
TOO_MANY_SESSIONS: Final = "too_many_sessions"
_REASONS: Final = {
    "exceeded": EXHAUSTED,
    "too_large": REQUEST_TOO_LARGE,
    "in_flight": IN_FLIGHT,
    "unpriced": MODEL_UNPRICED,
    "too_many_sessions": TOO_MANY_SESSIONS,
}
#: the bound on new sessions per key resets at the next UTC midnight
_DAY_US: Final = 86_400_000_000


def _usd(nanos: int) -> str:
    return format_usd(nanos, 6)


def _request_text(decision: Decision) -> str:
    return f"{_usd(decision.request_nanos)}, {decision.request_tokens} tokens"


def _left_text(decision: Decision, refusing: CounterStatus) -> str:
    """What is left under the limits the request passes, and this replica's share of it."""
    share = decision.replicas
    parts = []
    for limit, spent, held, unit in (
        (refusing.limit_nanos, refusing.spent_nanos, refusing.held_nanos, "nanos"),
        (refusing.limit_tokens, refusing.spent_tokens, refusing.held_tokens, "tokens"),
        (refusing.limit_requests, refusing.spent_requests, refusing.held_requests, "requests"),
    ):
        if limit is None:
            continue
        left = max(0, limit - spent - held)
        text = _usd(left) if unit == "nanos" else f"{left} {unit}"
        if share > 1:
            mine = max(0, (limit - spent) // share - held)
            mine_text = _usd(mine) if unit == "nanos" else f"{mine} {unit}"
            text += f", {mine_text} of it this replica's 1/{share} share"
        parts.append(text)
    return "; ".join(parts)


def _fit_text(decision: Decision) -> str:
    fit = decision.fitting_max_tokens
    if decision.request_tokens < 0:
        return ""
    if fit is None:
        return " Not even the input fits with max_tokens 0."
    return f" The largest max_tokens that fits now is {fit}."


def _left_fields(decision: Decision, refusing: CounterStatus) -> dict[str, Any]:
    remaining = refusing.remaining()
    return {
        "remaining_nanos": remaining["nanos"],
        "remaining_tokens": remaining["tokens"],
        "remaining_requests": remaining["requests"],
        "held_tokens": refusing.held_tokens,
        "held_requests": refusing.held_requests,
        "request_nanos": decision.request_nanos,
        "request_tokens": decision.request_tokens,
        "replicas": decision.replicas,
        "max_tokens_that_fits": decision.fitting_max_tokens,
    }


def _default_body(value: str, refusing: CounterStatus) -> dict[str, Any]:
    plan = refusing.plan
    body: dict[str, Any] = {
        "error": value,
        "budget_id": plan.budget_id,
        "counter": refusing.counter,
        "period": refusing.period,
        "limit_nanos": refusing.limit_nanos,
        "spent_nanos": refusing.spent_nanos,
        "reset_at": iso_us(refusing.end_us),
        "limit_tokens": refusing.limit_tokens,
        "spent_tokens": refusing.spent_tokens,
        "limit_requests": refusing.limit_requests,
        "spent_requests": refusing.spent_requests,
        "held_nanos": refusing.held_nanos,
    }
    if refusing.granted is not None:
        # a raised counter: its base limits and the raise, beside the limits checked
        body["base_limit_nanos"] = plan.limit_nanos
        body["base_limit_tokens"] = plan.limit_tokens
        body["base_limit_requests"] = plan.limit_requests
        body["raise"] = refusing.granted.to_json()
    return body


def _throttled(decision: Decision, refusing: CounterStatus, style: str | None) -> Response:
    """429 ``throttled``: this replica's share of the budget's rate is used up for now;
    Retry-After (and ``retry-after-ms``, which the openai and anthropic SDKs prefer) is
    when its bucket admits again, and a retry is welcome."""
    throttle = decision.throttle
    assert throttle is not None
    tokens, count, window_us, wait_us = throttle
    unit = "tokens" if tokens else "requests"
    window = "second" if window_us == 1_000_000 else "minute"
    retry_after = max(1, -(-wait_us // 1_000_000))
    retry_ms = max(1, -(-wait_us // 1000))
    budget = refusing.plan.budget_id
    share = decision.replicas
    message = (
        f"Budget {budget!r}: rate limit of {count} {unit} per {window} reached"
        + (f" (this replica's 1/{share} share)" if share > 1 else "")
        + f"; retry in {retry_ms} ms."
    )
    headers: list[tuple[str, str]] = [
        _JSON,
        (RETRY_AFTER, str(retry_after)),
        ("retry-after-ms", str(retry_ms)),
        (SHOULD_RETRY, "true"),
    ]
    if style is None or style == SEED000:
        body: dict[str, Any] = {
            "error": THROTTLED,
            "budget_id": budget,
            "counter": refusing.counter,
            "limit": {"unit": unit, "count": count, "per": window},
            "replicas": share,
            "retry_after_ms": retry_ms,
            "message": message,
        }
        return Response(429, tuple(headers), body, retry_after)
    return _native(style, 429, message, headers, retry_after, quota=True, rate=unit)


#: the refusal style of seed 000's gateway: its 402 body, field for field
SEED000: Final = "seed000"
_NANOS_PER_CENT: Final = 10_000_000


def _seed000(
    decision: Decision,
    refusing: CounterStatus,
    message: str,
    headers: list[tuple[str, str]],
    retry_after: int | None,
) -> Response:
    """Seed 000's 402 ``{"error":"budget_exceeded","secretId","period","limitCents",
    "spentCents"}``, whichever budget rule refused (its clients know one refusal); the
    limit in whole cents rounded down, the spend rounded up, so an exhausted budget reads
    spentCents >= limitCents; null for a budget without a USD limit. The message stays in
    an ``X-Spend-Refusal`` header (the body has no room for it)."""
    limit = refusing.limit_nanos
    spent = refusing.spent_nanos
    body = {
        "error": BUDGET_EXCEEDED,
        "secretId": decision.ctx.secret_id,
        "period": refusing.period,
        "limitCents": None if limit is None else limit // _NANOS_PER_CENT,
        "spentCents": None if limit is None else -(-spent // _NANOS_PER_CENT),
    }
    headers = [*headers, (REFUSAL_HEADER, header_text(message))]
    return Response(402, tuple(headers), body, retry_after)


def _failed_closed(decision: Decision, config: EnforcerConfig, style: str | None) -> Response:
    retry_after = config.fail_closed_retry_after_s
    headers = [_JSON, (RETRY_AFTER, str(retry_after))]
    if decision.reason == "policy_error":
        message = "The spend policy could not be evaluated (fail_mode: closed); retry later."
    else:
        message = (
            "Spend limits cannot be verified right now (budget verdicts are "
            f"{'not loaded' if decision.reason == 'not_ready' else 'stale'}); retry later."
        )
    if style is None:
        body = {
            "error": FAILED_CLOSED,
            "reason": decision.reason,
            "budget_id": decision.budget_id,
            "message": message,
        }
        return Response(503, tuple(headers), body, retry_after)
    return _native(style, 503, message, headers, retry_after, quota=False)


_POLICY_REFUSALS: Final = frozenset({APPROVAL_REQUIRED, POLICY_DENIED, APPROVAL_DENIED})


def _policy_refusal(decision: Decision, config: EnforcerConfig, style: str | None) -> Response:
    """The policy's refusals: 429 ``approval_required`` (the job waits for a person;
    Retry-After ``approval_retry_after_s``), 403 ``policy_denied`` / ``approval_denied``
    (no Retry-After: waiting does not help). The job is named by its opaque key only."""
    value = decision.decision
    job = decision.job_key
    budget = decision.budget_id
    retry_after: int | None = None
    if value == APPROVAL_REQUIRED:
        status = 429
        retry_after = config.approval_retry_after_s
        message = (
            f"Job {job} needs an approval to go on (the spend policy asked for one"
            + (f"; budget {budget!r}" if budget else "")
            + "): an operator decides with spendbus approvals; retry later."
        )
    elif value == APPROVAL_DENIED:
        status = 403
        message = f"Job {job} was denied by an operator (spendbus approvals deny)."
    else:
        status = 403
        message = "The spend policy refuses this request." + (
            " (The policy asked for an approval, and a request without a session is no job "
            "to approve.)"
            if decision.reason == "no_session"
            else ""
        )
    headers: list[tuple[str, str]] = [_JSON]
    if retry_after is not None:
        headers.append((RETRY_AFTER, str(retry_after)))
    # an SDK's own retries would only wait for a person (or for nothing)
    headers.append((SHOULD_RETRY, "false"))
    if style is None or style == SEED000:
        body: dict[str, Any] = {
            "error": value,
            "job": job,
            "budget_id": budget,
            "reason": decision.reason,
            "retry_after": retry_after,
            "message": message,
        }
        return Response(status, tuple(headers), body, retry_after)
    return _native(style, status, message, headers, retry_after, quota=True)


def _native(
    style: str,
    status: int,
    message: str,
    headers: list[tuple[str, str]],
    retry_after: int | None,
    *,
    quota: bool,
    rate: str | None = None,
    invalid: bool = False,
) -> Response:
    """``rate``: a rate limit (``requests`` | ``tokens``), which OpenAI words as
    ``rate_limit_exceeded`` rather than ``insufficient_quota``; ``invalid``: a request the
    enforcer will never admit as it is (each SDK's bad-request error)."""
    body: dict[str, Any]
    if invalid:
        if style == "anthropic":
            body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        elif style == "openai":
            body = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_unpriced",
                }
            }
        elif style == "gemini":
            body = {"error": {"code": status, "message": message, "status": "INVALID_ARGUMENT"}}
        else:  # bedrock
            headers = [*headers, ("x-amzn-ErrorType", "ValidationException")]
            body = {"message": message}
        return Response(status, tuple(headers), body, retry_after)
    if style == "anthropic":
        kind = "rate_limit_error" if quota else "api_error"
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif style == "openai":
        if rate is not None:
            body = {
                "error": {
                    "message": message,
                    "type": rate,
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
            return Response(status, tuple(headers), body, retry_after)
        kind = "insufficient_quota" if quota else "server_error"
        body = {
            "error": {
                "message": message,
                "type": kind,
                "param": None,
                "code": kind if quota else None,
            }
        }
    elif style == "gemini":
        body = {
            "error": {
                "code": status,
                "message": message,
                "status": "RESOURCE_EXHAUSTED" if quota else "UNAVAILABLE",
            }
        }
    else:  # bedrock
        kind = "ThrottlingException" if quota else "ServiceUnavailableException"
        headers = [*headers, ("x-amzn-ErrorType", kind)]
        body = {"message": message}
    return Response(status, tuple(headers), body, retry_after)

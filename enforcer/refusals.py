"""What a refused (or warned) request is answered with, per refusal style.

``refusal_style: default`` — spendbus's own JSON::

    402  {"error": "budget_exceeded", "budget_id", "counter", "period",
          "limit_nanos", "spent_nanos", "reset_at", ...}       Retry-After: <s to reset>
    429  {"error": "job_budget_exceeded", ...}                  (session = per-job ceiling)
    402/429 {"error": "in_flight_budget_exceeded", ...}         Retry-After: in_flight_retry_after
    503  {"error": "failed_closed", "reason": ...}              Retry-After: 30

``refusal_style: native`` — the error each provider's SDK already understands
(chosen by ``ctx.provider``; an unknown provider gets the default style):

=========  ======  ======================================================
anthropic  429     {"type":"error","error":{"type":"rate_limit_error",...}}
openai     429     {"error":{"type":"insufficient_quota","code":"insufficient_quota",...}}
gemini     429     {"error":{"code":429,"status":"RESOURCE_EXHAUSTED",...}}
bedrock    429     {"message": ...} + ``x-amzn-ErrorType: ThrottlingException``
=========  ======  ======================================================

Retry-After is the seconds until the refusing counter's period resets (the
bucket width for rolling windows, absent for ``total``). Allowed requests past
an alert threshold, and warn budgets past their limit, carry one
``X-Spend-Budget: <budget>; scope=…; used=…%; state=alert|exceeded; reset=…``
header per counter.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, NamedTuple
from urllib.parse import quote

from schemas.periods import from_micros
from schemas.usage import (
    FAILED_CLOSED,
    IN_FLIGHT_BUDGET_EXCEEDED,
    JOB_BUDGET_EXCEEDED,
)

if TYPE_CHECKING:
    from enforcer.check import CounterStatus, Decision, Plan
    from enforcer.config import EnforcerConfig

SPEND_HEADER: Final = "X-Spend-Budget"
RETRY_AFTER: Final = "Retry-After"
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
# RFC 9110 token characters other than alphanumerics, minus the header's own separators
_HEADER_SAFE: Final = "!#$%&'*+-.^_`|~:@/()[]{}<>?="


class Response(NamedTuple):
    """What the proxy answers (immutable; a tuple: built once per check, it must be cheap)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: dict[str, Any] | None
    retry_after: int | None


#: an allowed request without warnings: the same answer every time
_ALLOWED: Final = Response(200, (), None, None)


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=4096)  # period ends repeat across requests
def iso_us(us: int | None) -> str | None:
    return None if us is None else iso(from_micros(us))


@lru_cache(maxsize=4096)  # budget ids and scopes repeat
def header_text(value: str) -> str:
    """A value safe inside a header parameter (no CR/LF, no ``;`` or ``,``)."""
    return quote(value, safe=_HEADER_SAFE)


def dialect(provider: str | None) -> str | None:
    return None if provider is None else NATIVE_DIALECTS.get(provider.strip().lower())


def spend_header(status: CounterStatus) -> tuple[str, str]:
    return spend_header_of(status.plan, status.state, status.end_us, status.used_fraction())


def spend_header_of(
    plan: Plan, state: str, end_us: int | None, used_fraction: float
) -> tuple[str, str]:
    """The X-Spend-Budget header of one counter (``state``: a CounterStatus state name)."""
    state = "exceeded" if state in ("exceeded", "in_flight") else state
    reset = iso_us(end_us) or ("rolling" if plan.window.kind == "rolling" else "never")
    used = int(used_fraction * 100)
    return (
        SPEND_HEADER,
        f"{header_text(plan.budget_id)}; scope={header_text(plan.scope)}; "
        f"used={used}%; state={state}; reset={reset}",
    )


def _seconds_until(end_us: int, now_us: int) -> int:
    return max(1, -(-(end_us - now_us) // 1_000_000))


def budget_retry_after(status: CounterStatus, now_us: int) -> int | None:
    if status.end_us is not None:
        return _seconds_until(status.end_us, now_us)
    window = status.plan.window
    if window.kind == "rolling":
        return max(1, -(-window.bucket_us // 1_000_000))
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
    refusing = decision.refusing
    assert refusing is not None
    value = decision.decision
    if value == IN_FLIGHT_BUDGET_EXCEEDED:
        retry_after: int | None = config.in_flight_retry_after_s
        message = (
            f"Budget {refusing.plan.budget_id!r}: the requests in flight could use what is "
            "left; retry when they finish."
        )
    else:
        retry_after = budget_retry_after(refusing, decision.now_us)
        reset = iso_us(refusing.end_us)
        message = f"Budget {refusing.plan.budget_id!r} is exhausted" + (
            f" until {reset}." if reset else "."
        )
    headers: list[tuple[str, str]] = [_JSON]
    if retry_after is not None:
        headers.append((RETRY_AFTER, str(retry_after)))
    if refusing.state == "exceeded":
        headers.append(spend_header(refusing))
    session = refusing.plan.scope == "session"
    if style is None:
        status = 429 if value == JOB_BUDGET_EXCEEDED or session else 402
        body = _default_body(value, refusing)
        body["message"] = message
        return Response(status, tuple(headers), body, retry_after)
    return _native(style, 429, message, headers, retry_after, quota=True)


def _default_body(value: str, refusing: CounterStatus) -> dict[str, Any]:
    plan = refusing.plan
    return {
        "error": value,
        "budget_id": plan.budget_id,
        "counter": refusing.counter,
        "period": refusing.period,
        "limit_nanos": plan.limit_nanos,
        "spent_nanos": refusing.spent_nanos,
        "reset_at": iso_us(refusing.end_us),
        "limit_tokens": plan.limit_tokens,
        "spent_tokens": refusing.spent_tokens,
        "limit_requests": plan.limit_requests,
        "spent_requests": refusing.spent_requests,
        "held_nanos": refusing.held_nanos,
    }


def _failed_closed(decision: Decision, config: EnforcerConfig, style: str | None) -> Response:
    retry_after = config.fail_closed_retry_after_s
    headers = [_JSON, (RETRY_AFTER, str(retry_after))]
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


def _native(
    style: str,
    status: int,
    message: str,
    headers: list[tuple[str, str]],
    retry_after: int | None,
    *,
    quota: bool,
) -> Response:
    body: dict[str, Any]
    if style == "anthropic":
        kind = "rate_limit_error" if quota else "api_error"
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif style == "openai":
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

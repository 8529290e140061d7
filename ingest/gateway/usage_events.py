"""The UsageEvents a tap result becomes: the call's own event and the charges billed apart."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ingest.taps import TapResult
from schemas.records import UsageEvent
from schemas.usage import TOKEN_FIELDS, new_usage_event

from .call import Call


def tap_usage_event(
    call: Call,
    result: TapResult,
    *,
    api: str,
    gateway_id: str,
    status_code: int,
    decision_fields: Mapping[str, Any],
    **response_fields: Any,
) -> UsageEvent:
    """The call's UsageEvent from what its tap read (``decision_fields``: the gate's
    ``usage_fields()``; ``response_fields``: request_id, latency_ms when known).

    Raises ``InvalidRecord`` (it cannot happen for a context the gate accepted)."""
    principal = call.vk.principal
    return new_usage_event(
        provider=call.upstream.provider_name,
        api=api,
        model=result.model or call.model or "unknown",
        secret_id=principal.secret_id,
        org_id=principal.org_id,
        gateway_id=gateway_id,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cache_read_tokens=result.cache_read_tokens,
        cache_write_tokens=result.cache_write_tokens,
        cache_write_1h_tokens=result.cache_write_1h_tokens,
        reasoning_tokens=result.reasoning_tokens,
        usage_source=result.usage_source,
        estimate_reason=result.estimate_reason,
        units=dict(result.units),
        service_tier=result.service_tier,
        status_code=status_code,
        project_id=principal.project_id,
        grant_id=principal.grant_id,
        user_id=principal.user_id,
        groups=list(principal.groups),
        tags=dict(principal.tags),
        session_id=call.session_id,
        stream=call.stream,
        **response_fields,
        **decision_fields,
    )


#: the fields a separate charge takes from the call's event (who, where, when, how)
CHARGE_COPIED = (
    "occurred_at",
    "provider",
    "api",
    "secret_id",
    "org_id",
    "gateway_id",
    "project_id",
    "grant_id",
    "permission_id",
    "user_id",
    "groups",
    "session_id",
    "tags",
    "outcome",
    "decision",
    "decision_budget_id",
    "status_code",
    "stream",
    "request_id",
    "service_tier",
)


def separate_charge_fields(event: Mapping[str, Any], result: TapResult) -> Iterator[dict[str, Any]]:
    """The fields of each charge billed apart at its own model (a declined fallback hop
    that wrote output): an event of its own that names the call (charge_of) and counts
    no request. Each is for ``new_usage_event(**fields)``."""
    for number, charge in enumerate(result.separate_charges, 1):
        yield {
            **{k: event[k] for k in CHARGE_COPIED},
            "event_id": f"{event['event_id']}.charge-{number}",
            "model": charge.model or event["model"],
            **{name: getattr(charge, name) for name in TOKEN_FIELDS},
            "usage_source": charge.usage_source,
            "charge_of": event["event_id"],
        }

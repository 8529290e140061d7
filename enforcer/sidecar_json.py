"""The sidecar's JSON: bodies read with msgspec, decisions written (the allowed answer
by a short path, byte for byte what ``Decision.to_json`` encodes to), error answers.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Any, Final

import msgspec
from aiohttp import web

from enforcer.decision import Decision

MAX_BODY: Final = 256 * 1024
# msgspec's JSON codec (C): the sidecar's requests and answers are small and many, and it
# reads and writes them faster than the stdlib
dumps = msgspec.json.Encoder().encode
loads = msgspec.json.Decoder().decode
JSON_TYPE: Final = "application/json"


# An allowed answer (the common one) is written from these pieces instead of building
# Decision.to_json()'s dict and encoding it: the same bytes (a test holds every kind of
# decision to it), with only the warning headers and the hold id filled in.
_ALLOWED_HEAD: Final = (
    b'{"allowed":true,"decision":"allowed","outcome":"allowed","status":200,'
    b'"budget_id":null,"reason":null,"retry_after":null,"headers":'
)
_ALLOWED_HOLD: Final = b',"body":null,"hold_id":'
_ALLOWED_TAIL: Final = (
    b',"over_budget":false,"job_over_budget":false,"exceeded_budgets":[],'
    b'"usage_fields":{"outcome":"allowed","decision":"allowed","decision_budget_id":null}}'
)


def decision_json(
    decision: Decision,
    *,
    counters: bool = False,
    hold_id: str | int | EllipsisType | None = ...,
) -> bytes:
    """``Decision.to_json(counters=...)`` encoded as JSON, by the short path when allowed;
    ``hold_id`` replaces the decision's own (the sidecar writes its opaque id for it)."""
    if hold_id is ...:
        hold_id = decision.hold_id
    if counters or decision.outcome != "allowed":
        return dumps(decision_dict(decision, counters=counters, hold_id=hold_id))
    answer = decision.response
    if answer.status != 200 or answer.body is not None or answer.retry_after is not None:
        # not the allowed answer's shape
        return dumps(decision_dict(decision, counters=counters, hold_id=hold_id))
    headers = answer.headers
    return b"".join(
        (
            _ALLOWED_HEAD,
            dumps(headers) if headers else b"[]",  # tuples encode as arrays, as lists do
            _ALLOWED_HOLD,
            b"null" if hold_id is None else dumps(hold_id),
            _ALLOWED_TAIL,
        )
    )


def decision_dict(
    decision: Decision, *, counters: bool = False, hold_id: str | int | None
) -> dict[str, Any]:
    """``Decision.to_json(counters=...)`` with ``hold_id`` in place of the decision's own."""
    out = decision.to_json(counters=counters)
    out["hold_id"] = hold_id
    return out


def invalid_json(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        body=dumps({"error": "invalid_json", "message": message}), content_type=JSON_TYPE
    )


def body_refused(status: int, message: str) -> web.HTTPException:
    """A body refused unread: 413 (too large) or 408 (too slow); the connection closes."""
    exc: web.HTTPException
    if status == 413:
        body = dumps({"error": "body_too_large", "message": message})
        exc = web.HTTPRequestEntityTooLarge(MAX_BODY, text=None, body=body, content_type=JSON_TYPE)
    else:
        body = dumps({"error": "body_timeout", "message": message})
        exc = web.HTTPRequestTimeout(body=body, content_type=JSON_TYPE)
    exc.force_close()
    return exc


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(data), status=status, content_type=JSON_TYPE)


def error_response(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return json_response({"error": error, "message": message, **extra}, status)

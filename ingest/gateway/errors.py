"""The gateway's own error answers, in each provider's error format.

A client talks to the gateway through its provider's SDK, so the gateway's own
errors (bad key, bad request, upstream unreachable) use that provider's shape
and the SDK raises the class it raises for the provider (e.g.
``openai.AuthenticationError``, ``anthropic.NotFoundError``). Budget refusals
are the gate's answer (``enforcer`` renders them) and do not come from here.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from .families import Api

#: (status) -> the type names each provider uses for it
_ANTHROPIC: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
}
_OPENAI: Final = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "throttled",
    502: "server_error",
    503: "server_error",
}
_OPENAI_CODES: Final = {401: "invalid_api_key", 404: "unknown_url", 429: "throttled"}
_GOOGLE: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
}
_BEDROCK: Final = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ValidationException",
    413: "ValidationException",
    429: "ThrottlingException",
    502: "ServiceUnavailableException",
    503: "ServiceUnavailableException",
}


def error_body(
    family: Api | None, status: int, message: str
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The body and extra headers of an error of ``status`` for ``family``'s SDKs."""
    if family == "anthropic":
        kind = _ANTHROPIC.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}, []
    if family == "gemini":
        return {
            "error": {"code": status, "message": message, "status": _GOOGLE.get(status, "UNKNOWN")}
        }, []
    if family == "bedrock":
        kind = _BEDROCK.get(status, "InternalServerException")
        return {"message": message}, [("x-amzn-ErrorType", kind)]
    return {
        "error": {
            "message": message,
            "type": _OPENAI.get(status, "server_error"),
            "param": None,
            "code": _OPENAI_CODES.get(status),
        }
    }, []


def error_response(
    family: Api | None, status: int, message: str, extra: tuple[tuple[str, str], ...] = ()
) -> web.Response:
    body, headers = error_body(family, status, message)
    headers = [*headers, *extra]
    response = web.Response(
        body=json.dumps(body).encode(), status=status, content_type="application/json"
    )
    for name, value in headers:
        response.headers[name] = value
    return response

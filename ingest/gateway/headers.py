"""Which headers cross the gateway: allowlists per API family, both ways.

A client is a tenant of the operator's provider account, so nothing it sends may pick
what that account bills (``openai-organization``, ``openai-project``,
``x-goog-user-project``), carry its own credentials upstream, or reach the provider
unknown to the gateway; and nothing the provider answers about the account
(``openai-organization``, ``openai-project``, ``anthropic-organization-id``,
``set-cookie``, ...) reaches the client. What passes is what the providers' SDKs send
and read (openai-python, anthropic-sdk-python, google-genai, botocore):

- **request**: the body's framing (``content-type``, ``content-encoding``, ``accept``,
  ``accept-encoding``), ``user-agent``, ``idempotency-key``, the SDKs' own
  ``x-stainless-*`` telemetry and retry count, and per family the API's versioning and
  feature headers (``openai-beta``; ``anthropic-version``, ``anthropic-beta``;
  ``x-goog-api-client``; ``x-amzn-bedrock-*``), and what the config's
  ``forward_request_headers`` adds (never one of :data:`NEVER_FORWARDED`). The
  credential is the gateway's (proxy.py sets it per family).
- **response**: the body's framing (``content-type``, ``content-encoding``,
  ``content-length``, ``cache-control``), what the SDKs' retries read
  (``retry-after``, ``retry-after-ms``, ``x-should-retry``), and per family the
  request id and rate-limit headers (``x-request-id``, ``x-ratelimit-*``,
  ``openai-processing-ms``, ``openai-version``; ``request-id``,
  ``anthropic-ratelimit-*``; ``x-goog-request-id``, ``x-gemini-service-tier`` (the tier
  that served the call); ``x-amzn-requestid``,
  ``x-amzn-errortype``, ``x-amzn-bedrock-*``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from multidict import CIMultiDict

from schemas.billed_units import GEMINI_SERVICE_TIER_HEADER

from .families import Api

#: never forwarded, whatever a config's ``forward_request_headers`` says: credentials,
#: cookies, hop-by-hop and framing headers, and what picks the operator's account
NEVER_FORWARDED: Final = frozenset(
    {
        "authorization",
        "x-api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "openai-organization",
        "openai-project",
        "anthropic-workspace-id",
        "x-goog-user-project",
    }
)

_REQUEST_COMMON: Final = frozenset(
    {
        "content-type",
        "content-encoding",
        "accept",
        "accept-encoding",
        "user-agent",
        "idempotency-key",
    }
)
_REQUEST: Final[dict[str, frozenset[str]]] = {
    "openai": _REQUEST_COMMON | {"openai-beta"},
    "anthropic": _REQUEST_COMMON | {"anthropic-version", "anthropic-beta"},
    "gemini": _REQUEST_COMMON | {"x-goog-api-client"},
    "bedrock": _REQUEST_COMMON,
}
_REQUEST_PREFIXES: Final[dict[str, tuple[str, ...]]] = {
    "openai": ("x-stainless-",),
    "anthropic": ("x-stainless-",),
    "gemini": (),
    "bedrock": ("x-amzn-bedrock-",),
}

_RESPONSE_COMMON: Final = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-length",
        "cache-control",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
    }
)
_RESPONSE: Final[dict[str, frozenset[str]]] = {
    "openai": _RESPONSE_COMMON | {"x-request-id", "openai-processing-ms", "openai-version"},
    "anthropic": _RESPONSE_COMMON | {"request-id"},
    # Gemini's tier header: google-genai's callers read it to see a priority downgrade
    "gemini": _RESPONSE_COMMON | {"x-goog-request-id", GEMINI_SERVICE_TIER_HEADER},
    "bedrock": _RESPONSE_COMMON | {"x-amzn-requestid", "x-amzn-errortype"},
}
_RESPONSE_PREFIXES: Final[dict[str, tuple[str, ...]]] = {
    "openai": ("x-ratelimit-",),
    "anthropic": ("anthropic-ratelimit-",),
    "gemini": (),
    "bedrock": ("x-amzn-bedrock-",),
}


def _allowed(lower: str, names: frozenset[str], prefixes: tuple[str, ...]) -> bool:
    return lower in names or (bool(prefixes) and lower.startswith(prefixes))


def forwarded_request_headers(
    headers: Mapping[str, str], family: Api, also: tuple[str, ...] = ()
) -> CIMultiDict[str]:
    """The client's headers the provider of ``family`` may see (credentials not included);
    ``also``: the config's ``forward_request_headers`` (names, or prefixes ending in ``-``)."""
    names, prefixes = _REQUEST[family], _REQUEST_PREFIXES[family]
    if also:
        names = names | {a for a in also if not a.endswith("-")}
        prefixes = prefixes + tuple(a for a in also if a.endswith("-"))
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if _allowed(lower, names, prefixes) and lower not in NEVER_FORWARDED:
            out.add(name, value)
    return out


def relayed_response_headers(
    headers: Iterable[tuple[str, str]], family: Api, extra: Iterable[tuple[str, str]] = ()
) -> CIMultiDict[str]:
    """The provider's response headers the client may see, then the gateway's ``extra``."""
    names, prefixes = _RESPONSE[family], _RESPONSE_PREFIXES[family]
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        if _allowed(name.lower(), names, prefixes):
            out.add(name, value)
    for name, value in extra:
        out.add(name, value)
    return out


__all__ = ["NEVER_FORWARDED", "forwarded_request_headers", "relayed_response_headers"]

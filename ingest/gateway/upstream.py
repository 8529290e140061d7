"""What goes to the upstream provider: the headers, the URL's query, and the read
deadline of its response body."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .families import Api
from .headers import forwarded_request_headers

#: where each provider says which request it was
REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-amzn-requestid", "x-goog-request-id")
ANTHROPIC_VERSION = "2023-06-01"


def upstream_headers(
    headers: Mapping[str, str], family: Api, credential: str, also: tuple[str, ...] = ()
) -> CIMultiDict[str]:
    """The client's headers ``family``'s allowlist passes (headers.py; ``also``: the
    config's ``forward_request_headers``), plus the upstream credential."""
    out = forwarded_request_headers(headers, family, also)
    if family == "anthropic":
        out["x-api-key"] = credential
        out.setdefault("anthropic-version", ANTHROPIC_VERSION)
    elif family == "gemini":
        out["x-goog-api-key"] = credential
    else:  # openai, and Bedrock API keys (bearer tokens)
        out["Authorization"] = f"Bearer {credential}"
    # relayed untouched: never let the HTTP client ask for an encoding the client did not
    out.setdefault("Accept-Encoding", "identity")
    return out


def upstream_query(request: web.Request) -> str:
    """The query string, minus Gemini's ``key`` (the virtual key, not for the upstream)."""
    if "key" not in request.query:
        return request.query_string
    pairs = [(k, v) for k, v in request.query.items() if k != "key"]
    return urlencode(pairs)


class ReadDeadline:
    """The upstream read timeout of a response body, with one timer per body.

    aiohttp's ``sock_read`` cancels and re-arms a timer for every chunk received,
    which the gateway paid on every SSE event of every stream. Here the relay
    only notes when it starts waiting (``since``, ``NOT_WAITING`` while it writes
    to the client, so a slow client is not taken for a silent upstream); the one
    timer, when it fires, re-arms itself at the current wait's deadline, and only
    a wait that really lasted ``timeout`` seconds fails the read, with the
    exception aiohttp's own read timeout raises.
    """

    NOT_WAITING = float("inf")
    __slots__ = ("_content", "_handle", "_loop", "_timeout", "since")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout: float, content: aiohttp.StreamReader
    ) -> None:
        self._loop = loop
        self._timeout = timeout
        self._content = content
        self.since = self.NOT_WAITING
        self._handle: asyncio.TimerHandle | None = loop.call_at(loop.time() + timeout, self._expire)

    def _expire(self) -> None:
        now = self._loop.time()
        due = self.since + self._timeout
        if due > now:  # not waiting (inf), or waiting for less than the timeout
            self._handle = self._loop.call_at(min(due, now + self._timeout), self._expire)
            return
        self._handle = None
        self._content.set_exception(
            aiohttp.SocketTimeoutError("Timeout on reading data from socket")
        )

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

"""Receiving a request body within a deadline and a size limit (the gateway, the HTTP ingest).

aiohttp bounds neither the time a client takes to send a body nor, until it has
read past the limit, its size: a slow sender would hold a handler (and whatever
it holds) for as long as it likes. :func:`read_body` refuses

- a declared ``Content-Length`` over the limit at once (413, nothing read);
- a body that grows over the limit while read (chunked: 413);
- a body not received within ``timeout_s`` of its headers (408).

The header deadline is aiohttp's ``keepalive_timeout`` (:func:`server_options`):
aiohttp arms it when a connection opens and after each response, and closes a
connection that has not sent a whole request head by then, so an idle keep-alive
connection and a slow sender of headers are both let go after it.

A refused body's connection is closed after the answer (the rest of the body is
never read: no lingering on a client that is over its limit or too slow).
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from aiohttp import web

_Answer = TypeVar("_Answer", bound=web.StreamResponse)


class BodyRefused(Exception):
    """The body was not read: ``status`` (408 or 413) and why, for the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_body(request: web.BaseRequest, *, timeout_s: float, max_bytes: int) -> bytes:
    """The whole body, or :class:`BodyRefused` (answer it through :func:`close_after`)."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BodyRefused(
            413, f"request body of {declared} bytes is over the {max_bytes}-byte limit"
        )
    try:
        if request.content.is_eof():  # all of it came with the headers: no timer to arm
            return await request.read()
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyRefused(413, f"request body over the {max_bytes}-byte limit") from None
    except TimeoutError:
        raise BodyRefused(
            408, f"request body not received within {timeout_s:g} s of its headers"
        ) from None


def close_after(response: _Answer) -> _Answer:
    """``response`` with its connection closed once sent (what a refused body's answer needs)."""
    response.force_close()
    return response


def server_options(header_timeout_s: float) -> dict[str, Any]:
    """aiohttp server settings (``AppRunner``/``run_app``/``web.Server`` keywords) that give
    a client ``header_timeout_s`` to send each request head."""
    return {"keepalive_timeout": header_timeout_s}


__all__ = ["BodyRefused", "close_after", "read_body", "server_options"]

"""Receiving a request body within a deadline and a size limit (the gateway, the HTTP ingest,
the admin API).

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

A client may shut its sending side once the request is sent (``shutdown(SHUT_WR)``, what
``curl``-like tools and some proxies do): aiohttp then closes the whole connection and
the answer, even a 202 for events it published, never reaches the client, who retries
what was already accepted. :func:`run_app` serves an app through
:class:`runtime.half_close.AnswerAfterHalfClose`, whose connections keep their writing
side on the client's end of input: the request in hand is answered, then the connection
closes (nothing more can come on it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from runtime.half_close import AnswerAfterHalfClose

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


def run_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    print_fn: Callable[..., None] | None,
    **runner_options: Any,
) -> None:
    """``web.run_app`` through :class:`AnswerAfterHalfClose`: serve until SIGINT/SIGTERM,
    then clean the app up (its cleanup contexts: a publisher drains there)."""

    async def serve() -> None:
        runner = AnswerAfterHalfClose(app, handle_signals=True, **runner_options)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            if print_fn is not None:
                print_fn(f"======== Running on http://{host}:{port} ========")
            await asyncio.Event().wait()  # until the signal handler raises GracefulExit
        finally:
            await runner.cleanup()

    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
        asyncio.run(serve())

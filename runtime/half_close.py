"""aiohttp servers that answer a client that half-closed its socket after its request.

A client may shut its sending side once the request is sent (``shutdown(SHUT_WR)``, what
``curl``-like tools and some proxies do). aiohttp then closes the whole connection and the
answer never reaches the client: a 202 for events published, or a check's decision, is
lost, and the client retries what was already done. Here a connection keeps its writing
side on the client's end of input: the request in hand is answered, then the connection
closes (nothing more can come on it). A connection waiting for a request head (idle, or a
head cut short) has nothing to answer and closes at once.

Shared by every room that serves HTTP (the gateway and the HTTP ingest, the enforcer's
sidecar), which may share only ``schemas/``. aiohttp has no setting for this; it is one
overridden protocol callback (``eof_received``) on aiohttp's own connection handler. The
connections are also quiet (:mod:`runtime.http_log`): no request bytes or credential in a
log, malformed requests counted and logged once per interval, no access log.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler

from runtime.http_log import QuietAppRunner, QuietRequestHandler, QuietServer


class AnswersAfterEof(QuietRequestHandler):
    """A connection that answers the request in hand after the client's end of input."""

    __slots__ = ()

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio reads the bool
        if self._waiter is not None:
            # waiting for a request head (idle, or one cut short): nothing to answer
            self.force_close()
            return False
        # a request is in hand: keep the writing side (asyncio closes the whole transport
        # when this is falsy), answer it, then close: no other request can follow
        if self._messages and isinstance(last := self._messages[-1][0], RawRequestMessage):
            # requests pipelined behind it: each is answered in order, the last closes
            # (close() now would drop them unanswered)
            self._messages[-1] = (last._replace(should_close=True), self._messages[-1][1])
        else:
            self.close()
        return True


class HalfCloseServer(QuietServer):
    """``web.Server`` (aiohttp's low-level server) whose connections are :class:`AnswersAfterEof`."""

    def __call__(self) -> RequestHandler:
        handler = super().__call__()  # quiet: no access log
        handler.__class__ = AnswersAfterEof  # the same slots: only methods differ
        return handler


class AnswerAfterHalfClose(QuietAppRunner):
    """``web.AppRunner`` whose connections answer a client that half-closed after sending."""

    __slots__ = ()  # AppRunner's layout: an existing runner (Faust's) may become one

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = HalfCloseServer
        return server


__all__ = ["AnswerAfterHalfClose", "AnswersAfterEof", "HalfCloseServer"]

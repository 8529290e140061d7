"""What spendbus's aiohttp servers log: never a request's bytes, never a credential.

aiohttp logs a request it cannot parse (bare-LF line endings, a control byte in a header,
an oversize head, an unknown method) at ERROR with a traceback whose exception quotes the
raw head, ``Authorization: Bearer ...`` included, and answers the client with the same
text: every malformed request wrote a secret (a virtual key, the ingest, sidecar or web
token) to the log, and one line and traceback per request let anyone flood it.

Here, one connection handler (:class:`QuietRequestHandler`, aiohttp's ``RequestHandler``
with its error path replaced) that every server uses (the gateway, the HTTP ingest, the
enforcer's sidecar: through :mod:`runtime.half_close`; the aggregator worker's Faust pages
through :class:`QuietAppRunner`):

- a malformed request is answered 400 with a fixed text naming the parser's error class,
  counted by that class (``spendbus_http_malformed_requests_total{reason}``, a bounded
  label: aiohttp's exception classes), and logged as one WARNING line naming the class and
  the client's address; further ones within ``INTERVAL_S`` are counted and summed up in one
  line when the interval ends: at most one line per interval, whatever the rate;
- a handler's own failure (a 500, "Unhandled exception") is logged with its traceback,
  each line passed through :func:`redact` (credential headers, bearer tokens, ``key=``
  query values, virtual keys);
- aiohttp's access log is off on every connection (its request line carries query
  strings, Gemini's ``?key=`` among them).

:func:`install_log_redaction` is the second wall, for every other log line of a process
(aiohttp client errors, exceptions that carry headers): each record is rendered once as it
is made, through :func:`redact` (both in :mod:`runtime.log_redaction`, which needs no
aiohttp: the command line installs it before knowing which command runs). Shared by every room that serves HTTP, which may share
only ``schemas/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from runtime.log_redaction import install_log_redaction, redact

#: the logger of the malformed-request lines and of handler failures
LOG: Final = logging.getLogger("spendbus.http")
#: at most one malformed-request line per this many seconds (per process)
INTERVAL_S: Final = 60.0


class MalformedRequests:
    """Malformed requests refused by this process's servers: counted by reason, logged at
    most once per ``interval_s`` (the first at once, the rest summed up as the interval ends).

    ``clock`` is a monotonic clock in seconds (a test steps its own).
    """

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = LOG,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.logger = logger
        #: every refusal since the process started, by reason (the metric)
        self.totals: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()
        self._window_start: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()  # a server may run in a thread (Faust's web_in_thread)

    def note(self, reason: str, remote: str | None) -> None:
        """Count one refusal of ``reason`` (an exception class name) from ``remote``."""
        with self._lock:
            self.totals[reason] += 1
            now = self.clock()
            if self._window_start is not None and now - self._window_start >= self.interval_s:
                self._flush(now)
            if self._window_start is None:
                self._window_start = now
                self.logger.warning(
                    "refused a malformed HTTP request (%s) from %s; further ones are counted "
                    "(spendbus_http_malformed_requests_total) and summed up every %g s",
                    reason,
                    remote or "an unknown address",
                    self.interval_s,
                )
                return
            self._pending[reason] += 1
            self._arm(self._window_start + self.interval_s - now)

    def flush(self) -> None:
        """Log the refusals counted but not yet logged, if their interval is over."""
        with self._lock:
            self._timer = None
            now = self.clock()
            if self._window_start is not None and now - self._window_start >= self.interval_s:
                self._flush(now)
            elif self._window_start is not None and self._pending:
                self._arm(self._window_start + self.interval_s - now)

    def _flush(self, now: float) -> None:
        """The interval is over: one line for what it counted; a new interval starts with
        that line, or none when it counted nothing."""
        if not self._pending:
            self._window_start = None
            return
        assert self._window_start is not None
        count = sum(self._pending.values())
        reasons = ", ".join(f"{reason} {n}" for reason, n in self._pending.most_common())
        self.logger.warning(
            "refused %d more malformed HTTP requests in the last %.0f s (%s)",
            count,
            now - self._window_start,
            reasons,
        )
        self._pending.clear()
        self._window_start = now

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test's direct call): the next note flushes
            return
        self._timer = loop.call_later(max(delay, 0.0), self.flush)

    def reset(self) -> None:
        """Forget every count (a test's fresh start)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
            self.totals.clear()
            self._pending.clear()
            self._window_start = None


#: the process's malformed-request tally (every server of the process shares it)
MALFORMED: Final = MalformedRequests()


class MalformedRequestsCollector(Collector):
    """``spendbus_http_malformed_requests_total{reason}`` from :data:`MALFORMED`."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "spendbus_http_malformed_requests",
            "HTTP requests refused unparsed (400), by the parser's error",
            labels=["reason"],
        )
        for reason, count in sorted(MALFORMED.totals.items()):
            family.add_metric([reason], count)
        yield family


_COLLECTOR: Final = MalformedRequestsCollector()


def expose_malformed_requests(registry: CollectorRegistry) -> None:
    """Add ``spendbus_http_malformed_requests_total`` to ``registry`` (once; again is a no-op)."""
    with contextlib.suppress(ValueError):  # already there
        registry.register(_COLLECTOR)


class QuietRequestHandler(RequestHandler):
    """aiohttp's connection handler that logs no request bytes (see the module doc)."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError) or status >= 500:
            return super().handle_error(request, status, exc, message)
        # a head the parser refused: the exception and aiohttp's message quote its bytes
        reason = type(exc).__name__
        MALFORMED.note(reason, request.remote)
        if request.writer.output_size > 0:  # as aiohttp: an answer already started
            raise ConnectionError("a response was sent already: cannot answer the error")
        response = web.Response(
            status=status, text=f"{status} Bad Request: malformed request ({reason})\n"
        )
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # a handler's failure (500) or aiohttp's own: the message and traceback, redacted
        exc = kw.pop("exc_info", None)
        message = str(args[0]) % args[1:] if args else "error"
        if isinstance(exc, BaseException):
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.logger.error("%s\n%s", redact(message), redact(detail.rstrip()))
        else:
            self.logger.error("%s", redact(message))

    def log_debug(self, *args: Any, **kw: Any) -> None:
        if self.debug:
            self.logger.debug("%s", redact(str(args[0]) % args[1:] if args else ""))


def quiet(handler: RequestHandler) -> None:
    """Make ``handler`` (a fresh connection) a :class:`QuietRequestHandler` without access log."""
    if not isinstance(handler, QuietRequestHandler):
        handler.__class__ = QuietRequestHandler  # the same slots: only methods differ
    handler.access_logger = None
    handler._logging_enabled = False


class QuietServer(web.Server):
    """``web.Server`` (aiohttp's low-level server) whose connections log no request bytes."""

    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        quiet(handler)
        return handler


class QuietAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections log no request bytes (the worker's Faust pages)."""

    __slots__ = ()  # AppRunner's layout: an existing runner may become one

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if not isinstance(server, QuietServer):
            server.__class__ = QuietServer
        return server


__all__ = [
    "INTERVAL_S",
    "MALFORMED",
    "MalformedRequests",
    "MalformedRequestsCollector",
    "QuietAppRunner",
    "QuietRequestHandler",
    "QuietServer",
    "expose_malformed_requests",
    "install_log_redaction",
    "quiet",
    "redact",
]

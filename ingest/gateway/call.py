"""One metered request as it goes through the gateway's steps (HTTP or a realtime session)."""

from __future__ import annotations

import time

from ingest.taps import RequestInfo

from .config import Upstream, VirtualKey
from .families import Api
from .gate import GateDecision
from .routes import Route


class Call:
    """One metered request as it goes through the steps."""

    __slots__ = (
        "body",
        "decision",
        "family",
        "hides_usage",
        "info",
        "model",
        "route",
        "session_id",
        "started",
        "stream",
        "upstream",
        "upstream_body",
        "vk",
    )

    def __init__(self, route: Route, vk: VirtualKey, upstream: Upstream, body: bytes) -> None:
        self.route = route
        self.vk = vk
        self.upstream = upstream
        self.body = body
        #: what goes upstream: the body, or it asking for streamed usage (stream_usage.py)
        self.upstream_body = body
        #: the gateway asked for streamed usage the client did not: hide it from the client
        self.hides_usage = False
        self.family: Api = route.family
        self.started = time.monotonic()
        self.model: str | None = None
        self.stream = False
        self.session_id: str | None = None
        self.decision: GateDecision | None = None
        #: the request as read once (the gate's context and the tap both use it)
        self.info: RequestInfo | None = None


def elapsed_ms(started: float) -> int:
    """Milliseconds since ``started`` (a ``time.monotonic()`` reading)."""
    return int((time.monotonic() - started) * 1000)

"""What every metered route of the gateway shares (HTTP requests and realtime sessions):
the configuration, the key store and the upstream pool; identifying a key; the gate's
context of a call; answering and publishing a refusal; publishing usage in tracked tasks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from ingest.receive import server_options
from ingest.taps import EstimatorConfig
from schemas.records import UsageEvent

from .background import BackgroundResponses
from .call import Call, elapsed_ms
from .config import GatewayConfig, Upstream, VirtualKey
from .errors import error_response
from .families import Api
from .gate import BudgetGate, GateDecision, UsageSink
from .identity import KeyStore, SessionTracker, presented_key
from .metrics import GatewayMetrics

log = logging.getLogger("spendbus.gateway")


class GatewayCore:
    """The gateway's shared state and steps; :class:`ingest.gateway.proxy.Gateway` adds
    the HTTP routes and the relay. ``start``/``stop`` open and close the upstream pool."""

    def __init__(
        self,
        config: GatewayConfig,
        gate: BudgetGate,
        sink: UsageSink,
        *,
        credentials: Mapping[str, str],
        keys: KeyStore | None = None,
        key_secret: bytes | None = None,
        sessions: SessionTracker | None = None,
        estimator: EstimatorConfig | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        missing = sorted(set(config.secrets) - set(credentials))
        if missing:
            raise ValueError(f"no credential for secret(s) {', '.join(missing)}")
        self.config = config
        self.gate = gate
        self.sink = sink
        self.credentials = dict(credentials)
        #: keyed digests under ``key_secret`` (the server-side key secret; identity.py)
        self.keys = keys if keys is not None else KeyStore(config.keys, secret=key_secret)
        self.sessions = sessions or SessionTracker(
            config.sessions.idle_ttl_s, config.sessions.max_tracked, auto=config.sessions.auto
        )
        self.estimator = estimator or EstimatorConfig()
        self.metrics = GatewayMetrics(registry)
        #: background Responses this gateway created, metered when fetched (background.py)
        self.background = BackgroundResponses()
        self._client: aiohttp.ClientSession | None = None
        #: accounting that outlives a cancelled handler
        self._pending: set[asyncio.Task[None]] = set()
        #: key name -> its requests in flight (only with max_in_flight_per_key; an entry
        #: goes at 0, so the map holds at most the keys with a request in flight)
        self.in_flight: dict[str, int] = {}

    # -- the per-key limit of requests in flight ----------------------------------------
    def enter_in_flight(self, vk: VirtualKey, family: Api) -> web.Response | None:
        """Count one more request (or Realtime session) of ``vk`` in flight, or the 429
        ``throttled`` answer when it has ``max_in_flight_per_key`` already; a counted one
        leaves through :meth:`leave_in_flight`."""
        limit = self.config.max_in_flight_per_key
        if limit is None:
            return None
        name = vk.name
        held = self.in_flight.get(name, 0)
        if held >= limit:
            self.metrics.requests.labels(family, "throttled").inc()
            retry_after = self.config.throttle_retry_after_s
            return error_response(
                family,
                429,
                f"throttled: key {name!r} has {limit} requests in flight, the most it may "
                f"(max_in_flight_per_key); retry in {retry_after} s.",
                (
                    ("Retry-After", str(retry_after)),
                    ("retry-after-ms", str(retry_after * 1000)),
                    ("x-should-retry", "true"),
                ),
            )
        self.in_flight[name] = held + 1
        return None

    def leave_in_flight(self, vk: VirtualKey) -> None:
        if self.config.max_in_flight_per_key is None:
            return
        name = vk.name
        left = self.in_flight[name] - 1
        if left:
            self.in_flight[name] = left
        else:
            del self.in_flight[name]

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is None:
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.config.max_upstream_connections, ttl_dns_cache=300
                ),
                auto_decompress=False,  # relay the provider's bytes as they are
                # no sock_read: it re-arms a timer per chunk received; the read
                # timeout is the headers' deadline (response_deadline) and the
                # body's _ReadDeadline instead
                # connect: the wait for a free pooled connection and the connecting
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=self.config.connect_timeout_s,
                    sock_connect=self.config.connect_timeout_s,
                ),
            )

    async def drain(self) -> None:
        """Wait until every response that ended has been accounted (published, settled)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def stop(self) -> None:
        await self.drain()
        if self._client is not None:
            await self._client.close()
            self._client = None

    def server_options(self) -> dict[str, Any]:
        """What the aiohttp runner serving :meth:`app` needs (the header deadline)."""
        return server_options(self.config.header_timeout_s)

    def response_deadline(self) -> asyncio.Timeout:
        """The wait for an upstream's response headers, bounded by the read timeout."""
        return asyncio.timeout(self.config.read_timeout_s)

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise RuntimeError("the gateway is not started")
        return self._client

    # -- identify --------------------------------------------------------------------------
    def identify(
        self, request: web.Request, family: Api | None
    ) -> tuple[VirtualKey, Upstream] | web.Response:
        vk = self.keys.lookup(presented_key(request.headers, request.query))
        if vk is None:
            self.metrics.requests.labels(family or "unknown", "unauthenticated").inc()
            return error_response(family, 401, "Invalid or missing API key for this gateway.")
        secret = self.config.secrets[vk.principal.secret_id]
        upstreams = [self.config.upstreams[name] for name in secret.upstream_names]
        for upstream in upstreams:
            if family is None or upstream.api == family:
                return vk, upstream
        self.metrics.requests.labels(family or "unknown", "forbidden").inc()
        apis = " and ".join(sorted({u.api for u in upstreams}))
        return error_response(
            family, 403, f"This key's credential is for the {apis} API, not {family}."
        )

    def context(
        self,
        call: Call,
        request_bytes: int,
        max_output: int | None,
        *,
        api: str | None = None,
        units: tuple[tuple[str, int], ...] = (),
        candidates: int = 1,
    ) -> Any:
        principal = call.vk.principal
        return self.gate.context(
            org_id=principal.org_id,
            secret_id=principal.secret_id,
            project_id=principal.project_id,
            grant_id=principal.grant_id,
            user_id=principal.user_id,
            groups=principal.groups,
            tags=principal.tags,
            session_id=call.session_id,
            provider=call.upstream.provider_name,
            api=api or call.route.fmt,
            model=call.model,
            request_bytes=request_bytes,
            max_output_tokens=max_output,
            # n completions write up to n times the max: the worst case holds them all
            candidates=candidates if candidates > 1 else None,
            # the units the request can cost at most (a server tool's max_uses...): the
            # worst case holds them too
            units=units or None,
        )

    # -- refuse and publish ----------------------------------------------------------------
    async def refuse(self, call: Call, decision: GateDecision) -> web.Response:
        """A refusal never reaches the provider; it is usage all the same."""
        self.metrics.requests.labels(call.family, "refused").inc()
        self.refusal_event(call, decision)
        return web.Response(
            body=_json_bytes(decision.body),
            status=decision.status,
            headers=CIMultiDict(decision.headers),
        )

    def refusal_event(self, call: Call, decision: GateDecision) -> None:
        """Publish the refusal (its api is the context's: the gate names it)."""
        event = decision.refusal_event(
            gateway_id=self.config.gateway_id,
            stream=call.stream,
            latency_ms=elapsed_ms(call.started),
        )
        if event is not None:
            self.publish_soon(event)

    def publish_soon(self, event: UsageEvent) -> None:
        """Publish in a task of its own, tracked until done (``drain``)."""
        self.track(asyncio.ensure_future(self.publish(event)))

    async def publish(self, event: UsageEvent) -> None:
        try:
            await self.sink.publish(event)
        except Exception:
            self.metrics.published.labels("error").inc()
            log.exception("usage event %s not published", event.get("event_id"))
        else:
            self.metrics.published_ok.inc()

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep ``task`` (accounting that must outlive a cancelled handler) until done."""
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


def _json_bytes(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()

"""The reference gateway: check, forward, stream through the tap, publish, settle.

Per metered request, in this order (each step's failure and its consequence):

1. **Identify**: the virtual key names the principal (401 without one); the
   route names the API; the key's credential must be for that API (403).
2. **Check**: the gate decides and, when it allows, holds a worst-case
   estimate. A refusal is answered with the gate's body and headers and
   published as a refusal event; the upstream is never contacted.
3. **Forward** with the upstream credential of the principal's secret. If the
   upstream cannot be reached, the hold is released and the client gets 502:
   nothing reached the provider, nothing is charged.
4. **Relay**: every chunk is fed to the tap and written to the client as it
   arrives, unmodified (no buffering: aiohttp's write waits for the client,
   which paces the reads from the upstream).
5. **Account**, always, whatever ended the response (normal end, upstream cut,
   client hang-up, cancellation): the tap's result becomes the UsageEvent
   (estimated when usage was not read), the hold is settled to its actual cost,
   and it is published. Building and settling are synchronous, in the handler's
   ``finally`` (a cancellation cannot stop them half-way, and the next request,
   on this connection or any other, is checked against the settled cost);
   publishing runs as a tracked task (``drain``/``stop`` wait for it), so the
   handler returns at once and the connection's next request waits for none of
   it. A publish failure is logged and counted; the hold is settled all the same
   (the spend is real).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter, generate_latest

from ingest.receive import BodyRefused, close_after, read_body, server_options
from ingest.taps import EstimatorConfig, RequestInfo, TapResult, open_tap, read_request
from schemas.errors import InvalidRecord, SpendbusError
from schemas.usage import new_usage_event

from .config import Api, GatewayConfig, Upstream, VirtualKey
from .errors import error_response
from .gate import BudgetGate, GateDecision, UsageSink
from .headers import forwarded_request_headers, relayed_response_headers
from .identity import KeyStore, SessionTracker, presented_key
from .routes import Route, resolve

log = logging.getLogger("spendbus.gateway")

#: where each provider says which request it was
_REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-amzn-requestid", "x-goog-request-id")
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


def _upstream_query(request: web.Request) -> str:
    """The query string, minus Gemini's ``key`` (the virtual key, not for the upstream)."""
    if "key" not in request.query:
        return request.query_string
    pairs = [(k, v) for k, v in request.query.items() if k != "key"]
    from urllib.parse import urlencode

    return urlencode(pairs)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "spendbus_gateway_requests",
            "Requests by API family and outcome",
            ["family", "outcome"],
            registry=self.registry,
        )
        self.cuts = Counter(
            "spendbus_gateway_cuts",
            "Responses that did not end normally, by cause",
            ["cut"],
            registry=self.registry,
        )
        self.published = Counter(
            "spendbus_gateway_events",
            "Usage events by publish result",
            ["result"],
            registry=self.registry,
        )
        # the hot path's children, looked up once (a labels() call costs microseconds)
        self.allowed = {
            family: self.requests.labels(family, "allowed")
            for family in ("openai", "anthropic", "gemini", "bedrock")
        }
        self.published_ok = self.published.labels("ok")
        self.realtime_frames_refused = Counter(
            "spendbus_gateway_realtime_frames_refused",
            "Realtime client frames not forwarded because the gateway cannot read them",
            ["reason"],  # binary, not_json, too_deep, duplicate_key, no_type
            registry=self.registry,
        )
        self.realtime_server_refused = Counter(
            "spendbus_gateway_realtime_server_responses_refused",
            "Realtime responses the server started (voice activity) refused and cancelled",
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "spendbus_gateway_upstream_unreachable",
            "Requests whose upstream could not be reached (hold released, not charged)",
            ["family"],
            registry=self.registry,
        )


class _Call:
    """One metered request as it goes through the steps."""

    __slots__ = (
        "body",
        "decision",
        "family",
        "info",
        "model",
        "route",
        "session_id",
        "started",
        "stream",
        "upstream",
        "vk",
    )

    def __init__(self, route: Route, vk: VirtualKey, upstream: Upstream, body: bytes) -> None:
        self.route = route
        self.vk = vk
        self.upstream = upstream
        self.body = body
        self.family: Api = route.family
        self.started = time.monotonic()
        self.model: str | None = None
        self.stream = False
        self.session_id: str | None = None
        self.decision: GateDecision | None = None
        #: the request as read once (the gate's context and the tap both use it)
        self.info: RequestInfo | None = None


class _ReadDeadline:
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


class Gateway:
    """The reference gateway. ``app()`` is the aiohttp application; its startup and
    cleanup open and close the upstream connection pool."""

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
        self._client: aiohttp.ClientSession | None = None
        #: accounting that outlives a cancelled handler
        self._pending: set[asyncio.Task[None]] = set()
        #: key name -> its requests in flight (only with max_in_flight_per_key; an entry
        #: goes at 0, so the map holds at most the keys with a request in flight)
        self.in_flight: dict[str, int] = {}

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

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        from .realtime import RealtimeRelay

        app.router.add_get("/v1/realtime", RealtimeRelay(self).handle)
        app.router.add_get("/v1/spend", self._spend)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/{tail:.*}", self.handle)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "keys": len(self.keys)})

    async def _spend(self, request: web.Request) -> web.Response:
        """The calling key's own counters, as its requests are checked against them: the
        enforcer's memory, the numbers ``spendbus usage`` prints for the same principal."""
        vk = self.keys.lookup(presented_key(request.headers, request.query))
        if vk is None:
            self.metrics.requests.labels("spend", "unauthenticated").inc()
            return error_response(None, 401, "Invalid or missing API key for this gateway.")
        principal = vk.principal
        ctx = self.gate.context(
            org_id=principal.org_id,
            secret_id=principal.secret_id,
            project_id=principal.project_id,
            grant_id=principal.grant_id,
            user_id=principal.user_id,
            groups=principal.groups,
            tags=principal.tags,
        )
        self.metrics.requests.labels("spend", "answered").inc()
        counters = [c.to_json() for c in self.gate.usage(ctx)]
        return web.json_response(
            {"ready": self.gate.ready, "stale": self.gate.stale, "counters": counters}
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

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
        call: _Call,
        request_bytes: int,
        max_output: int | None,
        *,
        api: str | None = None,
        units: tuple[tuple[str, int], ...] = (),
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
            # the units the request can cost at most (a server tool's max_uses...): the
            # worst case holds them too
            units=units or None,
        )

    # -- one request -----------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        route = resolve(request.raw_path.split("?", 1)[0])
        if route is None:
            return error_response(None, 404, f"No route for POST {request.path}.")
        who = self.identify(request, route.family)
        if isinstance(who, web.Response):
            return who
        vk, upstream = who
        limit = self.config.max_in_flight_per_key
        if limit is None:
            return await self._handle_identified(request, route, vk, upstream)
        name = vk.name
        held = self.in_flight.get(name, 0)
        if held >= limit:
            return self._throttled(route.family, name, limit)
        self.in_flight[name] = held + 1
        try:
            return await self._handle_identified(request, route, vk, upstream)
        finally:
            left = self.in_flight[name] - 1
            if left:
                self.in_flight[name] = left
            else:
                del self.in_flight[name]

    def _throttled(self, family: Api, name: str, limit: int) -> web.Response:
        """429 ``throttled``: this key has ``limit`` requests in flight already."""
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

    async def _handle_identified(
        self, request: web.Request, route: Route, vk: VirtualKey, upstream: Upstream
    ) -> web.StreamResponse:
        try:
            body = await read_body(
                request,
                timeout_s=self.config.body_timeout_s,
                max_bytes=self.config.max_body_bytes,
            )
        except BodyRefused as exc:
            self.metrics.requests.labels(route.family, f"body_{exc.status}").inc()
            return close_after(error_response(route.family, exc.status, exc.reason))
        call = _Call(route, vk, upstream, body)
        if not route.metered:
            self.metrics.requests.labels(route.family, "not_metered").inc()
            return await self._pass_through(request, call)
        assert route.fmt is not None
        info = call.info = read_request(route.fmt, body)
        call.model = route.model or info.model
        call.stream = route.streaming if route.streaming is not None else info.stream is True
        try:
            call.session_id = self.sessions.session_id(
                vk, request.headers.get(self.config.sessions.header)
            )
            ctx = self.context(call, len(body), info.max_output_tokens, units=info.unit_caps)
        except (ValueError, SpendbusError) as exc:
            self.metrics.requests.labels(route.family, "invalid").inc()
            return error_response(route.family, 400, f"Invalid request: {exc}")
        decision = self.gate.check(ctx)
        call.decision = decision
        if not decision.allowed:
            return await self._refuse(call, decision)
        return await self._forward(request, call, decision)

    async def _refuse(self, call: _Call, decision: GateDecision) -> web.Response:
        """A refusal never reaches the provider; it is usage all the same."""
        self.metrics.requests.labels(call.family, "refused").inc()
        self._refusal_event(call, decision)
        return web.Response(
            body=_json_bytes(decision.body),
            status=decision.status,
            headers=CIMultiDict(decision.headers),
        )

    def _refusal_event(self, call: _Call, decision: GateDecision) -> None:
        """Publish the refusal (its api is the context's: the gate names it)."""
        event = decision.refusal_event(
            gateway_id=self.config.gateway_id,
            stream=call.stream,
            latency_ms=_elapsed_ms(call.started),
        )
        if event is not None:
            self._publish_soon(event)

    def _url(self, request: web.Request, upstream: Upstream) -> str:
        path = request.raw_path.split("?", 1)[0]
        query = _upstream_query(request)
        return f"{upstream.base_url}{path}{'?' + query if query else ''}"

    async def _open_upstream(
        self, request: web.Request, call: _Call
    ) -> aiohttp.ClientResponse | web.Response:
        credential = self.credentials[call.vk.principal.secret_id]
        try:
            async with self.response_deadline():
                return await self.client.request(
                    "POST",
                    self._url(request, call.upstream),
                    data=call.body,
                    headers=upstream_headers(
                        request.headers,
                        call.family,
                        credential,
                        self.config.forward_request_headers,
                    ),
                    allow_redirects=False,
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.metrics.upstream_errors.labels(call.family).inc()
            log.warning("upstream %s unreachable: %r", call.upstream.base_url, exc)
            return error_response(call.family, 502, "The upstream provider could not be reached.")

    async def _forward(
        self, request: web.Request, call: _Call, decision: GateDecision
    ) -> web.StreamResponse:
        upstream = await self._open_upstream(request, call)
        if isinstance(upstream, web.Response):
            self.gate.release(decision.hold_id)
            return upstream
        assert call.route.fmt is not None
        tap = open_tap(
            call.route.fmt,
            call.info if call.info is not None else call.body,
            content_type=upstream.headers.get("Content-Type"),
            content_encoding=upstream.headers.get("Content-Encoding"),
            status=upstream.status,
            model=call.route.model,
            estimator=self.estimator,
        )
        extra = decision.headers  # X-Spend-Budget warnings
        cut: str | None = "client_disconnected"  # until the relay says otherwise
        try:
            cut, response = await self._relay(request, upstream, call.family, tap.feed, extra)
            return response
        finally:
            if cut == "client_disconnected":
                upstream.close()  # stop the provider generating for nobody
            else:
                upstream.release()
            result = tap.finish(cut=cut)
            outcome = "allowed" if cut is None else cut
            self.metrics.allowed[call.family].inc()
            if cut is not None:
                self.metrics.cuts.labels(outcome).inc()
            # no await from here on: a cancellation cannot interrupt the accounting
            self._account(call, decision, result, upstream)

    async def _pass_through(self, request: web.Request, call: _Call) -> web.StreamResponse:
        upstream = await self._open_upstream(request, call)
        if isinstance(upstream, web.Response):
            return upstream
        try:
            _, response = await self._relay(request, upstream, call.family, None, ())
            return response
        finally:
            upstream.release()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        family: Api,
        feed: Any,
        extra: tuple[tuple[str, str], ...],
    ) -> tuple[str | None, web.StreamResponse]:
        """Copy the upstream response to the client chunk by chunk; returns the cut
        (None: it ended normally) and the response."""
        headers = relayed_response_headers(upstream.headers.items(), family, extra)
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        try:
            await response.prepare(request)
        except ConnectionError:
            return "client_disconnected", response
        content = upstream.content
        write = response.write
        loop = asyncio.get_running_loop()
        now = loop.time
        deadline = _ReadDeadline(loop, self.config.read_timeout_s, content)
        try:
            while True:
                deadline.since = now()
                try:
                    chunk = await content.readany()
                except (aiohttp.ClientError, TimeoutError):
                    # the provider went away mid-body: the client must see it incomplete too
                    if request.transport is not None:
                        request.transport.abort()
                    return "upstream_cut", response
                deadline.since = _ReadDeadline.NOT_WAITING
                if not chunk:
                    break
                if feed is not None:
                    feed(chunk)
                try:
                    await write(chunk)
                except ConnectionError:
                    return "client_disconnected", response
        finally:
            deadline.cancel()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return None, response

    # -- account ---------------------------------------------------------------------------
    def _account(
        self,
        call: _Call,
        decision: GateDecision,
        result: TapResult,
        upstream: aiohttp.ClientResponse,
    ) -> None:
        """The response's UsageEvent: its hold settled to it now, its publishing started."""
        principal = call.vk.principal
        request_id = next(
            (upstream.headers[h] for h in _REQUEST_ID_HEADERS if h in upstream.headers), None
        )
        try:
            event = new_usage_event(
                provider=call.upstream.provider_name,
                api=call.route.fmt or "unknown",
                model=result.model or call.model or "unknown",
                secret_id=principal.secret_id,
                org_id=principal.org_id,
                gateway_id=self.config.gateway_id,
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                cache_read_tokens=result.cache_read_tokens,
                cache_write_tokens=result.cache_write_tokens,
                cache_write_1h_tokens=result.cache_write_1h_tokens,
                reasoning_tokens=result.reasoning_tokens,
                usage_source=result.usage_source,
                estimate_reason=result.estimate_reason,
                units=dict(result.units),
                service_tier=result.service_tier,
                status_code=upstream.status,
                project_id=principal.project_id,
                grant_id=principal.grant_id,
                user_id=principal.user_id,
                groups=list(principal.groups),
                tags=dict(principal.tags),
                session_id=call.session_id,
                stream=call.stream,
                request_id=request_id[:200] if request_id else None,
                latency_ms=_elapsed_ms(call.started),
                **decision.usage_fields(),
            )
        except InvalidRecord:
            # cannot happen for a context the gate accepted; never let it pass silently
            self.metrics.published.labels("invalid").inc()
            log.exception("usage event of %s not built", call.vk.name)
            return
        self.gate.settle(decision.hold_id, event)
        self._publish_soon(event)
        for number, charge in enumerate(result.separate_charges, 1):
            # billed apart at its own model (a declined fallback hop that wrote output):
            # an event of its own that names the call (charge_of) and counts no request
            try:
                extra = new_usage_event(
                    **{
                        **{k: event[k] for k in _CHARGE_COPIED},
                        "event_id": f"{event['event_id']}.charge-{number}",
                        "model": charge.model or event["model"],
                        "input_tokens": charge.input_tokens,
                        "output_tokens": charge.output_tokens,
                        "cache_read_tokens": charge.cache_read_tokens,
                        "cache_write_tokens": charge.cache_write_tokens,
                        "cache_write_1h_tokens": charge.cache_write_1h_tokens,
                        "reasoning_tokens": charge.reasoning_tokens,
                        "usage_source": charge.usage_source,
                        "charge_of": event["event_id"],
                    }
                )
            except InvalidRecord:
                self.metrics.published.labels("invalid").inc()
                log.exception("separate charge of %s not built", event["event_id"])
                continue
            self._publish_soon(extra)

    def _publish_soon(self, event: dict[str, Any]) -> None:
        """Publish in a task of its own, tracked until done (``drain``)."""
        task = asyncio.ensure_future(self._publish(event))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, event: dict[str, Any]) -> None:
        try:
            await self.sink.publish(event)
        except Exception:
            self.metrics.published.labels("error").inc()
            log.exception("usage event %s not published", event.get("event_id"))
        else:
            self.metrics.published_ok.inc()


#: the fields a separate charge takes from the call's event (who, where, when, how)
_CHARGE_COPIED = (
    "occurred_at",
    "provider",
    "api",
    "secret_id",
    "org_id",
    "gateway_id",
    "project_id",
    "grant_id",
    "permission_id",
    "user_id",
    "groups",
    "session_id",
    "tags",
    "outcome",
    "decision",
    "decision_budget_id",
    "status_code",
    "stream",
    "request_id",
    "service_tier",
)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _json_bytes(body: Any) -> bytes:
    import json

    return json.dumps(body, separators=(",", ":")).encode()

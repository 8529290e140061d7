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
import json
import logging
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from ingest.receive import BodyRefused, close_after, read_body
from ingest.taps import TapResult, open_tap, read_request
from schemas.errors import InvalidRecord, SpendbusError
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

from .access_log import DECISION, access_log
from .background import response_id_of, top_up_fields
from .call import Call, elapsed_ms
from .config import Upstream, VirtualKey
from .core import GatewayCore
from .errors import error_response
from .families import Api
from .gate import GateDecision
from .headers import relayed_response_headers
from .identity import presented_key
from .realtime import RealtimeRelay
from .routes import Route, resolve
from .stream_usage import HiddenUsage, asking_for_usage
from .upstream import REQUEST_ID_HEADERS, ReadDeadline, upstream_headers, upstream_query
from .usage_events import separate_charge_fields, tap_usage_event

log = logging.getLogger("spendbus.gateway")

#: bytes of a background request's answer kept to read its id (a queued response is
#: about 2 KiB; one larger is not remembered, its estimate stands)
_BACKGROUND_ANSWER_LIMIT: Final = 256 * 1024


class Gateway(GatewayCore):
    """The reference gateway. ``app()`` is the aiohttp application; its startup and
    cleanup open and close the upstream connection pool."""

    def app(self) -> web.Application:
        middlewares = [access_log] if self.config.access_log else []
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=middlewares)
        app.router.add_get("/v1/realtime", RealtimeRelay(self).handle)
        app.router.add_get("/v1/spend", self._spend)
        app.router.add_get("/v1/responses/{response_id}", self._retrieve)
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

    # -- one request -----------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        route = resolve(request.raw_path.split("?", 1)[0])
        if route is None:
            return error_response(None, 404, f"No route for POST {request.path}.")
        who = self.identify(request, route.family)
        if isinstance(who, web.Response):
            return who
        vk, upstream = who
        if self.config.max_in_flight_per_key is None:
            return await self._handle_identified(request, route, vk, upstream)
        throttled = self.enter_in_flight(vk, route.family)
        if throttled is not None:
            return throttled
        try:
            return await self._handle_identified(request, route, vk, upstream)
        finally:
            self.leave_in_flight(vk)

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
        call = Call(route, vk, upstream, body)
        if not route.metered:
            self.metrics.requests.labels(route.family, "not_metered").inc()
            return await self._pass_through(request, call)
        assert route.fmt is not None
        info = call.info = read_request(route.fmt, body)
        call.model = route.model or info.model
        call.stream = route.streaming if route.streaming is not None else info.stream is True
        if info.stream_usage is False and call.stream and self.config.ask_stream_usage:
            try:
                asked = asking_for_usage(body, json.loads(body))
            except (ValueError, RecursionError):
                asked = None  # read_request read it; json may not: then it is estimated
            if asked is not None:
                call.upstream_body, call.hides_usage = asked, True
        try:
            call.session_id = self.sessions.session_id(
                vk, request.headers.get(self.config.sessions.header)
            )
            ctx = self.context(
                call,
                len(body),
                info.max_output_tokens,
                units=info.unit_caps,
                candidates=info.candidates,
            )
        except (ValueError, SpendbusError) as exc:
            self.metrics.requests.labels(route.family, "invalid").inc()
            return error_response(route.family, 400, f"Invalid request: {exc}")
        decision = self.gate.check(ctx)
        call.decision = decision
        request[DECISION] = decision  # the access log's budget note
        if not decision.allowed:
            return await self.refuse(call, decision)
        return await self._forward(request, call, decision)

    def _url(self, request: web.Request, upstream: Upstream) -> str:
        path = request.raw_path.split("?", 1)[0]
        query = upstream_query(request)
        return f"{upstream.base_url}{path}{'?' + query if query else ''}"

    async def _open_upstream(
        self, request: web.Request, call: Call
    ) -> aiohttp.ClientResponse | web.Response:
        credential = self.credentials[call.vk.principal.secret_id]
        headers = upstream_headers(
            request.headers, call.family, credential, self.config.forward_request_headers
        )
        if call.hides_usage or (call.info is not None and call.info.background):
            # the stream is rewritten, the background answer's id read: both plain
            headers["Accept-Encoding"] = "identity"
        try:
            async with self.response_deadline():
                return await self.client.request(
                    "POST",
                    self._url(request, call.upstream),
                    data=call.upstream_body,
                    headers=headers,
                    allow_redirects=False,
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.metrics.upstream_errors.labels(call.family).inc()
            log.warning("upstream %s unreachable: %r", call.upstream.base_url, exc)
            return error_response(call.family, 502, "The upstream provider could not be reached.")

    async def _forward(
        self, request: web.Request, call: Call, decision: GateDecision
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
            response_headers=upstream.headers,
        )
        extra = decision.headers  # X-Spend-Budget warnings
        hidden = None
        content_type = upstream.headers.get("Content-Type", "")
        if call.hides_usage and upstream.status == 200 and "event-stream" in content_type:
            hidden = HiddenUsage(upstream.headers.get("Content-Encoding"))
        cut: str | None = "client_disconnected"  # until the relay says otherwise
        feed = tap.feed
        answer: bytearray | None = None
        if call.info is not None and call.info.background:
            answer = bytearray()  # a queued response: its id is read once it is in

            def feed(chunk: bytes) -> None:
                tap.feed(chunk)
                if len(answer) < _BACKGROUND_ANSWER_LIMIT:
                    answer.extend(chunk)

        try:
            cut, response = await self._relay(request, upstream, call.family, feed, extra, hidden)
            return response
        finally:
            if cut == "client_disconnected":
                upstream.close()  # stop the provider generating for nobody
            else:
                upstream.release()
            result = tap.finish(cut=cut)
            outcome = "allowed" if cut is None else cut
            self.metrics.allowed[call.family].inc()
            self.metrics.by_usage_source[call.family, result.usage_source].inc()
            if cut is not None:
                self.metrics.cuts.labels(outcome).inc()
            # no await from here on: a cancellation cannot interrupt the accounting
            event = self._account(call, decision, result, upstream)
            if answer is not None and event is not None:
                self._remember_background(call, bytes(answer), event)

    async def _pass_through(self, request: web.Request, call: Call) -> web.StreamResponse:
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
        hidden: HiddenUsage | None = None,
    ) -> tuple[str | None, web.StreamResponse]:
        """Copy the upstream response to the client chunk by chunk; returns the cut
        (None: it ended normally) and the response. With ``hidden``, the client gets the
        stream without the usage the gateway asked for (the tap reads it all)."""
        headers = relayed_response_headers(upstream.headers.items(), family, extra)
        if hidden is not None:
            headers.popall("Content-Length", None)  # the client's copy is shorter
            if hidden.decoded:
                headers.popall("Content-Encoding", None)
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
        deadline = ReadDeadline(loop, self.config.read_timeout_s, content)
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
                deadline.since = ReadDeadline.NOT_WAITING
                if not chunk:
                    break
                if feed is not None:
                    feed(chunk)
                if hidden is not None:
                    chunk = hidden.feed(chunk)
                    if not chunk:
                        continue
                try:
                    await write(chunk)
                except ConnectionError:
                    return "client_disconnected", response
        finally:
            deadline.cancel()
        with contextlib.suppress(ConnectionError):
            if hidden is not None and (rest := hidden.finish()):
                await write(rest)
            await response.write_eof()
        return None, response

    # -- account ---------------------------------------------------------------------------
    def _account(
        self,
        call: Call,
        decision: GateDecision,
        result: TapResult,
        upstream: aiohttp.ClientResponse,
    ) -> UsageEvent | None:
        """The response's UsageEvent: its hold settled to it now, its publishing started."""
        request_id = next(
            (upstream.headers[h] for h in REQUEST_ID_HEADERS if h in upstream.headers), None
        )
        try:
            event = tap_usage_event(
                call,
                result,
                api=call.route.fmt or "unknown",
                gateway_id=self.config.gateway_id,
                status_code=upstream.status,
                decision_fields=decision.usage_fields(),
                request_id=request_id[:200] if request_id else None,
                latency_ms=elapsed_ms(call.started),
            )
        except InvalidRecord:
            # cannot happen for a context the gate accepted; never let it pass silently
            self.metrics.published.labels("invalid").inc()
            log.exception("usage event of %s not built", call.vk.name)
            return None
        self.gate.settle(decision.hold_id, event)
        self.publish_soon(event)
        for fields in separate_charge_fields(event, result):
            try:
                extra = new_usage_event(**fields)
            except InvalidRecord:
                self.metrics.published.labels("invalid").inc()
                log.exception("separate charge of %s not built", event["event_id"])
                continue
            self.publish_soon(extra)
        return event

    # -- background responses (background.py) ----------------------------------------------
    def _remember_background(self, call: Call, answer: bytes, event: UsageEvent) -> None:
        """A background response, charged its estimate: metered when fetched."""
        response_id = response_id_of(answer, streamed=call.stream)
        if response_id is None or call.info is None:
            return  # no id to fetch it by: its estimate stands
        principal = call.vk.principal
        self.background.add(
            response_id,
            org_id=principal.org_id,
            secret_id=principal.secret_id,
            info=call.info,
            event=event,
        )

    async def _retrieve(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/responses/{id}``: a background response this key's principal created
        through this gateway, relayed; its reported usage tops up the estimate once."""
        who = self.identify(request, "openai")
        if isinstance(who, web.Response):
            return who
        vk, upstream = who
        response_id = request.match_info["response_id"]
        principal = vk.principal
        entry = self.background.get(
            response_id, org_id=principal.org_id, secret_id=principal.secret_id
        )
        if entry is None:
            # the gateway's credential reads every response of the account: never fetch
            # one this principal did not create here
            self.metrics.requests.labels("openai", "retrieve_unknown").inc()
            return error_response(
                "openai",
                404,
                f"No response found with id {response_id!r} created through this gateway.",
            )
        credential = self.credentials[principal.secret_id]
        try:
            async with self.response_deadline():
                fetched = await self.client.get(
                    self._url(request, upstream),
                    headers=upstream_headers(
                        request.headers, "openai", credential, self.config.forward_request_headers
                    ),
                    allow_redirects=False,
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.metrics.upstream_errors.labels("openai").inc()
            log.warning("upstream %s unreachable: %r", upstream.base_url, exc)
            return error_response("openai", 502, "The upstream provider could not be reached.")
        tap = open_tap(
            "openai-responses",
            entry.info,
            content_type=fetched.headers.get("Content-Type"),
            content_encoding=fetched.headers.get("Content-Encoding"),
            status=fetched.status,
            estimator=self.estimator,
        )
        self.metrics.requests.labels("openai", "retrieved").inc()
        cut: str | None = "client_disconnected"
        try:
            cut, response = await self._relay(request, fetched, "openai", tap.feed, ())
            return response
        finally:
            if cut == "client_disconnected":
                fetched.close()
            else:
                fetched.release()
            result = tap.finish(cut=cut)
            if result.usage_source == "reported" and not entry.settled:
                entry.settled = True
                self._top_up(entry.event, result)

    def _top_up(self, estimate: Mapping[str, Any], result: TapResult) -> None:
        """Publish what the reported usage exceeds the estimate by (once: its id is fixed)."""
        fields = top_up_fields(estimate, result)
        if fields is None:
            return
        try:
            event = new_usage_event(**fields)
        except InvalidRecord:
            self.metrics.published.labels("invalid").inc()
            log.exception("the top-up of %s not built", estimate["event_id"])
            return
        self.publish_soon(event)

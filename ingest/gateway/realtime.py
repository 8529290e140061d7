"""OpenAI Realtime sessions through the gateway (``GET /v1/realtime``, WebSocket).

A session is many responses, each charged on its own:

1. **Open**: identify the key, then check once (the hold covers the first
   response). A refusal is the gate's HTTP answer before any upgrade, and the
   upstream is never contacted.
2. **Relay** both ways, message by message, unmodified. Each client
   ``response.create`` beyond the first is checked first: a refused one is
   answered with an ``error`` event in OpenAI's shape (``insufficient_quota``)
   and published as a refusal; it never reaches the upstream.
3. **Account**: the realtime tap turns every ``response.done`` into a result;
   each is published and settles the oldest open hold (responses the server
   starts by itself, e.g. voice activity, are charged without one).
4. **Close**: responses still open are estimated (``client_disconnected``
   when the client left first) and charged; unused holds are released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import WSMsgType, web

from ingest.taps import TapResult, open_realtime_tap
from schemas.errors import InvalidRecord, SpendbusError
from schemas.usage import new_usage_event

from .errors import error_response
from .routes import REALTIME_API, Route

if TYPE_CHECKING:
    from .gate import GateDecision
    from .proxy import Gateway, _Call

log = logging.getLogger("spendbus.gateway.realtime")
#: the WebSocket status of a realtime session, written on its usage events
SWITCHING_PROTOCOLS = 101
_MAX_MESSAGE = 64 * 1024 * 1024


class RealtimeRelay:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def handle(self, request: web.Request) -> web.StreamResponse:
        from .proxy import _Call, upstream_headers

        gw = self.gateway
        who = gw.identify(request, "openai")
        if isinstance(who, web.Response):
            return who
        vk, upstream = who
        route = Route("openai", None, model=request.query.get("model") or None, streaming=True)
        call = _Call(route, vk, upstream, b"")
        call.model = route.model
        call.stream = True
        try:
            call.session_id = gw.sessions.session_id(
                vk, request.headers.get(gw.config.sessions.header)
            )
            ctx = gw.context(call, 0, None, api=REALTIME_API)
        except (ValueError, SpendbusError) as exc:
            return error_response("openai", 400, f"Invalid request: {exc}")
        decision = gw.gate.check(ctx)
        if not decision.allowed:
            return await gw._refuse(call, decision)
        credential = gw.credentials[vk.principal.secret_id]
        headers = upstream_headers(
            request.headers, "openai", credential, gw.config.forward_request_headers
        )
        for name in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
            headers.popall(name, None)
        url = f"{upstream.base_url}/v1/realtime"
        query = {k: v for k, v in request.query.items() if k != "key"}
        try:
            async with gw.response_deadline():
                upstream_ws = await gw.client.ws_connect(
                    url,
                    params=query,
                    headers=headers,
                    protocols=_protocols(request),
                    max_msg_size=_MAX_MESSAGE,
                    autoping=True,
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            gw.gate.release(decision.hold_id)
            gw.metrics.upstream_errors.labels("openai").inc()
            log.warning("realtime upstream unreachable: %r", exc)
            return error_response("openai", 502, "The upstream provider could not be reached.")
        client_ws = web.WebSocketResponse(
            protocols=(upstream_ws.protocol,) if upstream_ws.protocol else (),
            max_msg_size=_MAX_MESSAGE,
        )
        session = _Session(gw, call, ctx, decision)
        try:
            await client_ws.prepare(request)
            gw.metrics.allowed["openai"].inc()
            await session.relay(client_ws, upstream_ws)
        finally:
            await upstream_ws.close()
            task = asyncio.ensure_future(session.close())
            gw._pending.add(task)
            task.add_done_callback(gw._pending.discard)
            await asyncio.shield(task)
        return client_ws


def _protocols(request: web.Request) -> tuple[str, ...]:
    """The client's WebSocket subprotocols (browsers pass credentials in them: drop those)."""
    raw = request.headers.get("Sec-WebSocket-Protocol", "")
    offered = [p.strip() for p in raw.split(",") if p.strip()]
    return tuple(p for p in offered if not p.startswith("openai-insecure-api-key."))


class _Session:
    def __init__(self, gateway: Gateway, call: _Call, ctx: Any, first: GateDecision) -> None:
        self.gw = gateway
        self.call = call
        self.ctx = ctx
        self.tap = open_realtime_tap(model=call.model, estimator=gateway.estimator)
        #: the connect-time hold, waiting for the first response.create
        self.spare: GateDecision | None = first
        #: holds of responses asked for and not yet charged, oldest first
        self.open: deque[GateDecision] = deque()
        self.first = first
        self.cut: str | None = None

    async def relay(
        self, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
    ) -> None:
        to_upstream = asyncio.ensure_future(self._from_client(client, upstream))
        to_client = asyncio.ensure_future(self._from_upstream(upstream, client))
        done, pending = await asyncio.wait(
            {to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED
        )
        if to_upstream in done and self.cut is None:
            self.cut = "client_disconnected"
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                log.warning("realtime relay ended: %r", task.exception())
        if not client.closed:
            await client.close()

    async def _from_client(
        self, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
    ) -> None:
        async for msg in client:
            if msg.type == WSMsgType.TEXT:
                text: str = msg.data
                self.tap.feed_client_message(text)
                kind = _client_event_type(text)
                if kind is _TOO_DEEP:
                    # unreadable here, so never passed on unchecked: refused in OpenAI's shape
                    await client.send_str(_error_event("invalid_request_error", _TOO_DEEP, None))
                    continue
                if kind == "response.create" and not await self._admit(client, text):
                    continue
                await upstream.send_str(text)
            elif msg.type == WSMsgType.BINARY:
                self.tap.feed_client_message(msg.data)
                await upstream.send_bytes(msg.data)
            elif msg.type in (
                WSMsgType.CLOSE,
                WSMsgType.CLOSING,
                WSMsgType.CLOSED,
                WSMsgType.ERROR,
            ):
                break

    async def _from_upstream(
        self, upstream: aiohttp.ClientWebSocketResponse, client: web.WebSocketResponse
    ) -> None:
        async for msg in upstream:
            if msg.type == WSMsgType.TEXT:
                await client.send_str(msg.data)
                for result in self.tap.feed_message(msg.data):
                    await self._charge(result)
            elif msg.type == WSMsgType.BINARY:
                await client.send_bytes(msg.data)
            else:
                break
        if self.cut is None and upstream.close_code not in (1000, None):
            self.cut = "upstream_cut"

    async def _admit(self, client: web.WebSocketResponse, text: str) -> bool:
        """Check a response.create; False when it is refused (answered here, not forwarded)."""
        if self.spare is not None:
            self.open.append(self.spare)
            self.spare = None
            return True
        decision = self.gw.gate.check(self.ctx)
        if decision.allowed:
            self.open.append(decision)
            return True
        self.gw._refusal_event(self.call, decision)
        message = "Spend limit reached for this key; the response was not started."
        body = decision.body or {}
        nested = body.get("error")
        if isinstance(nested, dict) and isinstance(nested.get("message"), str):
            message = nested["message"]
        elif isinstance(body.get("message"), str):
            message = body["message"]
        client_event = json.loads(text).get("event_id")  # read whole by _client_event_type
        await client.send_str(_error_event("insufficient_quota", message, client_event))
        return False

    async def _charge(self, result: TapResult) -> None:
        decision = self.open.popleft() if self.open else None
        principal = self.call.vk.principal
        fields = (decision or self.first).usage_fields()
        try:
            event = new_usage_event(
                provider=self.call.upstream.provider_name,
                api=REALTIME_API,
                model=result.model or self.call.model or "unknown",
                secret_id=principal.secret_id,
                org_id=principal.org_id,
                gateway_id=self.gw.config.gateway_id,
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
                status_code=SWITCHING_PROTOCOLS,
                project_id=principal.project_id,
                grant_id=principal.grant_id,
                user_id=principal.user_id,
                groups=list(principal.groups),
                tags=dict(principal.tags),
                session_id=self.call.session_id,
                stream=True,
                **fields,
            )
        except InvalidRecord:
            self.gw.metrics.published.labels("invalid").inc()
            log.exception("realtime usage event not built")
            return
        await self.gw._publish(event)
        if decision is not None:
            self.gw.gate.settle(decision.hold_id, event)

    async def close(self) -> None:
        for result in self.tap.finish(cut=self.cut):
            await self._charge(result)
        for decision in (*self.open, *((self.spare,) if self.spare else ())):
            self.gw.gate.release(decision.hold_id)
        self.open.clear()
        self.spare = None


#: what a client message nested too deeply to parse is answered (and not forwarded)
_TOO_DEEP = "The event is nested too deeply to read; it was not sent."


def _client_event_type(text: str) -> str | None:
    """A client message's ``type`` (read structurally: every message is parsed, so neither
    size nor JSON escapes can slip a response.create past the check); None when it has
    none or is not JSON (the upstream answers that), ``_TOO_DEEP`` when too deeply nested
    to parse."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    except RecursionError:
        return _TOO_DEEP
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


def _error_event(code: str, message: str, client_event: Any) -> str:
    """An ``error`` server event in OpenAI's shape, from the gateway itself."""
    return json.dumps(
        {
            "type": "error",
            "event_id": f"event_spendbus_{uuid.uuid4().hex[:20]}",
            "error": {
                "type": code,
                "code": code,
                "message": message,
                "param": None,
                "event_id": client_event if isinstance(client_event, str) else None,
            },
        }
    )


__all__ = ["RealtimeRelay"]

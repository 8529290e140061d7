"""OpenAI Realtime sessions through the gateway (``GET /v1/realtime``, WebSocket).

A session is many responses, each charged on its own:

1. **Open**: identify the key, then check once (the hold covers the first
   response). A refusal is the gate's HTTP answer before any upgrade, and the
   upstream is never contacted.
2. **Relay** both ways, message by message, unmodified. Every client frame is
   read first; one the gateway cannot read (binary, not JSON, no string ``type``,
   a key given twice, nested too deeply) is refused with an ``error`` event and
   never forwarded. Each client ``response.create`` is checked before it is
   forwarded (the first one takes the connect-time hold).
3. **Every response is admitted**, client- or server-started: at its
   ``response.created`` a response no admitted ``response.create`` accounts for
   (voice activity, on by default, starts responses by itself) is checked then.
   A refused response is cancelled upstream (``response.cancel``), its events
   are not relayed, and the client gets an ``error`` event in OpenAI's shape
   (``insufficient_quota``); when the budget is spent (not merely busy with
   requests in flight) the session is closed (1008). Each refusal is published.
4. **Account**: the realtime tap turns every ``response.done`` into a result
   (cancelled ones carry usage too); each is published and settles the hold of
   its response.
5. **Close**: responses still open are estimated and charged; unused holds are
   released.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from ingest.taps import TapResult, open_realtime_tap
from schemas.errors import InvalidRecord, SpendbusError
from schemas.usage import BUDGET_EXCEEDED, JOB_BUDGET_EXCEEDED

from .access_log import DECISION
from .call import Call
from .config import Upstream, VirtualKey
from .core import GatewayCore
from .errors import error_response
from .gate import GateDecision
from .routes import REALTIME_API, Route
from .upstream import upstream_headers
from .usage_events import tap_usage_event

log = logging.getLogger("spendbus.gateway.realtime")
#: the WebSocket status of a realtime session, written on its usage events
SWITCHING_PROTOCOLS = 101
_MAX_MESSAGE = 64 * 1024 * 1024


class RealtimeRelay:
    """``GET /v1/realtime``: one WebSocket session relayed and metered response by response."""

    def __init__(self, gateway: GatewayCore) -> None:
        self.gateway = gateway

    async def handle(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway
        who = gw.identify(request, "openai")
        if isinstance(who, web.Response):
            return who
        vk, upstream = who
        # a session holds an upstream connection for as long as it lasts: it is one of the
        # key's requests in flight (max_in_flight_per_key)
        throttled = gw.enter_in_flight(vk, "openai")
        if throttled is not None:
            return throttled
        try:
            return await self._session(request, vk, upstream)
        finally:
            gw.leave_in_flight(vk)

    async def _session(
        self, request: web.Request, vk: VirtualKey, upstream: Upstream
    ) -> web.StreamResponse:
        gw = self.gateway
        route = Route("openai", None, model=request.query.get("model") or None, streaming=True)
        call = Call(route, vk, upstream, b"")
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
        request[DECISION] = decision  # the access log's budget note
        if not decision.allowed:
            return await gw.refuse(call, decision)
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
            gw.track(task)
            await asyncio.shield(task)
        return client_ws


def _protocols(request: web.Request) -> tuple[str, ...]:
    """The client's WebSocket subprotocols (browsers pass credentials in them: drop those)."""
    raw = request.headers.get("Sec-WebSocket-Protocol", "")
    offered = [p.strip() for p in raw.split(",") if p.strip()]
    return tuple(p for p in offered if not p.startswith("openai-insecure-api-key."))


class _Session:
    def __init__(self, gateway: GatewayCore, call: Call, ctx: Any, first: GateDecision) -> None:
        self.gw = gateway
        self.call = call
        self.ctx = ctx
        self.tap = open_realtime_tap(model=call.model, estimator=gateway.estimator)
        #: the connect-time hold, waiting for the first response (client- or server-started)
        self.spare: GateDecision | None = first
        #: holds of admitted client response.create events not yet started, oldest first
        self.requested: deque[GateDecision] = deque()
        #: response id -> the hold it was admitted with, until its response.done
        self.holds: dict[str, GateDecision] = {}
        #: responses refused at their start: cancelled upstream, their events not relayed
        self.refused: set[str] = set()
        self.first = first
        self.cut: str | None = None
        self.client: web.WebSocketResponse | None = None

    async def relay(
        self, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
    ) -> None:
        self.client = client
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
                event, problem = _read_client_event(text)
                if problem is not None:
                    # unreadable here, so never passed on unchecked
                    self.gw.metrics.realtime_frames_refused.labels(problem).inc()
                    await client.send_str(
                        _error_event("invalid_request_error", _UNREADABLE[problem], None)
                    )
                    continue
                if event.get("type") == "response.create":
                    decision = self._admit_requested()
                    if not decision.allowed:
                        await self._refused(client, decision, event.get("event_id"))
                        continue
                await upstream.send_str(text)
            elif msg.type == WSMsgType.BINARY:
                self.tap.feed_client_message(msg.data)
                self.gw.metrics.realtime_frames_refused.labels("binary").inc()
                await client.send_str(
                    _error_event("invalid_request_error", _UNREADABLE["binary"], None)
                )
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
                text: str = msg.data
                kind, response_id = _response_event(text, self.refused)
                relay = response_id is None or response_id not in self.refused
                if kind == "response.created" and response_id is not None and relay:
                    relay = await self._started(response_id, client, upstream)
                if relay:
                    await client.send_str(text)
                decision = None
                if kind == "response.done" and response_id is not None:
                    decision = self.holds.pop(response_id, None)
                    self.refused.discard(response_id)
                for result in self.tap.feed_message(text):
                    await self._charge(result, decision)
                    decision = None
            elif msg.type == WSMsgType.BINARY:
                await client.send_bytes(msg.data)
            else:
                break
        if self.cut is None and upstream.close_code not in (1000, None):
            self.cut = "upstream_cut"

    def _admit_requested(self) -> GateDecision:
        """A client response.create: the connect-time hold, else a check of its own."""
        if self.spare is not None:
            decision, self.spare = self.spare, None
        else:
            decision = self.gw.gate.check(self.ctx)
        if decision.allowed:
            self.requested.append(decision)
        return decision

    async def _started(
        self,
        response_id: str,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
    ) -> bool:
        """A response started: the hold of the response.create that asked for it, else
        (started by the server itself) the connect-time hold or a check now. False when
        refused: it is cancelled upstream and not relayed."""
        if self.requested:
            decision = self.requested.popleft()
        elif self.spare is not None:
            decision, self.spare = self.spare, None
        else:
            decision = self.gw.gate.check(self.ctx)
        if decision.allowed:
            self.holds[response_id] = decision
            return True
        self.refused.add(response_id)
        self.gw.metrics.realtime_server_refused.inc()
        with contextlib.suppress(ConnectionError):
            await upstream.send_str(
                json.dumps({"type": "response.cancel", "response_id": response_id})
            )
        await self._refused(client, decision, None)
        return False

    async def _refused(
        self, client: web.WebSocketResponse, decision: GateDecision, client_event: Any
    ) -> None:
        """A refused response: published, answered with an error event; a spent budget
        (not requests in flight, not a rate) closes the session."""
        self.gw.refusal_event(self.call, decision)
        message = "Spend limit reached for this key; the response was not started."
        body = decision.body or {}
        nested = body.get("error")
        if isinstance(nested, dict) and isinstance(nested.get("message"), str):
            message = nested["message"]
        elif isinstance(body.get("message"), str):
            message = body["message"]
        with contextlib.suppress(ConnectionError):
            await client.send_str(_error_event("insufficient_quota", message, client_event))
        if decision.usage_fields().get("decision") in (BUDGET_EXCEEDED, JOB_BUDGET_EXCEEDED):
            self.cut = SPENT_CUT
            await client.close(code=WSCloseCode.POLICY_VIOLATION, message=b"spend limit reached")

    async def _charge(self, result: TapResult, decision: GateDecision | None) -> None:
        self.gw.metrics.by_usage_source["openai", result.usage_source].inc()
        try:
            event = tap_usage_event(
                self.call,
                result,
                api=REALTIME_API,
                gateway_id=self.gw.config.gateway_id,
                status_code=SWITCHING_PROTOCOLS,
                decision_fields=(decision or self.first).usage_fields(),
            )
        except InvalidRecord:
            self.gw.metrics.published.labels("invalid").inc()
            log.exception("realtime usage event not built")
            return
        await self.gw.publish(event)
        if decision is not None:
            self.gw.gate.settle(decision.hold_id, event)

    async def close(self) -> None:
        # responses still open: estimated, each settling a hold still waiting (oldest first)
        waiting = deque([*self.holds.values(), *self.requested])
        for result in self.tap.finish(cut=self.cut):
            await self._charge(result, waiting.popleft() if waiting else None)
        for decision in (*waiting, *((self.spare,) if self.spare else ())):
            self.gw.gate.release(decision.hold_id)
        self.holds.clear()
        self.requested.clear()
        self.spare = None


#: the cut of a session the gateway closed because the budget is spent
SPENT_CUT = "stream_incomplete: the gateway closed the session (spend limit reached)"
#: why a client frame was not forwarded (the metric's label) -> what the client is told
_UNREADABLE = {
    "binary": "Binary frames are not read by this gateway (send JSON text events); "
    "the frame was not sent.",
    "not_json": "The event is not JSON; it was not sent.",
    "too_deep": "The event is nested too deeply to read; it was not sent.",
    "duplicate_key": "The event gives a key twice (ambiguous); it was not sent.",
    "no_type": "The event is not an object with a string type; it was not sent.",
}


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey
    return obj


def _read_client_event(text: str) -> tuple[dict[str, Any], str | None]:
    """A client event read structurally, whole (neither size nor JSON escapes slip a
    response.create past the check), and (event, None), or ({}, why it cannot be read):
    a key given twice is refused, as the upstream may read the other one."""
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey:
        return {}, "duplicate_key"
    except RecursionError:
        return {}, "too_deep"
    except ValueError:
        return {}, "not_json"
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return {}, "no_type"
    return obj, None


#: the server events the gateway reads itself (the tap reads the rest)
_RESPONSE_EVENTS = ("response.created", "response.done")


def _response_event(text: str, refused: set[str]) -> tuple[str | None, str | None]:
    """(type, response id) of a server event that starts or ends a response, or that
    belongs to a refused one; (None, None) otherwise. The provider's text is searched
    for the type names (or a refused id) only to skip parsing the rest (audio deltas);
    what it finds is then parsed and confirmed."""
    if not any(name in text for name in _RESPONSE_EVENTS) and not any(
        rid in text for rid in refused
    ):
        return None, None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    kind = obj.get("type")
    response = obj.get("response")
    rid = response.get("id") if isinstance(response, dict) else obj.get("response_id")
    if not isinstance(rid, str):
        return None, None
    return (kind if kind in _RESPONSE_EVENTS else None), rid


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

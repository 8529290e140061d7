"""OpenAI's Realtime API over WebSocket, faked: ``GET /v1/realtime?model=...``.

What a session does, as the real API does it:

- on connect: ``session.created`` (``session.model``, ``max_response_output_tokens``);
- ``session.update`` → ``session.updated``; ``conversation.item.create`` →
  ``conversation.item.created`` (its text joins the conversation);
  ``input_audio_buffer.append`` counts its audio as input;
- server voice activity detection (``turn_detection: server_vad``, on by default, as in
  the real API; ``session.update`` with ``turn_detection: null`` turns it off): each
  ``input_audio_buffer.append`` is taken as one spoken turn, so the server answers
  ``input_audio_buffer.speech_started`` / ``speech_stopped`` / ``committed``,
  ``conversation.item.created`` and **starts a response by itself** (no client
  ``response.create``); with it off, ``input_audio_buffer.commit`` commits and the
  client asks for the response;
- ``response.cancel`` (``response_id``) stops a response between two deltas: its
  ``response.done`` has ``status: cancelled`` (``cancels`` counts each one honoured) and bills what was generated so far
  (a response runs as a task of its own, so the session reads client events while
  it streams; ``chunk_latency_ms`` paces its deltas);
- ``response.create`` → ``response.created``, ``response.output_text.delta``
  events (with ``response_id``), ``response.output_text.done``, then
  ``response.done`` whose ``response.usage`` bills the **whole conversation**
  as input (``input_tokens`` includes ``input_token_details.cached_tokens``:
  what earlier responses already read is served from the cache) and the text
  as output. Output tokens come from the server's ``output_tokens`` range,
  capped by the response's or the session's ``max_response_output_tokens``.

Faults: ``x-fake-cut-after: N`` on the upgrade request drops the connection
after N deltas of the first response (before its ``response.done``). Stats
(route ``/v1/realtime``): sessions as requests, usage billed per
``response.done`` (``usage_unreported`` for a response cut short), ``responses``
started (by the client or by voice activity), ``cancels`` honoured, and
``client_events`` / ``binary_in`` (text and binary frames received).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

from aiohttp import WSMsgType, web

from .config import FakeUpstreamConfig
from .formats import CHARS_PER_TOKEN, DELTA_CHARS
from .routes import REALTIME
from .stats import Stats
from .text import make_text, split_text
from .usage import FakeUsage

#: base64 audio characters per input token (24 kHz PCM16 is ~ 1.3k chars per 20 ms token)
AUDIO_CHARS_PER_TOKEN = 1_300


class _Session:
    def __init__(self, rng: random.Random, model: str) -> None:
        self.rng = rng
        self.model = model
        self.max_output: int | None = None
        self.context_tokens = 0  # the conversation so far, in tokens
        self.cached_tokens = 0  # of it, what an earlier response already read
        self.responses = 0
        #: server voice activity detection (the real API's default)
        self.server_vad = True
        #: the response streaming now (one at a time, as the real API) and its cancel flag
        self.task: asyncio.Task[bool] | None = None
        self.current: str | None = None
        self.cancelled: set[str] = set()

    def event_id(self) -> str:
        return "event_" + "".join(self.rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", k=20))


async def serve(
    request: web.Request, *, config: FakeUpstreamConfig, stats: Stats
) -> web.StreamResponse:
    """One Realtime session on the upgraded ``request``, until either side closes."""
    model = request.query.get("model", "")
    stats.add(REALTIME, "requests")
    if not model:
        stats.status(REALTIME, 400)
        return web.json_response(
            {
                "error": {
                    "message": "Missing model",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
            status=400,
        )
    cut_after: int | None = None
    if config.honor_headers and request.headers.get("x-fake-cut-after", "").strip().isdigit():
        cut_after = int(request.headers["x-fake-cut-after"])
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    stats.status(REALTIME, 101)
    session = _Session(random.Random(f"{config.seed}|realtime|{model}"), model)
    link = _Link(ws, session, config=config, stats=stats, cut_after=cut_after)
    await link.send({"type": "session.created", "session": _session_object(session)})
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                stats.add(REALTIME, "binary_in")
                continue
            if msg.type != WSMsgType.TEXT:
                continue
            stats.add(REALTIME, "bytes_in", len(msg.data))
            stats.add(REALTIME, "client_events")
            try:
                event = json.loads(msg.data)
            except ValueError:
                await link.send(_error("invalid_request_error", "The message is not JSON."))
                continue
            if not await link.on_event(event):
                await ws.close()
                return ws
    except ConnectionError:
        stats.add(REALTIME, "client_disconnects")
    finally:
        if session.task is not None and not session.task.done():
            session.task.cancel()
    return ws


class _Link:
    """One session's WebSocket: the client's events answered, responses started."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        session: _Session,
        *,
        config: FakeUpstreamConfig,
        stats: Stats,
        cut_after: int | None,
    ) -> None:
        self.ws = ws
        self.session = session
        self.config = config
        self.stats = stats
        #: the first response is cut after this many deltas (``x-fake-cut-after``)
        self.cut_after = cut_after
        self._sending = asyncio.Lock()  # the session and its response task both send

    async def send(self, obj: dict[str, Any]) -> None:
        text = json.dumps({"event_id": self.session.event_id(), **obj})
        self.stats.add(REALTIME, "bytes_out", len(text))
        async with self._sending:
            await self.ws.send_str(text)

    async def on_event(self, event: Any) -> bool:
        """Answer one client event; False when a response was cut (the connection goes)."""
        session = self.session
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "session.update":
            await self._update(event.get("session") or {})
        elif kind == "conversation.item.create":
            item = event.get("item") or {}
            session.context_tokens += max(1, math.ceil(len(json.dumps(item)) / CHARS_PER_TOKEN))
            await self.send(
                {
                    "type": "conversation.item.created",
                    "item": {"id": f"item_{session.responses}", **item},
                }
            )
        elif kind == "input_audio_buffer.append":
            return await self._append_audio(event.get("audio") or "")
        elif kind == "input_audio_buffer.commit":
            await self.send({"type": "input_audio_buffer.committed", "item_id": "item_commit"})
        elif kind == "response.cancel":
            target = event.get("response_id") or session.current
            if isinstance(target, str) and target == session.current:
                session.cancelled.add(target)
                self.stats.add(REALTIME, "cancels")
        elif kind == "response.create":
            limit = (event.get("response") or {}).get("max_output_tokens")
            return await self.start(limit if type(limit) is int else None)
        else:
            await self.send(_error("invalid_request_error", f"Unknown event type {kind!r}."))
        return True

    async def _update(self, update: Any) -> None:
        session = self.session
        limit = update.get("max_response_output_tokens")
        if type(limit) is int and limit > 0:
            session.max_output = limit
        if "turn_detection" in update:
            detection = update["turn_detection"]
            session.server_vad = (
                isinstance(detection, dict) and detection.get("type") == "server_vad"
            )
        await self.send({"type": "session.updated", "session": _session_object(session)})

    async def _append_audio(self, audio: Any) -> bool:
        session = self.session
        session.context_tokens += math.ceil(len(audio) / AUDIO_CHARS_PER_TOKEN)
        if not session.server_vad:
            return True
        # the turn ends with this append: the server answers
        item_id = f"item_audio_{session.event_id()[-8:]}"
        for name in ("speech_started", "speech_stopped", "committed"):
            await self.send({"type": f"input_audio_buffer.{name}", "item_id": item_id})
        await self.send(
            {
                "type": "conversation.item.created",
                "item": {"id": item_id, "type": "message", "role": "user"},
            }
        )
        return await self.start(None)

    async def start(self, limit: int | None) -> bool:
        """Run one response (waiting for the one before); False when it was cut."""
        session = self.session
        if session.task is not None and not await session.task:
            return False
        cut, self.cut_after = self.cut_after, None
        session.task = asyncio.ensure_future(self._run(limit, cut))
        return True

    async def _run(self, limit: int | None, cut: int | None) -> bool:
        finished = await _respond(self.config, self.stats, self.session, self.send, limit, cut)
        if not finished:  # cut short: the connection is dropped
            await self.ws.close()
        return finished


async def _respond(
    config: FakeUpstreamConfig,
    stats: Stats,
    session: _Session,
    send: Any,
    limit: int | None,
    cut_after: int | None,
) -> bool:
    """One response; False when it was cut (the connection is to be dropped)."""
    rng = session.rng
    session.responses += 1
    stats.add(REALTIME, "responses")
    response_id = f"resp_{session.responses:04d}{rng.randrange(10**8):08d}"
    session.current = response_id
    lo, hi = config.output_tokens
    output = rng.randint(lo, hi)
    cap = limit or session.max_output
    if cap is not None:
        output = min(output, cap)
    usage = FakeUsage(
        input_tokens=session.context_tokens - session.cached_tokens,
        cache_read_tokens=session.cached_tokens,
        output_tokens=output,
    )
    await send(
        {
            "type": "response.created",
            "response": {"id": response_id, "object": "realtime.response", "status": "in_progress"},
        }
    )
    dlo, dhi = DELTA_CHARS["openai-chat"]
    pieces = split_text(make_text(rng, output * CHARS_PER_TOKEN), rng, dlo, dhi) if output else []
    status = "completed"
    for n, piece in enumerate(pieces):
        if response_id in session.cancelled:
            # what was generated before the cancel is billed
            status = "cancelled"
            usage = FakeUsage(
                input_tokens=usage.input_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                output_tokens=max(1, math.ceil(len("".join(pieces[:n])) / CHARS_PER_TOKEN)),
            )
            pieces = pieces[:n]
            break
        if n and config.chunk_latency_ms:
            await asyncio.sleep(config.chunk_latency_ms / 1000)
        if cut_after is not None and n >= cut_after:
            stats.add(REALTIME, "cuts")
            stats.billed(REALTIME, usage, reported=False)
            return False
        await send(
            {
                "type": "response.output_text.delta",
                "response_id": response_id,
                "item_id": f"item_out_{session.responses}",
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
        )
    await send(
        {"type": "response.output_text.done", "response_id": response_id, "text": "".join(pieces)}
    )
    await send(_done_event(response_id, status, usage))
    stats.billed(REALTIME, usage, reported=True)
    session.current = None
    # the next response rereads all of this one from the cache, and its output too
    session.cached_tokens = session.context_tokens
    session.context_tokens += usage.output_tokens
    return True


def _done_event(response_id: str, status: str, usage: FakeUsage) -> dict[str, Any]:
    """``response.done``: the response bills the whole conversation as input."""
    return {
        "type": "response.done",
        "response": {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "usage": {
                "total_tokens": usage.total_tokens,
                "input_tokens": usage.input_tokens + usage.cache_read_tokens,
                "output_tokens": usage.output_tokens,
                "input_token_details": {
                    "cached_tokens": usage.cache_read_tokens,
                    "text_tokens": usage.input_tokens + usage.cache_read_tokens,
                    "audio_tokens": 0,
                },
                "output_token_details": {"text_tokens": usage.output_tokens, "audio_tokens": 0},
            },
        },
    }


def _session_object(session: _Session) -> dict[str, Any]:
    return {
        "id": "sess_fake",
        "object": "realtime.session",
        "model": session.model,
        "modalities": ["text"],
        "turn_detection": {"type": "server_vad"} if session.server_vad else None,
        "max_response_output_tokens": session.max_output or "inf",
    }


def _error(kind: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": kind, "code": None, "message": message, "param": None},
    }

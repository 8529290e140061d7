"""An aiohttp server that answers like the LLM providers, on their own paths.

=====================================================  ==================================
``POST /v1/messages``                                  Anthropic Messages
``POST /v1/chat/completions``                          OpenAI Chat Completions
``POST /v1/responses``                                 OpenAI Responses
``POST /v1beta/models/{model}:generateContent``        Gemini (also under ``/v1/``)
``POST /v1beta/models/{model}:streamGenerateContent``  Gemini stream (``?alt=sse``: SSE,
                                                       else one JSON array)
``POST /v1/messages/count_tokens``                     Anthropic token counting (free)
``GET /v1/realtime?model=...`` (WebSocket)             OpenAI Realtime (see realtime.py)
``POST /model/{modelId}/converse``                     Bedrock Converse
``POST /model/{modelId}/converse-stream``              Bedrock Converse stream
``POST /model/{modelId}/invoke``                       Bedrock InvokeModel (Anthropic body)
``POST /model/{modelId}/invoke-with-response-stream``  its stream (Anthropic events in
                                                       ``chunk`` frames)
``GET /stats`` (``DELETE /stats`` resets)              what was served, by route
``GET /healthz``                                       ``ok``
=====================================================  ==================================

Answers carry the headers real providers send, account ids and an edge cookie included
(``openai-organization``, ``anthropic-organization-id``, ``set-cookie``, rate limits), so
a proxy in front can be checked for what it lets through; ``FakeUpstream.request_headers``
keeps the header names of the latest 1,000 requests (what such a proxy forwarded).

Usage is picked deterministically from the seed and the request body
(:func:`~spendbus.fake_upstream.responses.usage_for_request`: input about
bytes / 4, output within ``output_tokens``, cache hits with probability
``cache_ratio``). Faults are drawn per request from the seed and the request's
arrival number: an error status (``error_rate``, in the provider's JSON error
format), a stream cut before its usage (``cut_rate``: the connection is dropped,
so a client sees an incomplete body), or an error event inside a 200 stream
(``stream_error_rate``). A request may force them with headers (when
``honor_headers``): ``x-fake-status``, ``x-fake-cut-after``,
``x-fake-error-after`` (chunks) and ``x-fake-output-tokens``.

Latency: ``latency_ms`` before the first byte, ``chunk_latency_ms`` between
chunks (a non-streamed answer waits as long as its stream would have). Without
chunk latency, chunks are written in 64 KiB batches (TCP re-splits them anyway).
A cut non-streamed body stops halfway, short of its Content-Length.

``GET /stats`` also sums the usage each route billed: ``usage`` for responses
whose body carried it whole, ``usage_unreported`` for 2xx responses that did
not (cut, in-stream error, no ``include_usage``, client gone): the ground truth
a metering pipeline can be checked against.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .realtime import REALTIME
from .realtime import serve as serve_realtime
from .responses import (
    CHARS_PER_TOKEN,
    DELTA_CHARS,
    FakeExchange,
    FakeUsage,
    synthesize,
    synthesize_error,
    usage_for_request,
)


class FakeUpstreamConfig(BaseModel):
    """How the fake providers behave (validated when built, immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8790, ge=0, le=65535)
    #: Time to the first byte (headers and first chunk), in milliseconds.
    latency_ms: float = Field(default=0.0, ge=0)
    #: Time between two chunks of a stream (a non-streamed answer waits as
    #: long as its stream would have taken).
    chunk_latency_ms: float = Field(default=0.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    #: Statuses an error is drawn from (each in the provider's error format).
    error_statuses: tuple[int, ...] = (429, 500)
    cut_rate: float = Field(default=0.0, ge=0, le=1)
    stream_error_rate: float = Field(default=0.0, ge=0, le=1)
    cache_ratio: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0
    output_tokens: tuple[int, int] = (16, 512)
    #: Gzip bodies for clients that accept it.
    gzip: bool = False
    #: Obey the x-fake-* request headers.
    honor_headers: bool = True

    @field_validator("error_statuses")
    @classmethod
    def _statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(not 400 <= s <= 599 for s in value):
            raise ValueError("error_statuses must be non-empty 4xx/5xx statuses")
        return value

    @model_validator(mode="after")
    def _output_range(self) -> FakeUpstreamConfig:
        lo, hi = self.output_tokens
        if not 0 <= lo <= hi:
            raise ValueError("output_tokens must be (low, high) with 0 <= low <= high")
        return self


# -- stats ---------------------------------------------------------------------------------

_USAGE_FIELDS = tuple(FakeUsage(0, 0).as_dict())


@dataclass
class RouteStats:
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0
    cuts: int = 0
    stream_errors: int = 0
    client_disconnects: int = 0
    #: Realtime: responses started, cancels honoured, client text and binary frames
    responses: int = 0
    cancels: int = 0
    client_events: int = 0
    binary_in: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_USAGE_FIELDS, 0))
    usage_unreported: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(_USAGE_FIELDS, 0)
    )

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "errors": self.errors,
            "cuts": self.cuts,
            "stream_errors": self.stream_errors,
            "client_disconnects": self.client_disconnects,
            "responses": self.responses,
            "cancels": self.cancels,
            "client_events": self.client_events,
            "binary_in": self.binary_in,
            "statuses": dict(sorted(self.statuses.items())),
            "usage": dict(self.usage),
            "usage_unreported": dict(self.usage_unreported),
        }


class Stats:
    """Counters of everything served, in total and by route."""

    def __init__(self) -> None:
        self.total = RouteStats()
        self.routes: dict[str, RouteStats] = {}

    def reset(self) -> None:
        self.total = RouteStats()
        self.routes = {}

    def each(self, route: str) -> tuple[RouteStats, RouteStats]:
        per = self.routes.get(route)
        if per is None:
            per = self.routes[route] = RouteStats()
        return self.total, per

    def add(self, route: str, name: str, amount: int = 1) -> None:
        for stats in self.each(route):
            setattr(stats, name, getattr(stats, name) + amount)

    def status(self, route: str, status: int) -> None:
        for stats in self.each(route):
            stats.statuses[str(status)] = stats.statuses.get(str(status), 0) + 1

    def billed(self, route: str, usage: FakeUsage, *, reported: bool) -> None:
        for stats in self.each(route):
            bucket = stats.usage if reported else stats.usage_unreported
            for name, value in usage.as_dict().items():
                bucket[name] += value

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.total.as_dict(),
            "routes": {route: s.as_dict() for route, s in sorted(self.routes.items())},
        }


# -- the app ----------------------------------------------------------------------------------

ANTHROPIC = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
GEMINI = "/v1beta/models/{model}:generateContent"
GEMINI_STREAM = "/v1beta/models/{model}:streamGenerateContent"
CONVERSE = "/model/{modelId}/converse"
COUNT_TOKENS = "/v1/messages/count_tokens"
CONVERSE_STREAM = "/model/{modelId}/converse-stream"
INVOKE = "/model/{modelId}/invoke"
INVOKE_STREAM = "/model/{modelId}/invoke-with-response-stream"

#: The route (as named in /stats) -> the provider format it serves.
ROUTES: dict[str, str] = {
    ANTHROPIC: "anthropic-messages",
    CHAT: "openai-chat",
    RESPONSES: "openai-responses",
    GEMINI: "gemini",
    GEMINI_STREAM: "gemini",
    CONVERSE: "bedrock-converse",
    CONVERSE_STREAM: "bedrock-converse",
    INVOKE: "bedrock-invoke",
    INVOKE_STREAM: "bedrock-invoke",
}


@dataclass(frozen=True)
class _Call:
    """One request as routed: which format, model and framing it asks for."""

    route: str
    fmt: str
    model: str | None
    stream: bool | None  # None: the body's "stream" flag says
    gemini_sse: bool = True


class FakeUpstream:
    """The fake providers: ``app`` for aiohttp, or ``start()`` on a real port."""

    def __init__(self, config: FakeUpstreamConfig | None = None) -> None:
        self.config = config or FakeUpstreamConfig()
        self.stats = Stats()
        #: (route, the request's header names, lower case) of the latest requests: what a
        #: gateway in front forwarded
        self.request_headers: collections.deque[tuple[str, frozenset[str]]] = collections.deque(
            maxlen=1000
        )
        self._arrivals = 0
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.app = self._make_app()

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the fake upstream is not started")
        host = self.config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    async def start(self) -> str:
        """Listen on ``config.host``/``config.port`` (0: any free port); returns the URL."""
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        ports = [address[1] for address in runner.addresses if isinstance(address, tuple)]
        self.port = ports[0] if ports else self.config.port
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- routing ----------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(ANTHROPIC, self._fixed(ANTHROPIC))
        app.router.add_post(COUNT_TOKENS, self._count_tokens)
        app.router.add_get(REALTIME, self._realtime)
        app.router.add_post(CHAT, self._fixed(CHAT))
        app.router.add_post(RESPONSES, self._fixed(RESPONSES))
        app.router.add_post("/v1beta/models/{target}", self._gemini)
        app.router.add_post("/v1/models/{target}", self._gemini)
        app.router.add_post("/model/{model_id}/converse", self._bedrock(CONVERSE, False))
        app.router.add_post(
            "/model/{model_id}/converse-stream", self._bedrock(CONVERSE_STREAM, True)
        )
        app.router.add_post("/model/{model_id}/invoke", self._bedrock(INVOKE, False))
        app.router.add_post(
            "/model/{model_id}/invoke-with-response-stream", self._bedrock(INVOKE_STREAM, True)
        )
        app.router.add_get("/stats", self._get_stats)
        app.router.add_delete("/stats", self._reset_stats)
        app.router.add_get("/healthz", self._healthz)
        return app

    def _fixed(self, route: str) -> Any:
        call = _Call(route, ROUTES[route], None, None)

        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, call)

        return handler

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        model, _, action = request.match_info["target"].rpartition(":")
        if action not in ("generateContent", "streamGenerateContent") or not model:
            return _json(404, _google_error(404, f"Method {action!r} is not found."))
        stream = action == "streamGenerateContent"
        call = _Call(
            GEMINI_STREAM if stream else GEMINI,
            "gemini",
            model,
            stream,
            gemini_sse=request.query.get("alt") == "sse",
        )
        return await self._serve(request, call)

    def _bedrock(self, route: str, stream: bool) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            call = _Call(route, ROUTES[route], request.match_info["model_id"], stream)
            return await self._serve(request, call)

        return handler

    async def _realtime(self, request: web.Request) -> web.StreamResponse:
        return await serve_realtime(self, request)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic token counting: the prompt's tokens (about bytes / 4), never billed."""
        body = await request.read()
        self.stats.add(COUNT_TOKENS, "requests")
        self.stats.add(COUNT_TOKENS, "bytes_in", len(body))
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict) or not parsed.get("model"):
            self.stats.status(COUNT_TOKENS, 400)
            error = synthesize_error(
                "anthropic-messages",
                400,
                model="unknown",
                rng=random.Random(0),
                message="the body must be a JSON object naming a model",
            )
            return web.Response(body=error.body, status=400, content_type="application/json")
        self.stats.status(COUNT_TOKENS, 200)
        tokens = max(1, math.ceil(len(body) / CHARS_PER_TOKEN))
        return web.json_response({"input_tokens": tokens})

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.as_dict())

    async def _reset_stats(self, request: web.Request) -> web.Response:
        """Zero the counters (the fault sequence goes on: it follows arrivals)."""
        self.stats.reset()
        return web.json_response(self.stats.as_dict())

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # -- one request --------------------------------------------------------------------------
    async def _serve(self, request: web.Request, call: _Call) -> web.StreamResponse:
        config = self.config
        body = await request.read()
        self._arrivals += 1
        fault = random.Random(f"{config.seed}|fault|{self._arrivals}")
        stats = self.stats
        stats.add(call.route, "requests")
        stats.add(call.route, "bytes_in", len(body))
        self.request_headers.append((call.route, frozenset(n.lower() for n in request.headers)))
        forced = _Forced.read(request) if config.honor_headers else _Forced()

        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        model = call.model or (parsed.get("model") if isinstance(parsed, dict) else None)
        status = forced.status
        if not isinstance(parsed, dict) or not isinstance(model, str) or not model:
            status, message = 400, "the body must be a JSON object naming a model"
        else:
            message = None
            if status is None and fault.random() < config.error_rate:
                status = fault.choice(config.error_statuses)
        stream = (
            call.stream
            if call.stream is not None
            else bool(isinstance(parsed, dict) and parsed.get("stream") is True)
        )
        if status is not None:
            exchange = synthesize_error(
                call.fmt,
                status,
                model=model if isinstance(model, str) and model else "unknown",
                rng=fault,
                stream=stream,
                request=parsed if isinstance(parsed, dict) else {},
                message=message,
            )
            stats.add(call.route, "errors")
            return await self._send(request, call, exchange, declared=None)

        assert isinstance(parsed, dict) and isinstance(model, str)
        rng = random.Random(
            f"{config.seed}|{call.route}|{model}|{hashlib.sha256(body).hexdigest()}"
        )
        usage = usage_for_request(
            call.fmt,
            parsed,
            size=len(body),
            rng=rng,
            cache_ratio=config.cache_ratio,
            output_tokens=config.output_tokens,
            model=model,
        )
        if forced.output_tokens is not None:
            out = forced.output_tokens
            usage = replace(
                usage, output_tokens=out, reasoning_tokens=min(usage.reasoning_tokens, out)
            )
        gzip_body = config.gzip and "gzip" in request.headers.get("Accept-Encoding", "").lower()
        options: dict[str, Any] = {
            "model": model,
            "usage": usage,
            "stream": stream,
            "request": parsed,
            "server_tools": _server_tools(call.fmt, parsed),
            "gemini_sse": call.gemini_sse,
        }
        state = rng.getstate()
        exchange = synthesize(call.fmt, rng=rng, **options)
        # Faults need the whole answer first: they fall before the usage arrives.
        cut_after = forced.cut_after
        error_after = forced.error_after
        before = exchange.usage_after or len(exchange.chunks)
        if cut_after is None and error_after is None:
            if fault.random() < config.cut_rate:
                cut_after = fault.randrange(1, before) if stream and before > 1 else 0
            elif stream and fault.random() < config.stream_error_rate:
                error_after = fault.randrange(0, before)
        declared = None
        if cut_after is not None or error_after is not None or gzip_body:
            if cut_after is not None and not stream:
                declared = len(exchange.body)  # Content-Length of the whole body
            rng.setstate(state)
            exchange = synthesize(
                call.fmt,
                rng=rng,
                cut_after=cut_after,
                error_after=error_after if stream else None,
                gzip_body=gzip_body,
                **options,
            )
            if declared is not None and gzip_body:
                declared = 2 * len(exchange.body) + 1
        if exchange.cut:
            stats.add(call.route, "cuts")
        if exchange.error:
            stats.add(call.route, "stream_errors")
        if not stream:
            text_tokens = usage.output_tokens - usage.reasoning_tokens
            lo, hi = DELTA_CHARS[call.fmt]
            chunks = math.ceil(text_tokens * CHARS_PER_TOKEN / ((lo + hi) / 2))
            generation = chunks * config.chunk_latency_ms
        else:
            generation = 0.0
        return await self._send(
            request, call, exchange, declared=declared, generation_ms=generation
        )

    async def _send(
        self,
        request: web.Request,
        call: _Call,
        exchange: FakeExchange,
        *,
        declared: int | None,
        generation_ms: float = 0.0,
    ) -> web.StreamResponse:
        config = self.config
        stats = self.stats
        stats.status(call.route, exchange.status)
        response = web.StreamResponse(status=exchange.status, headers=exchange.headers)
        response.content_type = exchange.content_type.split(";")[0]
        if "charset=" in exchange.content_type:
            response.charset = exchange.content_type.split("charset=")[1]
        if exchange.content_encoding:
            response.headers["Content-Encoding"] = exchange.content_encoding
        if exchange.stream and exchange.status == 200:
            response.headers["Cache-Control"] = "no-cache"
        else:
            response.content_length = declared if declared is not None else len(exchange.body)
        wait = (config.latency_ms + generation_ms) / 1000
        if wait:
            await asyncio.sleep(wait)
        sent = 0
        try:
            await response.prepare(request)
            paced = config.chunk_latency_ms > 0 and exchange.stream
            for i, chunk in enumerate(exchange.chunks if paced else _coalesce(exchange.chunks)):
                if i and paced:
                    await asyncio.sleep(config.chunk_latency_ms / 1000)
                await response.write(chunk)
                sent += len(chunk)
            if exchange.cut:
                # The upstream goes away mid-body: no final chunk, no more bytes.
                transport = request.transport
                if transport is not None:
                    transport.abort()
            else:
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError) as exc:
            stats.add(call.route, "bytes_out", sent)
            stats.add(call.route, "client_disconnects")
            if exchange.status == 200:
                stats.billed(call.route, exchange.usage, reported=False)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return response
        stats.add(call.route, "bytes_out", sent)
        if exchange.status == 200:
            stats.billed(call.route, exchange.usage, reported=exchange.reported)
        return response


#: Bytes per write when chunks are not paced (TCP re-splits them anyway).
WRITE_SIZE = 64 * 1024


def _coalesce(chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size >= WRITE_SIZE:
            out.append(b"".join(pending))
            pending, size = [], 0
    if pending:
        out.append(b"".join(pending))
    return out


@dataclass(frozen=True)
class _Forced:
    status: int | None = None
    cut_after: int | None = None
    error_after: int | None = None
    output_tokens: int | None = None

    @classmethod
    def read(cls, request: web.Request) -> _Forced:
        def number(name: str, lo: int, hi: int) -> int | None:
            raw = request.headers.get(name)
            if raw is None:
                return None
            try:
                value = int(raw.strip())
            except ValueError:
                return None
            return value if lo <= value <= hi else None

        return cls(
            status=number("x-fake-status", 400, 599),
            cut_after=number("x-fake-cut-after", 0, 10**9),
            error_after=number("x-fake-error-after", 0, 10**9),
            output_tokens=number("x-fake-output-tokens", 0, 10_000_000),
        )


def _server_tools(fmt: str, request: dict[str, Any]) -> int:
    """Server tool calls the answer makes: one when the request offers a search tool."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return 0
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if fmt == "anthropic-messages" and isinstance(kind, str) and kind.startswith("web_search"):
            return 1
        if fmt == "openai-responses" and isinstance(kind, str) and kind.startswith("web_search"):
            return 1
        if fmt == "gemini" and ("googleSearch" in tool or "google_search" in tool):
            return 1
    return 0


def _google_error(status: int, message: str) -> dict[str, Any]:
    kind = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(status, "INTERNAL")
    return {"error": {"code": status, "message": message, "status": kind}}


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


def make_app(config: FakeUpstreamConfig | None = None) -> web.Application:
    """The aiohttp application of a new :class:`FakeUpstream`."""
    return FakeUpstream(config).app


__all__ = [
    "ROUTES",
    "FakeUpstream",
    "FakeUpstreamConfig",
    "RouteStats",
    "Stats",
    "make_app",
]

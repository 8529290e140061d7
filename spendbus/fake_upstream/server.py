"""An aiohttp server that answers like the LLM providers, on their own paths.

=====================================================  ==================================
``POST /v1/messages``                                  Anthropic Messages
``POST /v1/chat/completions``                          OpenAI Chat Completions
``POST /v1/responses``                                 OpenAI Responses (``background``:
                                                       ``queued``, usage null)
``GET /v1/responses/{id}``                             a background response, finished
                                                       (``?stream=true``: as events)
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
``GET /v1/organization/usage/completions``             OpenAI's admin usage and cost
``GET /v1/organization/costs``                         reports, and Anthropic's, of the
``GET /v1/organizations/usage_report/messages``        calls billed (billing.py; admin
``GET /v1/organizations/cost_report``                  key)
``GET /fake/billing-export/gemini``                    Gemini's calls billed as Cloud
                                                       Billing export rows (``?format=``
                                                       ``jsonl`` or ``csv``; admin key)
``GET /healthz``                                       ``ok``
=====================================================  ==================================

Answers carry the headers real providers send, account ids and an edge cookie included
(``openai-organization``, ``anthropic-organization-id``, ``set-cookie``, rate limits), so
a proxy in front can be checked for what it lets through; ``FakeUpstream.request_headers``
keeps the header names of the latest 1,000 requests (what such a proxy forwarded).

Usage is picked deterministically from the seed and the request body
(:func:`~spendbus.fake_upstream.usage.usage_for_request`: input about
bytes / 4, output within ``output_tokens``, cache hits with probability
``cache_ratio``). Faults are drawn per request from the seed and the request's
arrival number: an error status (``error_rate``, in the provider's JSON error
format), a stream cut before its usage (``cut_rate``: the connection is dropped,
so a client sees an incomplete body), or an error event inside a 200 stream
(``stream_error_rate``). A request may force them with headers (when
``honor_headers``): ``x-fake-status``, ``x-fake-cut-after``,
``x-fake-error-after`` (chunks) and ``x-fake-output-tokens``; ``x-fake-hostile``
writes the answer as an upstream reporting less than it billed would (a usage
given twice, the second zero; a zero report after the real one; a cheaper model
named: hostile.py), billed as usual.

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

import collections
import json
import math
import random
from typing import Any

from aiohttp import web

from . import openai_chat, openai_responses, realtime
from .answer import answer
from .billing import BillingLedger, ListPrices, report_handlers
from .config import FakeUpstreamConfig
from .exchange import synthesize_error
from .formats import CHARS_PER_TOKEN
from .routes import (
    ANTHROPIC,
    CHAT,
    CONVERSE,
    CONVERSE_STREAM,
    COUNT_TOKENS,
    GEMINI,
    GEMINI_STREAM,
    INVOKE,
    INVOKE_STREAM,
    REALTIME,
    RESPONSES,
    RESPONSES_RETRIEVE,
    ROUTES,
    Call,
)
from .stats import Stats


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
        #: background Responses, finished, by id (openai_responses.background)
        self.stored_responses: dict[str, bytes] = {}
        #: every call billed, which the admin usage reports aggregate (billing.py)
        self.billing = BillingLedger(ListPrices(self.config.price_file))
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
        app.router.add_get(RESPONSES + "/{response_id}", self._retrieve)
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
        for path, handler in report_handlers(self.billing, self.config.admin_key):
            app.router.add_get(path, handler)
        return app

    def _fixed(self, route: str) -> Any:
        call = Call(route, ROUTES[route], None, None)

        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, call)

        return handler

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        model, _, action = request.match_info["target"].rpartition(":")
        if action not in ("generateContent", "streamGenerateContent") or not model:
            return _json(404, _google_error(404, f"Method {action!r} is not found."))
        stream = action == "streamGenerateContent"
        call = Call(
            GEMINI_STREAM if stream else GEMINI,
            "gemini",
            model,
            stream,
            gemini_sse=request.query.get("alt") == "sse",
        )
        return await self._serve(request, call)

    def _bedrock(self, route: str, stream: bool) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            call = Call(route, ROUTES[route], request.match_info["model_id"], stream)
            return await self._serve(request, call)

        return handler

    async def _realtime(self, request: web.Request) -> web.StreamResponse:
        return await realtime.serve(request, config=self.config, stats=self.stats)

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
    async def _serve(self, request: web.Request, call: Call) -> web.StreamResponse:
        body = await request.read()
        self._arrivals += 1
        self.stats.add(call.route, "requests")
        self.stats.add(call.route, "bytes_in", len(body))
        self.request_headers.append((call.route, frozenset(n.lower() for n in request.headers)))
        return await answer(
            request,
            call,
            body,
            config=self.config,
            stats=self.stats,
            arrival=self._arrivals,
            stored=self.stored_responses,
            ledger=self.billing,
        )

    async def _retrieve(self, request: web.Request) -> web.Response:
        """``GET /v1/responses/{id}``: a background response, finished (never billed: its
        usage was counted when it was created)."""
        response_id = request.match_info["response_id"]
        self.stats.add(RESPONSES_RETRIEVE, "requests")
        headers = openai_chat.headers(random.Random(response_id))
        stored = self.stored_responses.get(response_id)
        if stored is None:
            self.stats.status(RESPONSES_RETRIEVE, 404)
            message = f"No response found with id '{response_id}'."
            error = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            return web.json_response(error, status=404, headers=headers)
        self.stats.status(RESPONSES_RETRIEVE, 200)
        if request.query.get("stream") == "true":
            replayed = openai_responses.replay(stored)
            return web.Response(body=replayed, content_type="text/event-stream", headers=headers)
        return web.Response(body=stored, content_type="application/json", headers=headers)


def _google_error(status: int, message: str) -> dict[str, Any]:
    kind = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(status, "INTERNAL")
    return {"error": {"code": status, "message": message, "status": kind}}


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


def make_app(config: FakeUpstreamConfig | None = None) -> web.Application:
    """The aiohttp application of a new :class:`FakeUpstream`."""
    return FakeUpstream(config).app


__all__ = ["FakeUpstream", "make_app"]

"""One provider request answered over HTTP: the usage drawn from the seed and the body,
faults drawn per arrival (or forced by ``x-fake-*`` headers), the exchange written paced
or in 64 KiB batches, and what it billed counted in the stats."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from aiohttp import web

from . import hostile, openai_responses
from .billing import BillingLedger
from .config import FakeUpstreamConfig
from .exchange import FakeExchange, synthesize, synthesize_error
from .formats import CHARS_PER_TOKEN, DELTA_CHARS
from .request import server_tools
from .routes import Call
from .stats import Stats
from .usage import FakeUsage, usage_for_request


def _answer_basis(fmt: str, body: bytes, request: dict[str, Any]) -> bytes:
    """What the answer is drawn from: the body, but a chat request's ``stream_options``
    change only how usage is reported, never the answer (as at OpenAI): such a body is
    drawn as the compact JSON of the same object without them, which is the body a
    client sending compact JSON without them sends. (The prompt's size stays the
    body's: only the seed.)"""
    if fmt != "openai-chat" or "stream_options" not in request:
        return body
    rest = {k: v for k, v in request.items() if k != "stream_options"}
    return json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode()


async def answer(
    request: web.Request,
    call: Call,
    body: bytes,
    *,
    config: FakeUpstreamConfig,
    stats: Stats,
    arrival: int,
    stored: dict[str, bytes] | None = None,
    ledger: BillingLedger | None = None,
) -> web.StreamResponse:
    """Answer ``request`` (its ``body`` read, the ``arrival``-th since the start;
    ``stored``: the background Responses kept for retrieval; ``ledger``: the bill each
    charged call goes on)."""
    fault = random.Random(f"{config.seed}|fault|{arrival}")
    forced = Forced.read(request) if config.honor_headers else Forced()

    parsed, model, stream = _read_call(call, body)
    status = forced.status
    if not isinstance(parsed, dict) or not isinstance(model, str) or not model:
        status, message = 400, "the body must be a JSON object naming a model"
    else:
        message = None
        if status is None and fault.random() < config.error_rate:
            status = fault.choice(config.error_statuses)
    if status is not None:
        refusal = synthesize_error(
            call.fmt,
            status,
            model=model if isinstance(model, str) and model else "unknown",
            rng=fault,
            stream=stream,
            request=parsed if isinstance(parsed, dict) else {},
            message=message,
        )
        stats.add(call.route, "errors")
        return await send(request, call, refusal, config=config, stats=stats, declared=None)

    assert isinstance(parsed, dict) and isinstance(model, str)
    basis = _answer_basis(call.fmt, body, parsed)
    rng = random.Random(f"{config.seed}|{call.route}|{model}|{hashlib.sha256(basis).hexdigest()}")
    usage = _drawn_usage(call, parsed, body, model=model, rng=rng, config=config, forced=forced)
    gzip_body = config.gzip and "gzip" in request.headers.get("Accept-Encoding", "").lower()
    options: dict[str, Any] = {
        "model": model,
        "usage": usage,
        "stream": stream,
        "request": parsed,
        "server_tools": server_tools(call.fmt, parsed),
        "gemini_sse": call.gemini_sse,
        "hostile_shape": forced.hostile,
    }
    state = rng.getstate()
    exchange = synthesize(call.fmt, rng=rng, **options)
    # Faults need the whole answer first: they fall before the usage arrives.
    cut_after, error_after = _drawn_faults(
        forced, fault, config, stream=stream, before=exchange.usage_after or len(exchange.chunks)
    )
    declared = None
    if cut_after is not None or error_after is not None or gzip_body:
        exchange, declared = _with_faults(
            exchange,
            rng=rng,
            state=state,
            options=options,
            cut_after=cut_after,
            error_after=error_after,
            gzip_body=gzip_body,
        )
    if (
        call.fmt == "openai-responses"
        and parsed.get("background") is True
        and stored is not None
        and not exchange.cut
        and not gzip_body
    ):
        exchange = _kept_in_background(exchange, stored, rng=rng, state=state, options=options)
    if exchange.cut:
        stats.add(call.route, "cuts")
    if exchange.error:
        stats.add(call.route, "stream_errors")
    return await send(
        request,
        call,
        exchange,
        config=config,
        stats=stats,
        declared=declared,
        generation_ms=0.0 if stream else _generation_ms(call, usage, config),
        bill=None if ledger is None else partial(ledger.record, call.fmt, request, model),
    )


def _read_call(call: Call, body: bytes) -> tuple[Any, Any, bool]:
    """``(parsed body, model, stream)``: the JSON (None if none), the model the route or the
    body names (unchecked), and whether the answer streams."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    model = call.model or (parsed.get("model") if isinstance(parsed, dict) else None)
    stream = (
        call.stream
        if call.stream is not None
        else bool(isinstance(parsed, dict) and parsed.get("stream") is True)
    )
    return parsed, model, stream


def _drawn_usage(
    call: Call,
    parsed: dict[str, Any],
    body: bytes,
    *,
    model: str,
    rng: random.Random,
    config: FakeUpstreamConfig,
    forced: Forced,
) -> FakeUsage:
    """What the answer bills: drawn for the request, its output forced by a header."""
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
        usage = replace(usage, output_tokens=out, reasoning_tokens=min(usage.reasoning_tokens, out))
    return usage


def _drawn_faults(
    forced: Forced, fault: random.Random, config: FakeUpstreamConfig, *, stream: bool, before: int
) -> tuple[int | None, int | None]:
    """``(cut_after, error_after)``: as forced, else drawn to fall before chunk ``before``
    (the one that completes the usage)."""
    cut_after = forced.cut_after
    error_after = forced.error_after
    if cut_after is None and error_after is None:
        if fault.random() < config.cut_rate:
            cut_after = fault.randrange(1, before) if stream and before > 1 else 0
        elif stream and fault.random() < config.stream_error_rate:
            error_after = fault.randrange(0, before)
    return cut_after, error_after


def _with_faults(
    exchange: FakeExchange,
    *,
    rng: random.Random,
    state: Any,
    options: dict[str, Any],
    cut_after: int | None,
    error_after: int | None,
    gzip_body: bool,
) -> tuple[FakeExchange, int | None]:
    """``exchange`` drawn again from the same ``state`` of ``rng``, cut, broken off or
    gzipped; and the Content-Length a cut whole body declared (None: its own)."""
    declared = None
    if cut_after is not None and not exchange.stream:
        declared = len(exchange.body)  # Content-Length of the whole body
    rng.setstate(state)
    exchange = synthesize(
        exchange.fmt,
        rng=rng,
        cut_after=cut_after,
        error_after=error_after if exchange.stream else None,
        gzip_body=gzip_body,
        **options,
    )
    if declared is not None and gzip_body:
        declared = 2 * len(exchange.body) + 1
    return exchange, declared


def _kept_in_background(
    exchange: FakeExchange,
    stored: dict[str, bytes],
    *,
    rng: random.Random,
    state: Any,
    options: dict[str, Any],
) -> FakeExchange:
    """A background Response, kept for retrieval (``state``: the ``rng`` state ``exchange``
    was drawn from)."""
    if exchange.stream:  # streamed as usual, and kept: the same draws give the same response
        rng.setstate(state)
        whole = synthesize(exchange.fmt, rng=rng, **{**options, "stream": False})
        openai_responses.background(whole.body, stored)
        return exchange
    # billed all the same: the answer carries no usage, the retrieval will
    queued = openai_responses.background(exchange.body, stored)
    return replace(exchange, chunks=[queued], usage_after=None)


def _generation_ms(call: Call, usage: FakeUsage, config: FakeUpstreamConfig) -> float:
    """How long a non-streamed answer takes to generate: as long as its text would take
    to stream, in chunks of the format's usual size."""
    text_tokens = usage.output_tokens - usage.reasoning_tokens
    lo, hi = DELTA_CHARS[call.fmt]
    chunks = math.ceil(text_tokens * CHARS_PER_TOKEN / ((lo + hi) / 2))
    return chunks * config.chunk_latency_ms


async def send(
    request: web.Request,
    call: Call,
    exchange: FakeExchange,
    *,
    config: FakeUpstreamConfig,
    stats: Stats,
    declared: int | None,
    generation_ms: float = 0.0,
    bill: Callable[[FakeUsage], None] | None = None,
) -> web.StreamResponse:
    """Write ``exchange`` (cut, paced or batched) and count what it served and billed
    (``bill``: the provider's ledger of charged calls); ``declared`` is the
    Content-Length a cut body promised."""
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
        for i, chunk in enumerate(exchange.chunks if paced else coalesce(exchange.chunks)):
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
            if bill is not None:
                bill(exchange.usage)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return response
    stats.add(call.route, "bytes_out", sent)
    if exchange.status == 200:
        stats.billed(call.route, exchange.usage, reported=exchange.reported)
        if bill is not None:
            bill(exchange.usage)
    return response


#: Bytes per write when chunks are not paced (TCP re-splits them anyway).
WRITE_SIZE = 64 * 1024


def coalesce(chunks: list[bytes]) -> list[bytes]:
    """``chunks`` joined into writes of about :data:`WRITE_SIZE` bytes."""
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
class Forced:
    """What a request forces with the ``x-fake-*`` headers (None: drawn as usual)."""

    status: int | None = None
    cut_after: int | None = None
    error_after: int | None = None
    output_tokens: int | None = None
    #: ``x-fake-hostile``: the answer reports its usage in this shape (hostile.SHAPES)
    hostile: str | None = None

    @classmethod
    def read(cls, request: web.Request) -> Forced:
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
            hostile=shape
            if (shape := request.headers.get("x-fake-hostile")) in hostile.SHAPES
            else None,
        )

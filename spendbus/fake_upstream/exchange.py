"""One request and the response a provider sends for it, synthesized: each format's
module (anthropic.py, openai_chat.py, ...) builds the bytes, this one assembles them.

Everything here is pure and deterministic given a :class:`random.Random`: the
same seed gives the same bytes. :func:`synthesize` encodes a :class:`~.usage.FakeUsage`
(the normalised meaning of docs/design.md, "Normalised usage") the way that provider
reports it, which is the inverse of what a tap reads (each format's encoding:
formats.py); cut bodies, in-stream errors, gzip and error statuses
(:func:`synthesize_error`) are the faults a tap must survive.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from schemas.billed_units import GEMINI_SERVICE_TIER_HEADER

from . import anthropic, bedrock, bedrock_invoke, gemini, hostile, openai_chat, openai_responses
from .formats import (
    CACHE_WRITES,
    CHARS_PER_TOKEN,
    EVENT_STREAM,
    EVENT_STREAMS,
    SSE,
    check_fmt,
    json_type,
)
from .provider import AnswerPlan, ErrorAnswer, Provider, draw_request_plan
from .request import max_output_tokens
from .template import dumps
from .text import make_text
from .usage import ZERO_USAGE, FakeUsage, fit_usage

#: format -> the module that builds its bytes
PROVIDERS: dict[str, Provider] = {
    provider.fmt: provider
    for provider in (
        anthropic.PROVIDER,
        openai_chat.PROVIDER,
        openai_responses.PROVIDER,
        gemini.PROVIDER,
        bedrock.PROVIDER,
        bedrock_invoke.PROVIDER,
    )
}


@dataclass(frozen=True)
class FakeExchange:
    """One request and the response a provider sends for it.

    ``chunks`` is the body as the provider streams it: one SSE event or one
    event-stream frame per chunk, or the whole JSON body as one chunk (gzip
    compressed when ``content_encoding`` says so, flushed per chunk).
    ``usage`` is what the provider billed (zero for an error status);
    ``usage_after`` is how many chunks must be read before the body carries
    that usage completely (None when it never does: a cut, an error, a stream
    without usage).
    """

    fmt: str
    request: dict[str, Any]
    request_bytes: bytes
    status: int
    content_type: str
    chunks: list[bytes]
    usage: FakeUsage
    stream: bool = False
    model: str = ""
    content_encoding: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage_after: int | None = None
    cut: bool = False
    error: str | None = None

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def reported(self) -> bool:
        """Whether the body carries the usage (a tap reads it as ``reported``)."""
        return self.usage_after is not None and self.usage_after <= len(self.chunks)


def gzip_chunks(chunks: list[bytes], *, finished: bool) -> list[bytes]:
    """Gzip ``chunks`` as one member, flushed after each so each decodes at once."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [compressor.compress(chunk) + compressor.flush(zlib.Z_SYNC_FLUSH) for chunk in chunks]
    if finished:
        tail = compressor.flush(zlib.Z_FINISH)
        if out:
            out[-1] += tail
        else:
            out.append(tail)
    return out


def synthesize(
    fmt: str,
    *,
    model: str,
    usage: FakeUsage,
    stream: bool,
    rng: random.Random,
    text_chars: int | None = None,
    cut_after: int | None = None,
    server_tools: int = 0,
    gzip_body: bool = False,
    request: dict[str, Any] | None = None,
    error_after: int | None = None,
    gemini_sse: bool = True,
    prompt_chars: int | None = None,
    hostile_shape: str | None = None,
) -> FakeExchange:
    """A request of ``fmt`` and the 200 response that bills ``usage``.

    ``usage`` is first fitted to what ``fmt`` can report (:func:`fit_usage`).
    ``request`` is used as sent when given (the server passes the client's);
    otherwise a realistic one is built (``prompt_chars`` of prompt, default
    about 4 characters per input token, at most 8 KiB). ``text_chars`` is the
    length of the answer's text (default 4 per visible output token).
    ``cut_after=N`` ends the body after N chunks (a non-streamed body stops
    halfway); ``error_after=N`` sends the provider's in-stream error after N
    chunks and ends the stream (streams only). ``server_tools`` adds server tool
    calls (Anthropic web search with a cumulative ``message_delta`` each, OpenAI
    Responses web search items, Gemini Google Search with tool-use prompt
    tokens). ``gemini_sse=False`` streams Gemini as a JSON array (no ``alt=sse``).
    ``hostile_shape`` (one of ``hostile.SHAPES``) writes the answer as an upstream that
    reports less than it billed would: the usage is what was billed all the same.
    """
    check_fmt(fmt)
    if hostile_shape is not None:
        hostile.check_shape(hostile_shape)
    plan = _answer_plan(
        fmt,
        model=model,
        usage=usage,
        stream=stream,
        rng=rng,
        text_chars=text_chars,
        server_tools=server_tools,
        request=request,
        prompt_chars=prompt_chars,
    )
    provider = PROVIDERS[fmt]
    headers = provider.headers(rng)
    if fmt == "gemini":  # Google names the tier that served the call in a header only
        headers[GEMINI_SERVICE_TIER_HEADER] = gemini.served_tier(plan.request)
    request_bytes = dumps(plan.request).encode()
    error = None
    if stream:
        chunks, usage_after, error = _stream_chunks(
            provider,
            plan,
            hostile_shape=hostile_shape,
            error_after=error_after,
            gemini_sse=gemini_sse,
        )
        chunks, usage_after, cut = _cut_stream(chunks, usage_after, cut_after)
        content_type = _stream_content_type(fmt, gemini_sse=gemini_sse)
    else:
        chunks, usage_after, cut = _whole_body(
            provider, plan, hostile_shape=hostile_shape, cut=cut_after is not None
        )
        content_type = json_type(fmt)
    encoding = None
    if gzip_body:
        chunks = gzip_chunks(chunks, finished=not cut)
        encoding = "gzip"
    return FakeExchange(
        fmt=fmt,
        request=plan.request,
        request_bytes=request_bytes,
        status=200,
        content_type=content_type,
        chunks=chunks,
        usage=plan.usage,
        stream=stream,
        model=model,
        content_encoding=encoding,
        headers=headers,
        usage_after=usage_after,
        cut=cut,
        error=error,
    )


def _answer_plan(
    fmt: str,
    *,
    model: str,
    usage: FakeUsage,
    stream: bool,
    rng: random.Random,
    text_chars: int | None,
    server_tools: int,
    request: dict[str, Any] | None,
    prompt_chars: int | None,
) -> AnswerPlan:
    """What the answer says: ``usage`` fitted to ``fmt``, its text, and the request."""
    original = usage
    usage = fit_usage(fmt, usage)
    if server_tools < 0:
        raise ValueError("server_tools must be >= 0")
    visible = usage.output_tokens - usage.reasoning_tokens
    if text_chars is None:
        text_chars = visible * CHARS_PER_TOKEN
    thinking_chars = 0
    if fmt in CACHE_WRITES and original.reasoning_tokens:
        # Thinking is shown (and billed inside output) but not counted apart.
        thinking_chars = min(original.reasoning_tokens * CHARS_PER_TOKEN, 16_000)
    if request is None:
        request = build_request(
            fmt,
            model=model,
            usage=original,
            stream=stream,
            rng=rng,
            server_tools=server_tools,
            prompt_chars=prompt_chars,
        )
    limit = max_output_tokens(fmt, request)
    return AnswerPlan(
        fmt=fmt,
        model=model,
        usage=usage,
        request=request,
        rng=rng,
        text=make_text(rng, text_chars),
        thinking=make_text(rng, thinking_chars),
        server_tools=server_tools,
        stop_at_limit=limit is not None and usage.output_tokens >= limit,
    )


def _whole_body(
    provider: Provider, plan: AnswerPlan, *, hostile_shape: str | None, cut: bool
) -> tuple[list[bytes], int | None, bool]:
    """The non-streamed body as one chunk, and after which chunk it carries the usage;
    a cut body stops halfway and never carries it."""
    body = provider.body(plan)
    if hostile_shape is not None:
        body = hostile.body(plan.fmt, hostile_shape, body)
    if cut:
        return [body[: len(body) // 2]], None, True
    return [body], 1, False


def _stream_chunks(
    provider: Provider,
    plan: AnswerPlan,
    *,
    hostile_shape: str | None,
    error_after: int | None,
    gemini_sse: bool,
) -> tuple[list[bytes], int | None, str | None]:
    """The stream's chunks, after which one it carries the usage, and its in-stream error:
    the provider's error event replaces what follows chunk ``error_after``."""
    chunks, usage_after = provider.stream(plan)
    if hostile_shape is not None:
        chunks, usage_after = hostile.stream(plan.fmt, hostile_shape, chunks, usage_after)
    error = None
    if error_after is not None:
        error_after = max(0, min(error_after, len(chunks) - 1))
        error, event = provider.stream_error(plan, error_after)
        chunks = [*chunks[:error_after], event]
        if usage_after is not None and usage_after > error_after:
            usage_after = None
    if plan.fmt == "gemini" and not gemini_sse:
        chunks = gemini.as_json_array(chunks, as_written=hostile_shape is not None)
    return chunks, usage_after, error


def _cut_stream(
    chunks: list[bytes], usage_after: int | None, cut_after: int | None
) -> tuple[list[bytes], int | None, bool]:
    """The stream ended after ``cut_after`` chunks (if it has more): the usage is carried
    only if it came before the cut."""
    if cut_after is None or cut_after >= len(chunks):
        return chunks, usage_after, False
    chunks = chunks[: max(0, cut_after)]
    if usage_after is not None and usage_after > len(chunks):
        usage_after = None
    return chunks, usage_after, True


def _stream_content_type(fmt: str, *, gemini_sse: bool) -> str:
    if fmt == "gemini":
        return "text/event-stream" if gemini_sse else json_type(fmt)
    return EVENT_STREAM if fmt in EVENT_STREAMS else SSE


def build_request(
    fmt: str,
    *,
    model: str,
    usage: FakeUsage,
    stream: bool,
    rng: random.Random,
    server_tools: int = 0,
    prompt_chars: int | None = None,
) -> dict[str, Any]:
    """A realistic request body of ``fmt`` that could have been billed ``usage``."""
    check_fmt(fmt)
    plan = draw_request_plan(
        model=model,
        usage=usage,
        stream=stream,
        rng=rng,
        server_tools=server_tools,
        prompt_chars=prompt_chars,
    )
    return PROVIDERS[fmt].request(plan)


def error_body(
    fmt: str, status: int, rng: random.Random, message: str | None = None
) -> ErrorAnswer:
    """The JSON error a provider answers with ``status``: ``(body, headers, description)``."""
    check_fmt(fmt)
    return PROVIDERS[fmt].error(status, rng, message)


def synthesize_error(
    fmt: str,
    status: int,
    *,
    model: str,
    rng: random.Random,
    stream: bool = False,
    request: dict[str, Any] | None = None,
    message: str | None = None,
) -> FakeExchange:
    """A non-2xx response in ``fmt``'s error format (not billable: zero usage)."""
    if not 400 <= status <= 599:
        raise ValueError(f"an error status is 4xx or 5xx, not {status}")
    if request is None:
        request = build_request(fmt, model=model, usage=FakeUsage(100, 100), stream=stream, rng=rng)
    body, headers, description = error_body(fmt, status, rng, message)
    if status == 429:
        headers["retry-after"] = str(rng.randint(1, 30))
    encoded = dumps(body).encode()
    return FakeExchange(
        fmt=fmt,
        request=request,
        request_bytes=dumps(request).encode(),
        status=status,
        content_type=json_type(fmt),
        chunks=[encoded],
        usage=ZERO_USAGE,
        stream=stream,
        model=model,
        headers=headers,
        usage_after=None,
        error=description,
    )

"""Each provider's wire format, synthesized: requests, streamed and whole responses, errors.

Everything here is pure and deterministic given a :class:`random.Random`: the
same seed gives the same bytes. :func:`synthesize` encodes a
:class:`FakeUsage` (the normalised meaning of docs/design.md, "Normalised usage")
the way that provider reports it, which is the inverse of what a tap reads:

===================  =========================================================
anthropic-messages   ``input_tokens`` excludes cache; ``cache_creation_input_tokens``
                     with ``cache_creation.ephemeral_5m/1h_input_tokens``;
                     ``cache_read_input_tokens``. Streamed: ``message_start``
                     carries the input side, cumulative ``message_delta``\\s the
                     output (several with server tools). Thinking is inside
                     ``output_tokens`` and not reported apart.
openai-chat          ``prompt_tokens`` = input + cache reads
                     (``prompt_tokens_details.cached_tokens``);
                     ``completion_tokens`` includes
                     ``completion_tokens_details.reasoning_tokens``. Streamed:
                     a last chunk with ``choices: []``, only when the request
                     sets ``stream_options.include_usage``. No cache writes.
openai-responses     ``input_tokens`` includes ``input_tokens_details.cached_tokens``;
                     ``output_tokens`` includes ``output_tokens_details.reasoning_tokens``;
                     streamed in ``response.completed`` (``response.incomplete``
                     when the output hit ``max_output_tokens``). No cache writes.
gemini               ``promptTokenCount`` includes ``cachedContentTokenCount``;
                     ``thoughtsTokenCount`` is apart from ``candidatesTokenCount``;
                     with server tools part of the input is
                     ``toolUsePromptTokenCount``. Streamed: every chunk carries a
                     cumulative ``usageMetadata``, the last one is final. No
                     cache writes.
bedrock-converse     ``inputTokens`` excludes cache; ``cacheReadInputTokens``,
                     ``cacheWriteInputTokens`` and ``cacheDetails`` (per TTL,
                     ``1h`` before ``5m``). Streamed: AWS event-stream frames, the
                     usage in the final ``metadata`` event. Reasoning is inside
                     ``outputTokens`` and not reported apart.
bedrock-invoke       Anthropic's body and usage on Bedrock (``invoke``; no ``model``
                     in the request). Streamed (``invoke-with-response-stream``):
                     each Anthropic event base64-encoded in a ``chunk`` event-stream
                     frame; ``message_stop`` adds ``amazon-bedrock-invocationMetrics``.
===================  =========================================================

What a provider cannot report is folded the way it bills: :func:`fit_usage`
turns cache writes into plain input for OpenAI and Gemini and drops the
reasoning split for Anthropic and Bedrock; ``FakeExchange.usage`` is the
fitted usage, the one a correct tap reads back.
"""

from __future__ import annotations

import base64
import json
import math
import random
import re
import struct
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

FORMATS: tuple[str, ...] = (
    "anthropic-messages",
    "openai-chat",
    "openai-responses",
    "gemini",
    "bedrock-converse",
    "bedrock-invoke",
)

SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"
EVENT_STREAM = "application/vnd.amazon.eventstream"

#: Formats whose usage carries cache writes / their 1-hour part / reasoning apart.
CACHE_WRITES = frozenset({"anthropic-messages", "bedrock-converse", "bedrock-invoke"})
#: Formats whose bodies are Anthropic's Messages (on Bedrock: InvokeModel).
ANTHROPIC_BODIES = frozenset({"anthropic-messages", "bedrock-invoke"})
#: Formats streamed as AWS event-stream frames.
EVENT_STREAMS = frozenset({"bedrock-converse", "bedrock-invoke"})
REASONING_APART = frozenset({"openai-chat", "openai-responses", "gemini"})

#: Characters of generated text per output token.
CHARS_PER_TOKEN = 4

#: (smallest, largest) characters of one streamed text delta, per format.
DELTA_CHARS: dict[str, tuple[int, int]] = {
    "anthropic-messages": (2, 24),  # a few tokens per content_block_delta
    "openai-chat": (1, 9),  # about one token per chunk
    "openai-responses": (1, 9),
    "gemini": (40, 320),  # Gemini streams sentence-sized chunks
    "bedrock-converse": (2, 24),
    "bedrock-invoke": (2, 24),
}


@dataclass(frozen=True)
class FakeUsage:
    """Normalised usage: ``input_tokens`` excludes cache reads and writes,
    ``output_tokens`` includes ``reasoning_tokens``."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.cache_write_1h_tokens > self.cache_write_tokens:
            raise ValueError("cache_write_1h_tokens exceeds cache_write_tokens")
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError("reasoning_tokens exceeds output_tokens")

    @property
    def total_tokens(self) -> int:
        """Every billed token: input + cache reads + cache writes + output."""
        return (
            self.input_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )

    @property
    def prompt_tokens(self) -> int:
        """Every input-side token (input + cache reads + cache writes)."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


ZERO_USAGE = FakeUsage(0, 0)


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


# -- usage -------------------------------------------------------------------------


def fit_usage(fmt: str, usage: FakeUsage) -> FakeUsage:
    """``usage`` as ``fmt`` can report it (see the module docstring)."""
    _check_fmt(fmt)
    if fmt not in CACHE_WRITES and usage.cache_write_tokens:
        usage = replace(
            usage,
            input_tokens=usage.input_tokens + usage.cache_write_tokens,
            cache_write_tokens=0,
            cache_write_1h_tokens=0,
        )
    if fmt not in REASONING_APART and usage.reasoning_tokens:
        usage = replace(usage, reasoning_tokens=0)
    return usage


def random_usage(
    fmt: str,
    rng: random.Random,
    *,
    max_input: int = 50_000,
    max_output: int = 2_000,
    cache: bool = True,
    reasoning: bool = True,
) -> FakeUsage:
    """A plausible usage ``fmt`` can report, over the whole range of its fields."""
    _check_fmt(fmt)
    prompt = rng.randint(1, max_input)
    read = write = write_1h = 0
    if cache and rng.random() < 0.6:
        read = rng.randint(0, prompt - 1)
        if fmt in CACHE_WRITES and rng.random() < 0.6:
            write = rng.randint(0, prompt - 1 - read)
            write_1h = rng.choice((0, write, rng.randint(0, write)))
    output = rng.randint(0, max_output)
    thought = 0
    if reasoning and fmt in REASONING_APART and rng.random() < 0.5:
        thought = rng.randint(0, output)
    return FakeUsage(
        input_tokens=prompt - read - write,
        output_tokens=output,
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write_1h,
        reasoning_tokens=thought,
    )


def usage_for_request(
    fmt: str,
    request: dict[str, Any],
    *,
    size: int,
    rng: random.Random,
    cache_ratio: float = 0.0,
    output_tokens: tuple[int, int] = (16, 512),
    model: str | None = None,
) -> FakeUsage:
    """The usage a provider would bill for ``request`` (``size`` bytes).

    The prompt is about ``size / 4`` tokens. With probability ``cache_ratio``
    most of it (60-95 %) is read from the prompt cache; otherwise, for
    providers that bill cache writes and when ``cache_ratio`` > 0, that prefix
    is written (with a 1-hour TTL when the request asks for one). The output is
    drawn from ``output_tokens`` and capped by the request's max tokens; when
    the request enables reasoning, part of it is reasoning.
    """
    _check_fmt(fmt)
    prompt = max(1, math.ceil(size / CHARS_PER_TOKEN))
    read = write = write_1h = 0
    if cache_ratio > 0 and prompt > 1:
        prefix = min(prompt - 1, int(prompt * rng.uniform(0.6, 0.95)))
        if rng.random() < cache_ratio:
            read = prefix
        elif fmt in CACHE_WRITES:
            write = prefix
            write_1h = write if _asks_1h_ttl(fmt, request) else 0
    lo, hi = output_tokens
    output = rng.randint(min(lo, hi), max(lo, hi))
    limit = max_output_tokens(fmt, request)
    if limit is not None:
        output = min(output, limit)
    thought = 0
    if output and _reasoning_enabled(fmt, request, model):
        thought = int(output * rng.uniform(0.2, 0.7))
    return fit_usage(
        fmt,
        FakeUsage(
            input_tokens=prompt - read - write,
            output_tokens=output,
            cache_read_tokens=read,
            cache_write_tokens=write,
            cache_write_1h_tokens=write_1h,
            reasoning_tokens=thought,
        ),
    )


def max_output_tokens(fmt: str, request: dict[str, Any]) -> int | None:
    """The request's output limit, if it names one."""
    value: Any = None
    if fmt in ANTHROPIC_BODIES:
        value = request.get("max_tokens")
    elif fmt == "openai-chat":
        value = request.get("max_completion_tokens") or request.get("max_tokens")
    elif fmt == "openai-responses":
        value = request.get("max_output_tokens")
    elif fmt == "gemini":
        config = request.get("generationConfig") or request.get("generation_config")
        if isinstance(config, dict):
            value = config.get("maxOutputTokens") or config.get("max_output_tokens")
    elif fmt == "bedrock-converse":
        config = request.get("inferenceConfig")
        if isinstance(config, dict):
            value = config.get("maxTokens")
    return value if type(value) is int and value > 0 else None


def request_streams(fmt: str, request: dict[str, Any]) -> bool:
    """The request's stream flag (Gemini and Bedrock say it in the URL: False)."""
    return request.get("stream") is True


_REASONING_MODELS = ("o1", "o3", "o4", "gpt-5")


def _reasoning_enabled(fmt: str, request: dict[str, Any], model: str | None) -> bool:
    if fmt in ANTHROPIC_BODIES:
        thinking = request.get("thinking")
        return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    if fmt in ("openai-chat", "openai-responses"):
        name = str(model or request.get("model") or "")
        if fmt == "openai-chat":
            effort = request.get("reasoning_effort")
        else:
            block = request.get("reasoning")
            effort = block.get("effort", "medium") if isinstance(block, dict) else None
        if effort is not None:
            return bool(effort != "none")
        return name.startswith(_REASONING_MODELS)
    if fmt == "gemini":
        config = request.get("generationConfig")
        thinking = config.get("thinkingConfig") if isinstance(config, dict) else None
        if isinstance(thinking, dict):
            budget = thinking.get("thinkingBudget")
            return bool(thinking.get("thinkingLevel")) or (type(budget) is int and budget != 0)
        return "2.5" in str(model or "") and "lite" not in str(model or "")
    extra = request.get("additionalModelRequestFields")
    thinking = extra.get("thinking") if isinstance(extra, dict) else None
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _asks_1h_ttl(fmt: str, request: dict[str, Any]) -> bool:
    """A cache breakpoint with a 1-hour TTL anywhere in the request's structure."""
    key = "cache_control" if fmt in ANTHROPIC_BODIES else "cachePoint"
    stack: list[Any] = [request]
    budget = 10_000
    while stack and budget > 0:
        budget -= 1
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            marker = node.get(key)
            if isinstance(marker, dict) and marker.get("ttl") == "1h":
                return True
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return False


# -- text ------------------------------------------------------------------------------

_VOCABULARY = (
    "the a of to and in is for on that with as by at from this be are it or an "
    "budget partition ledger token cache stream request latency counter broker "
    "offset replica event schema price model usage window verdict retention key "
    "consumer producer topic record batch commit rollup query analyst spend org "
    "limit threshold alert estimate provider response gateway proxy header "
    "every each one two three first last more less only also then when while "
    "should would could must may can will keep read write send count charge "
    "clause contract report quarter summary policy invoice customer region "
    "café naïve déjà-vu résumé Zürich — €12 °C 日本 ✓"
)
_WORDS = tuple(_VOCABULARY.split())

#: Text that looks like usage or framing: a tap reads structure, so it changes nothing.
_DECOYS = (
    '{"usage": {"input_tokens": 1, "output_tokens": 1}}',
    '"usageMetadata": {"promptTokenCount": 1}',
    "data: [DONE]",
    "event: message_stop",
    '{"prompt_tokens": 1, "completion_tokens": 1}',
)


def make_text(rng: random.Random, chars: int) -> str:
    """``chars`` characters of plausible prose: sentences of common words, a few
    non-ASCII, now and then a phrase that looks like usage or SSE framing."""
    if chars <= 0:
        return ""
    parts: list[str] = []
    size = 0
    while size < chars:
        words = rng.choices(_WORDS, k=rng.randint(6, 18))
        if rng.random() < 0.05:
            words[rng.randrange(len(words))] = rng.choice(_DECOYS)
        sentence = " ".join(words)
        piece = sentence[:1].upper() + sentence[1:] + rng.choice(".....?!:")
        piece += "\n\n" if rng.random() < 0.15 else " "
        parts.append(piece)
        size += len(piece)
    return "".join(parts)[:chars]


def split_text(text: str, rng: random.Random, lo: int, hi: int) -> list[str]:
    """``text`` cut in pieces of ``lo``..``hi`` characters (at least one piece)."""
    if not text:
        return []
    pieces = []
    i = 0
    while i < len(text):
        n = rng.randint(lo, hi)
        pieces.append(text[i : i + n])
        i += n
    return pieces


_BASE62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _id(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(_BASE62, k=n))


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choices("0123456789abcdef", k=n))


def _uuid(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


# -- framing ----------------------------------------------------------------------------


def _dumps(obj: Any, *, spaced: bool = False) -> str:
    if spaced:  # Google's encoders put a space after ':' and ','
        return json.dumps(obj, ensure_ascii=False)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse_event(name: str | None, obj: Any, *, crlf: bool = False) -> bytes:
    """One SSE event (``event:`` line when named, one ``data:`` line)."""
    data = obj if isinstance(obj, str) else _dumps(obj, spaced=crlf)
    eol = "\r\n" if crlf else "\n"
    head = f"event: {name}{eol}" if name else ""
    return f"{head}data: {data}{eol}{eol}".encode()


def slot(index: int) -> str:
    """A placeholder for :class:`_Template` (value number ``index``)."""
    return f"\x00{index}\x00"


_encode_str = json.encoder.encode_basestring  # a JSON string, non-ASCII kept (C)
_SLOT = re.compile(r'"\\u0000(\d+)\\u0000"')


class _Template:
    """An event serialised once with :func:`slot` placeholders: filling it in
    costs one ``json.dumps`` per value (streams have thousands of deltas)."""

    def __init__(self, text: str) -> None:
        self.parts = _SLOT.split(text)

    def fill(self, *values: Any) -> str:
        parts = self.parts
        out = [parts[0]]
        for i in range(1, len(parts), 2):
            value = values[int(parts[i])]
            out.append(_encode_str(value) if type(value) is str else json.dumps(value))
            out.append(parts[i + 1])
        return "".join(out)


def sse_template(name: str | None, obj: Any) -> _Template:
    return _Template(sse_event(name, obj).decode())


_U32 = struct.Struct(">I")


def event_stream_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message with string headers and both CRC32s."""
    raw = bytearray()
    for name, value in headers.items():
        key = name.encode()
        text = value.encode()
        raw += bytes([len(key)]) + key + b"\x07" + struct.pack(">H", len(text)) + text
    total = 16 + len(raw) + len(payload)
    prelude = struct.pack(">II", total, len(raw))
    message = prelude + _U32.pack(zlib.crc32(prelude)) + bytes(raw) + payload
    return message + _U32.pack(zlib.crc32(message))


def _gzip_chunks(chunks: list[bytes], *, finished: bool) -> list[bytes]:
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


# -- the exchange ---------------------------------------------------------------------------


@dataclass
class _Plan:
    """What one synthesized answer is made of."""

    fmt: str
    model: str
    usage: FakeUsage
    request: dict[str, Any]
    rng: random.Random
    text: str
    thinking: str
    server_tools: int
    stop_at_limit: bool


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
    """
    _check_fmt(fmt)
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
    plan = _Plan(
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
    headers = _headers(fmt, rng)
    request_bytes = _dumps(request).encode()
    if not stream:
        body = _BODIES[fmt](plan)
        chunks = [body]
        usage_after: int | None = 1
        cut = cut_after is not None
        if cut:
            chunks = [body[: len(body) // 2]]
            usage_after = None
        encoding = None
        if gzip_body:
            chunks = _gzip_chunks(chunks, finished=not cut)
            encoding = "gzip"
        return FakeExchange(
            fmt=fmt,
            request=request,
            request_bytes=request_bytes,
            status=200,
            content_type=json_type(fmt),
            chunks=chunks,
            usage=usage,
            stream=False,
            model=model,
            content_encoding=encoding,
            headers=headers,
            usage_after=usage_after,
            cut=cut,
        )

    chunks, usage_after = _STREAMS[fmt](plan)
    error = None
    if error_after is not None:
        error_after = max(0, min(error_after, len(chunks) - 1))
        error, event = _stream_error(plan, error_after)
        chunks = [*chunks[:error_after], event]
        if usage_after is not None and usage_after > error_after:
            usage_after = None
    if fmt == "gemini" and not gemini_sse:
        chunks = _as_json_array(chunks)
    cut = cut_after is not None and cut_after < len(chunks)
    if cut:
        assert cut_after is not None
        chunks = chunks[: max(0, cut_after)]
        if usage_after is not None and usage_after > len(chunks):
            usage_after = None
    content_type = EVENT_STREAM if fmt in EVENT_STREAMS else SSE
    if fmt == "gemini":
        content_type = "text/event-stream" if gemini_sse else json_type(fmt)
    encoding = None
    if gzip_body:
        chunks = _gzip_chunks(chunks, finished=not cut)
        encoding = "gzip"
    return FakeExchange(
        fmt=fmt,
        request=request,
        request_bytes=request_bytes,
        status=200,
        content_type=content_type,
        chunks=chunks,
        usage=usage,
        stream=True,
        model=model,
        content_encoding=encoding,
        headers=headers,
        usage_after=usage_after,
        cut=cut,
        error=error,
    )


def json_type(fmt: str) -> str:
    """The Content-Type of ``fmt``'s JSON bodies."""
    return "application/json; charset=UTF-8" if fmt == "gemini" else JSON


def _check_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


#: what real providers also answer about the account and the edge: organisation and
#: project ids, a load balancer's cookie, rate limits (constants: the draws stay as they were)
_ACCOUNT_HEADERS: dict[str, dict[str, str]] = {
    "anthropic": {
        "anthropic-organization-id": "6f1d3c2a-0b9e-4f7a-8c5d-fake0organis",
        "anthropic-ratelimit-requests-limit": "4000",
        "anthropic-ratelimit-requests-remaining": "3999",
        "anthropic-ratelimit-tokens-remaining": "399000",
        "set-cookie": "__cf_bm=fake-edge-cookie; path=/; HttpOnly; Secure",
        "cf-ray": "8f00fake0000-AMS",
    },
    "openai": {
        "openai-organization": "org-fake-operator",
        "openai-project": "proj_fake_operator",
        "openai-version": "2020-10-01",
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-remaining-tokens": "29999000",
        "x-ratelimit-reset-requests": "6ms",
        "set-cookie": "__cf_bm=fake-edge-cookie; path=/; HttpOnly; Secure",
        "cf-ray": "8f00fake0000-AMS",
    },
}


def _headers(fmt: str, rng: random.Random) -> dict[str, str]:
    if fmt == "anthropic-messages":
        return {"request-id": "req_" + _id(rng, 24), **_ACCOUNT_HEADERS["anthropic"]}
    if fmt in ("openai-chat", "openai-responses"):
        return {
            "x-request-id": "req_" + _hex(rng, 32),
            "openai-processing-ms": str(rng.randint(80, 2_000)),
            **_ACCOUNT_HEADERS["openai"],
        }
    if fmt == "gemini":
        return {"server": "scaffolding on HTTPServer2", "x-content-type-options": "nosniff"}
    return {"x-amzn-requestid": _uuid(rng)}


# -- requests ---------------------------------------------------------------------------------


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
    _check_fmt(fmt)
    if fmt == "bedrock-invoke":  # Anthropic's body; the model and streaming are in the URL
        invoke = build_request(
            "anthropic-messages",
            model=model,
            usage=usage,
            stream=False,
            rng=rng,
            server_tools=server_tools,
            prompt_chars=prompt_chars,
        )
        del invoke["model"]
        return {"anthropic_version": "bedrock-2023-05-31", **invoke}
    if prompt_chars is None:
        prompt_chars = min(usage.prompt_tokens * CHARS_PER_TOKEN, 8_192)
    system = "You are a careful assistant for the finance team. " + make_text(
        rng, max(0, prompt_chars // 3 - 50)
    )
    question = make_text(rng, max(8, prompt_chars - len(system)))
    cached = usage.cache_read_tokens or usage.cache_write_tokens
    one_hour = usage.cache_write_1h_tokens > 0
    reasoning = usage.reasoning_tokens > 0
    limit = _limit(rng, usage.output_tokens)
    req: dict[str, Any]
    if fmt == "anthropic-messages":
        block: dict[str, Any] = {"type": "text", "text": system}
        if cached:
            block["cache_control"] = {"type": "ephemeral", **({"ttl": "1h"} if one_hour else {})}
        req = {"model": model, "max_tokens": limit, "system": [block]}
        if reasoning:
            budget = max(1_024, usage.reasoning_tokens)
            req["max_tokens"] = max(limit, _limit(rng, budget + 1))
            req["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if server_tools:
            req["tools"] = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
        req["messages"] = [{"role": "user", "content": question}]
        if stream:
            req["stream"] = True
        return req
    if fmt == "openai-chat":
        req = {
            "model": model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_completion_tokens": limit,
        }
        if reasoning:
            req["reasoning_effort"] = rng.choice(("low", "medium", "high"))
        if stream:
            req["stream"] = True
            req["stream_options"] = {"include_usage": True}
        return req
    if fmt == "openai-responses":
        req = {
            "model": model,
            "input": [
                {"role": "developer", "content": system},
                {"role": "user", "content": question},
            ],
            "max_output_tokens": limit,
            "store": False,
        }
        if reasoning:
            req["reasoning"] = {"effort": rng.choice(("low", "medium", "high"))}
        if server_tools:
            req["tools"] = [{"type": "web_search"}]
        if stream:
            req["stream"] = True
        return req
    if fmt == "gemini":
        config: dict[str, Any] = {"maxOutputTokens": limit, "temperature": 0.7}
        if reasoning:
            config["thinkingConfig"] = {
                "thinkingBudget": max(1_024, usage.reasoning_tokens),
                "includeThoughts": rng.random() < 0.5,
            }
        req = {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": question}]}],
            "generationConfig": config,
        }
        if server_tools:
            req["tools"] = [{"googleSearch": {}}]
        return req
    system_blocks: list[dict[str, Any]] = [{"text": system}]
    if cached:
        point: dict[str, Any] = {"type": "default"}
        if one_hour:
            point["ttl"] = "1h"
        system_blocks.append({"cachePoint": point})
    req = {
        "messages": [{"role": "user", "content": [{"text": question}]}],
        "system": system_blocks,
        "inferenceConfig": {"maxTokens": limit, "temperature": 0.5},
    }
    if reasoning:
        budget = max(1_024, usage.reasoning_tokens)
        req["inferenceConfig"]["maxTokens"] = max(limit, _limit(rng, budget + 1))
        req["additionalModelRequestFields"] = {
            "thinking": {"type": "enabled", "budget_tokens": budget}
        }
    return req


_LIMITS = (1_024, 2_048, 4_096, 8_192, 16_384, 32_000, 64_000)


def _limit(rng: random.Random, at_least: int) -> int:
    choices = [n for n in _LIMITS if n >= at_least]
    return rng.choice(choices) if choices else at_least


# -- Anthropic ---------------------------------------------------------------------------------


def _anthropic_usage(u: FakeUsage, *, output: int | None = None) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": u.cache_write_tokens - u.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        },
        "output_tokens": u.output_tokens if output is None else output,
        "service_tier": "standard",
    }


def _anthropic_stop(plan: _Plan) -> str:
    return "max_tokens" if plan.stop_at_limit else "end_turn"


def _search_blocks(plan: _Plan, k: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    rng = plan.rng
    tool_id = "srvtoolu_" + _id(rng, 24)
    query = make_text(rng, rng.randint(12, 40)).strip()
    use = {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {}}
    result = {
        "type": "web_search_tool_result",
        "tool_use_id": tool_id,
        "content": [
            {
                "type": "web_search_result",
                "title": make_text(rng, rng.randint(20, 60)).strip(),
                "url": f"https://example.com/{_id(rng, 8).lower()}/{k}",
                "encrypted_content": _id(rng, 48),
                "page_age": None,
            }
        ],
    }
    return use, result, _dumps({"query": query})


def _anthropic_stream(plan: _Plan) -> tuple[list[bytes], int]:
    rng, u = plan.rng, plan.usage
    tools = plan.server_tools
    # message_start: the input of the first sampling step, a few output tokens.
    start_input = u.input_tokens // (tools + 1) if tools else u.input_tokens
    start_output = min(u.output_tokens, rng.randint(1, 4))
    start_usage = _anthropic_usage(replace(u, input_tokens=start_input), output=start_output)
    if tools:
        start_usage["server_tool_use"] = {"web_search_requests": 0}
    chunks = [
        sse_event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_" + _id(rng, 24),
                    "type": "message",
                    "role": "assistant",
                    "model": plan.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
    ]
    index = 0

    def block(
        start: dict[str, Any],
        pieces: list[str] = [],  # noqa: B006 - never mutated
        kind: tuple[str, str] = ("text_delta", "text"),
        tail: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """One content block: its start, a delta of type ``kind`` = (type, field)
        per text piece, then the ``tail`` deltas, its stop."""
        nonlocal index
        where = {"type": "content_block_delta", "index": index}
        chunks.append(
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        if index == 0:
            chunks.append(sse_event("ping", {"type": "ping"}))
        delta_type, field_name = kind
        template = sse_template(
            "content_block_delta", {**where, "delta": {"type": delta_type, field_name: slot(0)}}
        )
        chunks.extend(template.fill(piece).encode() for piece in pieces)
        chunks.extend(sse_event("content_block_delta", {**where, "delta": d}) for d in tail)
        chunks.append(
            sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
        )
        index += 1

    lo, hi = DELTA_CHARS[plan.fmt]
    if plan.thinking:
        block(
            {"type": "thinking", "thinking": "", "signature": ""},
            split_text(plan.thinking, rng, lo * 4, hi * 4),
            ("thinking_delta", "thinking"),
            ({"type": "signature_delta", "signature": _id(rng, 64)},),
        )
    for k in range(tools):
        preamble = make_text(rng, rng.randint(20, 60))
        block({"type": "text", "text": ""}, split_text(preamble, rng, lo, hi))
        use, result, query = _search_blocks(plan, k)
        block(use, ["", query], ("input_json_delta", "partial_json"))
        block(result)
        # A cumulative usage after each server tool call: never a sum.
        step = k + 1
        chunks.append(
            sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": None, "stop_sequence": None},
                    "usage": {
                        "input_tokens": start_input
                        + (u.input_tokens - start_input) * step // (tools + 1),
                        "cache_creation_input_tokens": u.cache_write_tokens,
                        "cache_read_input_tokens": u.cache_read_tokens,
                        "output_tokens": start_output
                        + (u.output_tokens - start_output) * step // (tools + 1),
                        "server_tool_use": {"web_search_requests": step},
                    },
                },
            )
        )
    block({"type": "text", "text": ""}, split_text(plan.text, rng, lo, hi))
    final: dict[str, Any]
    if tools or rng.random() < 0.5:  # the newer, fully cumulative shape
        final = {
            "input_tokens": u.input_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens,
            "cache_read_input_tokens": u.cache_read_tokens,
            "output_tokens": u.output_tokens,
        }
        if tools:
            final["server_tool_use"] = {"web_search_requests": tools}
    else:
        final = {"output_tokens": u.output_tokens}
    chunks.append(
        sse_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _anthropic_stop(plan), "stop_sequence": None},
                "usage": final,
            },
        )
    )
    chunks.append(sse_event("message_stop", {"type": "message_stop"}))
    return chunks, len(chunks)


def _anthropic_body(plan: _Plan) -> bytes:
    rng = plan.rng
    content: list[dict[str, Any]] = []
    if plan.thinking:
        content.append({"type": "thinking", "thinking": plan.thinking, "signature": _id(rng, 64)})
    for k in range(plan.server_tools):
        use, result, query = _search_blocks(plan, k)
        use["input"] = json.loads(query)
        content += [{"type": "text", "text": make_text(rng, rng.randint(20, 60))}, use, result]
    content.append({"type": "text", "text": plan.text})
    usage = _anthropic_usage(plan.usage)
    if plan.server_tools:
        usage["server_tool_use"] = {"web_search_requests": plan.server_tools}
    return _dumps(
        {
            "id": "msg_" + _id(rng, 24),
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": content,
            "stop_reason": _anthropic_stop(plan),
            "stop_sequence": None,
            "usage": usage,
        }
    ).encode()


# -- OpenAI Chat Completions ------------------------------------------------------------------


def _chat_usage(u: FakeUsage) -> dict[str, Any]:
    prompt = u.input_tokens + u.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": u.output_tokens,
        "total_tokens": prompt + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _chat_finish(plan: _Plan) -> str:
    return "length" if plan.stop_at_limit else "stop"


def _include_usage(request: dict[str, Any]) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _chat_stream(plan: _Plan) -> tuple[list[bytes], int | None]:
    rng = plan.rng
    with_usage = _include_usage(plan.request)
    base: dict[str, Any] = {
        "id": "chatcmpl-" + _id(rng, 29),
        "object": "chat.completion.chunk",
        "created": 1_750_000_000 + rng.randrange(10_000_000),
        "model": plan.model,
        "service_tier": "default",
        "system_fingerprint": "fp_" + _hex(rng, 10),
    }

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {**base, "choices": choices, **extra}
        if with_usage and "usage" not in extra:
            obj["usage"] = None
        return sse_event(None, obj)

    def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    lo, hi = DELTA_CHARS[plan.fmt]
    chunks = [chunk([choice({"role": "assistant", "content": "", "refusal": None})])]
    template = _Template(chunk([choice({"content": slot(0)})]).decode())
    chunks += [template.fill(p).encode() for p in split_text(plan.text, rng, lo, hi)]
    chunks.append(chunk([choice({}, _chat_finish(plan))]))
    usage_after = None
    if with_usage:
        chunks.append(chunk([], usage=_chat_usage(plan.usage)))
        usage_after = len(chunks)
    chunks.append(b"data: [DONE]\n\n")
    return chunks, usage_after


def _chat_body(plan: _Plan) -> bytes:
    rng = plan.rng
    return json.dumps(
        {
            "id": "chatcmpl-" + _id(rng, 29),
            "object": "chat.completion",
            "created": 1_750_000_000 + rng.randrange(10_000_000),
            "model": plan.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": plan.text,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": _chat_finish(plan),
                }
            ],
            "usage": _chat_usage(plan.usage),
            "service_tier": "default",
            "system_fingerprint": "fp_" + _hex(rng, 10),
        },
        ensure_ascii=False,
        indent=2,
    ).encode()


# -- OpenAI Responses ---------------------------------------------------------------------------


def _responses_usage(u: FakeUsage) -> dict[str, Any]:
    prompt = u.input_tokens + u.cache_read_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": prompt + u.output_tokens,
    }


def _response_object(
    plan: _Plan, ids: dict[str, str], *, status: str, output: list[Any], usage: Any
) -> dict[str, Any]:
    request = plan.request
    return {
        "id": ids["resp"],
        "object": "response",
        "created_at": int(ids["created"]),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "max_output_tokens": request.get("max_output_tokens"),
        "model": plan.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": request.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def _responses_items(plan: _Plan, ids: dict[str, str]) -> list[dict[str, Any]]:
    """The output items of a finished response, in order."""
    rng = plan.rng
    items: list[dict[str, Any]] = []
    if plan.usage.reasoning_tokens:
        items.append({"id": "rs_" + _hex(rng, 48), "type": "reasoning", "summary": []})
    for _ in range(plan.server_tools):
        items.append(
            {
                "id": "ws_" + _hex(rng, 48),
                "type": "web_search_call",
                "status": "completed",
                "action": {"type": "search", "query": make_text(rng, rng.randint(12, 40)).strip()},
            }
        )
    items.append(
        {
            "id": ids["msg"],
            "type": "message",
            "status": "incomplete" if plan.stop_at_limit else "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "annotations": [], "logprobs": [], "text": plan.text}
            ],
        }
    )
    return items


def _responses_ids(rng: random.Random) -> dict[str, str]:
    return {
        "resp": "resp_" + _hex(rng, 48),
        "msg": "msg_" + _hex(rng, 48),
        "created": str(1_750_000_000 + rng.randrange(10_000_000)),
    }


def _responses_stream(plan: _Plan) -> tuple[list[bytes], int]:
    rng = plan.rng
    ids = _responses_ids(rng)
    items = _responses_items(plan, ids)
    chunks: list[bytes] = []

    def event(name: str, **fields: Any) -> None:
        chunks.append(sse_event(name, {"type": name, "sequence_number": len(chunks), **fields}))

    pending = _response_object(plan, ids, status="in_progress", output=[], usage=None)
    event("response.created", response=pending)
    event("response.in_progress", response=pending)
    for index, item in enumerate(items):
        if item["type"] == "reasoning":
            event("response.output_item.added", output_index=index, item=item)
            event("response.output_item.done", output_index=index, item=item)
        elif item["type"] == "web_search_call":
            event(
                "response.output_item.added",
                output_index=index,
                item={"id": item["id"], "type": "web_search_call", "status": "in_progress"},
            )
            for phase in ("in_progress", "searching", "completed"):
                event(f"response.web_search_call.{phase}", output_index=index, item_id=item["id"])
            event("response.output_item.done", output_index=index, item=item)
        else:
            started = {**item, "status": "in_progress", "content": []}
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            event("response.output_item.added", output_index=index, item=started)
            event("response.content_part.added", **where, part=part)
            lo, hi = DELTA_CHARS[plan.fmt]
            name = "response.output_text.delta"
            template = sse_template(
                name,
                {
                    "type": name,
                    "sequence_number": slot(0),
                    **where,
                    "delta": slot(1),
                    "logprobs": [],
                    "obfuscation": slot(2),
                },
            )
            for piece in split_text(plan.text, rng, lo, hi):
                obfuscation = _id(rng, rng.randint(2, 12))
                chunks.append(template.fill(len(chunks), piece, obfuscation).encode())
            event("response.output_text.done", **where, text=plan.text, logprobs=[])
            event("response.content_part.done", **where, part={**part, "text": plan.text})
            event("response.output_item.done", output_index=index, item=item)
    status = "incomplete" if plan.stop_at_limit else "completed"
    final = _response_object(
        plan, ids, status=status, output=items, usage=_responses_usage(plan.usage)
    )
    event(f"response.{status}", response=final)
    return chunks, len(chunks)


def _responses_body(plan: _Plan) -> bytes:
    ids = _responses_ids(plan.rng)
    status = "incomplete" if plan.stop_at_limit else "completed"
    obj = _response_object(
        plan,
        ids,
        status=status,
        output=_responses_items(plan, ids),
        usage=_responses_usage(plan.usage),
    )
    return json.dumps(obj, ensure_ascii=False, indent=2).encode()


# -- Gemini ------------------------------------------------------------------------------------


def _gemini_split(u: FakeUsage, tools: int) -> tuple[int, int]:
    """(prompt tokens excluding cache, tool-use prompt tokens) of the input."""
    tool_use = u.input_tokens // 3 if tools else 0
    return u.input_tokens - tool_use, tool_use


def _gemini_usage(u: FakeUsage, tools: int, *, candidates: int | None = None) -> dict[str, Any]:
    plain, tool_use = _gemini_split(u, tools)
    prompt = plain + u.cache_read_tokens
    visible = u.output_tokens - u.reasoning_tokens if candidates is None else candidates
    out: dict[str, Any] = {"promptTokenCount": prompt}
    if visible or candidates is None:
        out["candidatesTokenCount"] = visible
    out["totalTokenCount"] = prompt + visible + u.reasoning_tokens + tool_use
    if u.cache_read_tokens:
        out["cachedContentTokenCount"] = u.cache_read_tokens
    out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if u.cache_read_tokens:
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.cache_read_tokens}]
    if tool_use:
        out["toolUsePromptTokenCount"] = tool_use
    if u.reasoning_tokens:
        out["thoughtsTokenCount"] = u.reasoning_tokens
    return out


def _gemini_finish(plan: _Plan) -> str:
    return "MAX_TOKENS" if plan.stop_at_limit else "STOP"


def _includes_thoughts(request: dict[str, Any]) -> bool:
    config = request.get("generationConfig")
    thinking = config.get("thinkingConfig") if isinstance(config, dict) else None
    return isinstance(thinking, dict) and thinking.get("includeThoughts") is True


def _grounding(plan: _Plan) -> dict[str, Any]:
    rng = plan.rng
    return {
        "webSearchQueries": [
            make_text(rng, rng.randint(12, 40)).strip() for _ in range(plan.server_tools)
        ],
        "groundingChunks": [
            {"web": {"uri": f"https://example.com/{_id(rng, 8).lower()}", "title": "example.com"}}
        ],
    }


def _gemini_stream(plan: _Plan) -> tuple[list[bytes], int]:
    rng, u = plan.rng, plan.usage
    response_id = _id(rng, 23)
    visible = u.output_tokens - u.reasoning_tokens
    lo, hi = DELTA_CHARS[plan.fmt]
    pieces = split_text(plan.text, rng, lo, hi) or [""]
    parts_list: list[list[dict[str, Any]]] = []
    if u.reasoning_tokens and _includes_thoughts(plan.request):
        summary = make_text(rng, rng.randint(60, 240))
        parts_list.append([{"text": summary, "thought": True}])
    parts_list += [[{"text": p}] for p in pieces]
    chunks = []
    sent = 0
    total_chars = max(1, len(plan.text))
    for i, parts in enumerate(parts_list):
        last = i == len(parts_list) - 1
        if not parts[0].get("thought"):
            sent += len(parts[0]["text"])
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if last:
            candidate["finishReason"] = _gemini_finish(plan)
            if plan.server_tools:
                candidate["groundingMetadata"] = _grounding(plan)
            usage = _gemini_usage(u, plan.server_tools)
        else:  # cumulative so far, never above the final counts
            usage = _gemini_usage(
                u, plan.server_tools, candidates=min(visible, visible * sent // total_chars)
            )
        obj = {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": plan.model,
            "responseId": response_id,
        }
        chunks.append(sse_event(None, obj, crlf=True))
    return chunks, len(chunks)


def _as_json_array(chunks: list[bytes]) -> list[bytes]:
    """Gemini's stream without ``alt=sse``: one JSON array, sent element by element."""
    out = []
    for i, chunk in enumerate(chunks):
        data = chunk.decode().strip()
        data = data[len("data: ") :] if data.startswith("data: ") else data
        element = json.dumps(json.loads(data), ensure_ascii=False, indent=2)
        out.append((b"[" if i == 0 else b",\r\n") + element.encode())
    if out:
        out[-1] += b"]"
    return out


def _gemini_body(plan: _Plan) -> bytes:
    u = plan.usage
    parts: list[dict[str, Any]] = []
    if u.reasoning_tokens and _includes_thoughts(plan.request):
        parts.append({"text": make_text(plan.rng, plan.rng.randint(60, 240)), "thought": True})
    parts.append({"text": plan.text})
    candidate: dict[str, Any] = {
        "content": {"parts": parts, "role": "model"},
        "finishReason": _gemini_finish(plan),
        "avgLogprobs": -round(plan.rng.uniform(0.05, 0.6), 4),
    }
    if plan.server_tools:
        candidate["groundingMetadata"] = _grounding(plan)
    obj = {
        "candidates": [candidate],
        "usageMetadata": _gemini_usage(u, plan.server_tools),
        "modelVersion": plan.model,
        "responseId": _id(plan.rng, 23),
    }
    return json.dumps(obj, ensure_ascii=False, indent=2).encode()


# -- Bedrock Converse -----------------------------------------------------------------------------


def _bedrock_usage(u: FakeUsage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.total_tokens,
    }
    if u.cache_read_tokens or u.cache_write_tokens:
        out["cacheReadInputTokens"] = u.cache_read_tokens
        out["cacheWriteInputTokens"] = u.cache_write_tokens
    details = []  # sorted by TTL, 1h before 5m
    if u.cache_write_1h_tokens:
        details.append({"inputTokens": u.cache_write_1h_tokens, "ttl": "1h"})
    if u.cache_write_tokens - u.cache_write_1h_tokens:
        details.append({"inputTokens": u.cache_write_tokens - u.cache_write_1h_tokens, "ttl": "5m"})
    if details:
        out["cacheDetails"] = details
    return out


def _bedrock_stop(plan: _Plan) -> str:
    return "max_tokens" if plan.stop_at_limit else "end_turn"


_PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"


def _frame(rng: random.Random, event: str, payload: dict[str, Any]) -> bytes:
    # Bedrock pads every payload with "p" so its length says nothing of its content.
    payload = {**payload, "p": _PAD[: rng.randint(1, len(_PAD))]}
    return event_stream_message(_EVENT_HEADERS[event], _dumps(payload).encode())


_EVENT_HEADERS = {
    event: {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    for event in (
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    )
}


def _bedrock_stream(plan: _Plan) -> tuple[list[bytes], int]:
    rng = plan.rng
    lo, hi = DELTA_CHARS[plan.fmt]
    chunks = [_frame(rng, "messageStart", {"role": "assistant"})]
    index = 0
    if plan.thinking:
        for piece in split_text(plan.thinking, rng, lo * 4, hi * 4):
            chunks.append(
                _frame(
                    rng,
                    "contentBlockDelta",
                    {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": piece}}},
                )
            )
        chunks.append(
            _frame(
                rng,
                "contentBlockDelta",
                {
                    "contentBlockIndex": 0,
                    "delta": {"reasoningContent": {"signature": _id(rng, 64)}},
                },
            )
        )
        chunks.append(_frame(rng, "contentBlockStop", {"contentBlockIndex": 0}))
        index = 1
    template = _Template(
        _dumps({"contentBlockIndex": index, "delta": {"text": slot(0)}, "p": slot(1)})
    )
    for piece in split_text(plan.text, rng, lo, hi):
        payload = template.fill(piece, _PAD[: rng.randint(1, len(_PAD))]).encode()
        chunks.append(event_stream_message(_EVENT_HEADERS["contentBlockDelta"], payload))
    chunks.append(_frame(rng, "contentBlockStop", {"contentBlockIndex": index}))
    chunks.append(_frame(rng, "messageStop", {"stopReason": _bedrock_stop(plan)}))
    chunks.append(
        _frame(
            rng,
            "metadata",
            {
                "usage": _bedrock_usage(plan.usage),
                "metrics": {"latencyMs": rng.randint(200, 9_000)},
            },
        )
    )
    return chunks, len(chunks)


def _bedrock_body(plan: _Plan) -> bytes:
    rng = plan.rng
    content: list[dict[str, Any]] = []
    if plan.thinking:
        content.append(
            {
                "reasoningContent": {
                    "reasoningText": {"text": plan.thinking, "signature": _id(rng, 64)}
                }
            }
        )
    content.append({"text": plan.text})
    return _dumps(
        {
            "metrics": {"latencyMs": rng.randint(200, 9_000)},
            "output": {"message": {"content": content, "role": "assistant"}},
            "stopReason": _bedrock_stop(plan),
            "usage": _bedrock_usage(plan.usage),
        }
    ).encode()


_CHUNK_HEADERS = {
    ":event-type": "chunk",
    ":content-type": "application/json",
    ":message-type": "event",
}


def _invoke_stream(plan: _Plan) -> tuple[list[bytes], int]:
    """InvokeModelWithResponseStream: Anthropic's events, each base64 in a ``chunk`` frame."""
    events, usage_after = _anthropic_stream(plan)
    u = plan.usage
    frames = []
    for event in events:
        data = event.split(b"\ndata: ", 1)[1].rstrip(b"\n")
        obj = json.loads(data)
        if obj.get("type") == "message_stop":
            obj["amazon-bedrock-invocationMetrics"] = {
                "inputTokenCount": u.input_tokens,
                "outputTokenCount": u.output_tokens,
                "invocationLatency": plan.rng.randint(200, 9_000),
                "firstByteLatency": plan.rng.randint(100, 2_000),
            }
            data = _dumps(obj).encode()
        payload = {"bytes": base64.b64encode(data).decode(), "p": _PAD[: plan.rng.randint(1, 8)]}
        frames.append(event_stream_message(_CHUNK_HEADERS, _dumps(payload).encode()))
    return frames, usage_after


_STREAMS = {
    "anthropic-messages": _anthropic_stream,
    "openai-chat": _chat_stream,
    "openai-responses": _responses_stream,
    "gemini": _gemini_stream,
    "bedrock-converse": _bedrock_stream,
    "bedrock-invoke": _invoke_stream,
}
_BODIES = {
    "anthropic-messages": _anthropic_body,
    "openai-chat": _chat_body,
    "openai-responses": _responses_body,
    "gemini": _gemini_body,
    "bedrock-converse": _bedrock_body,
    "bedrock-invoke": _anthropic_body,
}


# -- errors -------------------------------------------------------------------------------------

_ANTHROPIC_ERRORS = {
    400: ("invalid_request_error", "messages: at least one message is required"),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: (
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 80,000 input tokens per minute.",
    ),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}
_OPENAI_ERRORS = {
    400: ("invalid_request_error", None, "We could not parse the JSON body of your request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model does not exist or you do not have access to it.",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
_GEMINI_ERRORS = {
    400: ("INVALID_ARGUMENT", "Invalid JSON payload received."),
    403: ("PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
    404: ("NOT_FOUND", "models/unknown is not found for API version v1beta."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: (
        "INTERNAL",
        "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    ),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
}
_BEDROCK_ERRORS = {
    400: (
        "ValidationException",
        "Malformed input request, please reformat your input and try again.",
    ),
    403: (
        "AccessDeniedException",
        "You don't have access to the model with the specified model ID.",
    ),
    404: (
        "ResourceNotFoundException",
        "Could not resolve the foundation model from the provided model identifier.",
    ),
    429: ("ThrottlingException", "Too many requests, please wait before trying again."),
    500: (
        "InternalServerException",
        "The system encountered an unexpected error during processing. Try your request again.",
    ),
    503: ("ServiceUnavailableException", "Bedrock is unable to process your request."),
}


def error_body(
    fmt: str, status: int, rng: random.Random, message: str | None = None
) -> tuple[dict[str, Any], dict[str, str], str]:
    """The JSON error a provider answers with ``status``: ``(body, headers, description)``."""
    _check_fmt(fmt)
    headers = _headers(fmt, rng)
    if fmt == "anthropic-messages":
        kind, default = _ANTHROPIC_ERRORS.get(status, ("api_error", "Internal server error"))
        text = message or default
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": kind, "message": text},
            "request_id": headers["request-id"],
        }
        headers["x-should-retry"] = "true" if status in (429, 500, 529) else "false"
        return body, headers, f"{kind}: {text}"
    if fmt in ("openai-chat", "openai-responses"):
        kind, code, default = _OPENAI_ERRORS.get(status, ("server_error", None, "Server error"))
        text = message or default
        body = {"error": {"message": text, "type": kind, "param": None, "code": code}}
        return body, headers, f"{kind}: {text}"
    if fmt == "gemini":
        kind, default = _GEMINI_ERRORS.get(status, ("INTERNAL", "An internal error has occurred."))
        text = message or default
        return (
            {"error": {"code": status, "message": text, "status": kind}},
            headers,
            f"{kind}: {text}",
        )
    kind, default = _BEDROCK_ERRORS.get(status, ("InternalServerException", "Internal error."))
    text = message or default
    headers["x-amzn-ErrorType"] = f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    return {"message": text}, headers, f"{kind}: {text}"


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
    encoded = _dumps(body).encode()
    return FakeExchange(
        fmt=fmt,
        request=request,
        request_bytes=_dumps(request).encode(),
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


def _stream_error(plan: _Plan, after: int) -> tuple[str, bytes]:
    """The error a provider sends inside a stream after the 200: (description, chunk)."""
    rng = plan.rng
    fmt = plan.fmt
    obj: dict[str, Any]
    if fmt == "anthropic-messages":
        obj = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return "overloaded_error: Overloaded", sse_event("error", obj)
    if fmt == "openai-chat":
        kind, code, text = _OPENAI_ERRORS[500]
        obj = {"error": {"message": text, "type": kind, "param": None, "code": code}}
        return f"{kind}: {text}", sse_event(None, obj)
    if fmt == "openai-responses":
        text = "The server had an error while processing your request. Sorry about that!"
        obj = {
            "type": "error",
            "sequence_number": after,
            "code": "server_error",
            "message": text,
            "param": None,
        }
        return f"server_error: {text}", sse_event("error", obj)
    if fmt == "gemini":
        kind, text = _GEMINI_ERRORS[500]
        obj = {"error": {"code": 500, "message": text, "status": kind}}
        return f"{kind}: {text}", sse_event(None, obj, crlf=True)
    kind = rng.choice(
        ("modelStreamErrorException", "throttlingException", "internalServerException")
    )
    text = {
        "modelStreamErrorException": "Model stream error: the model produced an invalid sequence.",
        "throttlingException": "Too many tokens, please wait before trying again.",
        "internalServerException": "The system encountered an unexpected error during processing.",
    }[kind]
    payload: dict[str, Any] = {"message": text}
    if kind == "modelStreamErrorException":
        payload["originalStatusCode"] = 424
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return f"{kind}: {text}", event_stream_message(headers, _dumps(payload).encode())


__all__ = [
    "CHARS_PER_TOKEN",
    "DELTA_CHARS",
    "EVENT_STREAM",
    "FORMATS",
    "ZERO_USAGE",
    "FakeExchange",
    "FakeUsage",
    "build_request",
    "error_body",
    "event_stream_message",
    "fit_usage",
    "make_text",
    "max_output_tokens",
    "random_usage",
    "request_streams",
    "sse_event",
    "synthesize",
    "synthesize_error",
    "usage_for_request",
]

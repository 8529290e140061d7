"""The synthesized wire formats, read back by the structural usage taps.

The round trip is the contract: for every format, streamed or not, whole,
re-split anywhere, gzipped or read in the taps' cheaper delta mode, a tap reads
back exactly the usage the fake encoded, as ``reported``; a stream cut before
its usage is ``estimated``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest

from ingest.taps import EstimatorConfig, TapResult, open_tap, read_request
from ingest.taps.eventstream import EventStreamDecoder
from spendbus.fake_upstream import (
    FORMATS,
    FakeExchange,
    FakeUsage,
    fit_usage,
    random_usage,
    synthesize,
    synthesize_error,
    usage_for_request,
)
from spendbus.fake_upstream.eventstream import event_stream_message
from spendbus.fake_upstream.formats import CACHE_WRITES, REASONING_APART
from spendbus.fake_upstream.text import make_text

MODELS = {
    "anthropic-messages": "claude-sonnet-4-5-20250929",
    "openai-chat": "gpt-4o-2024-08-06",
    "openai-responses": "gpt-5-2025-08-07",
    "gemini": "gemini-2.5-flash",
    "bedrock-converse": "anthropic.claude-sonnet-4-5-20250929-v1:0",
    "bedrock-invoke": "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
}
SERVER_TOOLS = ("anthropic-messages", "openai-responses", "gemini")
EVERY = pytest.mark.parametrize("fmt", FORMATS)
STREAM = pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])


def tap_read(
    exchange: FakeExchange,
    chunks: Iterable[bytes] | None = None,
    *,
    cut: str | None = None,
    content_type: str | None = "exchange",
    estimator: EstimatorConfig | None = None,
) -> TapResult:
    tap = open_tap(
        exchange.fmt,
        exchange.request_bytes,
        content_type=exchange.content_type if content_type == "exchange" else content_type,
        content_encoding=exchange.content_encoding,
        status=exchange.status,
        model=exchange.model,
        estimator=estimator or EstimatorConfig(),
    )
    for chunk in exchange.chunks if chunks is None else chunks:
        tap.feed(chunk)
    return tap.finish(cut=cut)


def usage_of(result: TapResult) -> FakeUsage:
    return FakeUsage(
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cache_read_tokens=result.cache_read_tokens,
        cache_write_tokens=result.cache_write_tokens,
        cache_write_1h_tokens=result.cache_write_1h_tokens,
        reasoning_tokens=result.reasoning_tokens,
    )


def resplit(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random offsets, from single bytes to large pieces."""
    out, i = [], 0
    while i < len(data):
        n = rng.choice((1, 2, 3, rng.randint(1, 64), rng.randint(1, 4096)))
        out.append(data[i : i + n])
        i += n
    return out


def assert_reported(result: TapResult, exchange: FakeExchange) -> None:
    assert result.usage_source == "reported", result
    assert usage_of(result) == exchange.usage
    assert result.model == exchange.model
    assert result.upstream_error is None


# -- the round trip ---------------------------------------------------------------------------


@EVERY
@STREAM
def test_taps_read_back_the_usage(fmt: str, stream: bool) -> None:
    """Many usages over each field's range, with and without server tools."""
    for seed in range(40):
        rng = random.Random(f"{fmt}-{stream}-{seed}")
        usage = random_usage(fmt, rng, max_output=600)
        tools = rng.choice((0, 0, 1, 3)) if fmt in SERVER_TOOLS else 0
        exchange = synthesize(
            fmt, model=MODELS[fmt], usage=usage, stream=stream, rng=rng, server_tools=tools
        )
        assert exchange.usage == fit_usage(fmt, usage)
        assert exchange.reported and exchange.status == 200
        assert_reported(tap_read(exchange), exchange)


@EVERY
@STREAM
def test_taps_read_back_the_usage_split_anywhere(fmt: str, stream: bool) -> None:
    """The same bytes in random pieces (inside UTF-8, CRLF, frames), gzipped or
    not, with or without a content type, in both of the taps' delta modes."""
    for seed in range(15):
        rng = random.Random(f"split-{fmt}-{stream}-{seed}")
        gzip_body = seed % 3 == 0
        exchange = synthesize(
            fmt,
            model=MODELS[fmt],
            usage=random_usage(fmt, rng, max_output=300),
            stream=stream,
            rng=rng,
            gzip_body=gzip_body,
            server_tools=seed % 2 if fmt in SERVER_TOOLS else 0,
        )
        assert (exchange.content_encoding == "gzip") == gzip_body
        pieces = resplit(exchange.body, rng)
        for estimator in (EstimatorConfig(), EstimatorConfig(delta_text="payload_bytes")):
            result = tap_read(exchange, pieces, estimator=estimator)
            assert_reported(result, exchange)
        assert_reported(tap_read(exchange, pieces, content_type=None), exchange)


@EVERY
def test_one_byte_at_a_time(fmt: str) -> None:
    rng = random.Random(fmt)
    usage = FakeUsage(1200, 90, cache_read_tokens=800, cache_write_tokens=300, reasoning_tokens=20)
    exchange = synthesize(fmt, model=MODELS[fmt], usage=usage, stream=True, rng=rng)
    data = exchange.body
    assert_reported(tap_read(exchange, [data[i : i + 1] for i in range(len(data))]), exchange)


@EVERY
def test_large_answers_take_the_taps_incremental_paths(fmt: str) -> None:
    """A body (and a Responses terminal event) above the taps' whole-parse limit."""
    usage = FakeUsage(3000, 70_000, cache_read_tokens=100, reasoning_tokens=500)
    for stream in (False, True) if fmt == "openai-responses" else (False,):
        exchange = synthesize(
            fmt, model=MODELS[fmt], usage=usage, stream=stream, rng=random.Random(5)
        )
        assert max(len(c) for c in exchange.chunks) > 256 * 1024
        assert_reported(tap_read(exchange), exchange)


def test_gemini_stream_without_alt_sse_is_one_json_array() -> None:
    for seed in range(10):
        rng = random.Random(seed)
        exchange = synthesize(
            "gemini",
            model=MODELS["gemini"],
            usage=random_usage("gemini", rng),
            stream=True,
            rng=rng,
            gemini_sse=False,
        )
        assert exchange.content_type.startswith("application/json")
        array = json.loads(exchange.body)
        assert isinstance(array, list) and array[-1]["candidates"][0]["finishReason"]
        assert_reported(tap_read(exchange, resplit(exchange.body, rng)), exchange)


# -- what cannot be reported ------------------------------------------------------------------


def test_fit_usage_folds_what_a_provider_cannot_report() -> None:
    usage = FakeUsage(
        100,
        50,
        cache_read_tokens=10,
        cache_write_tokens=30,
        cache_write_1h_tokens=20,
        reasoning_tokens=5,
    )
    for fmt in FORMATS:
        fitted = fit_usage(fmt, usage)
        assert fitted.total_tokens == usage.total_tokens  # nothing billed disappears
        if fmt in CACHE_WRITES:
            assert (fitted.cache_write_tokens, fitted.cache_write_1h_tokens) == (30, 20)
            assert fitted.reasoning_tokens == 0  # thinking is inside output, not apart
        else:
            assert fitted.cache_write_tokens == 0 and fitted.input_tokens == 130
            assert fitted.reasoning_tokens == 5


def test_fake_usage_is_validated() -> None:
    with pytest.raises(ValueError):
        FakeUsage(-1, 0)
    with pytest.raises(ValueError):
        FakeUsage(1, 1, cache_write_tokens=1, cache_write_1h_tokens=2)
    with pytest.raises(ValueError):
        FakeUsage(1, 1, reasoning_tokens=2)
    with pytest.raises(ValueError):
        synthesize("cohere", model="x", usage=FakeUsage(1, 1), stream=True, rng=random.Random())


# -- cut streams and errors ------------------------------------------------------------------------


@EVERY
@STREAM
def test_cut_before_the_usage_is_estimated(fmt: str, stream: bool) -> None:
    usage = FakeUsage(900, 60, cache_read_tokens=400)
    full = synthesize(fmt, model=MODELS[fmt], usage=usage, stream=stream, rng=random.Random(1))
    assert full.usage_after is not None
    for n in range(len(full.chunks)) if stream else (0,):
        for gzip_body in (False, True):
            exchange = synthesize(
                fmt,
                model=MODELS[fmt],
                usage=usage,
                stream=stream,
                rng=random.Random(1),
                cut_after=n,
                gzip_body=gzip_body,
            )
            assert exchange.cut and exchange.body != full.body
            result = tap_read(exchange, cut="upstream_cut")
            if n >= full.usage_after:  # OpenAI Chat: cut after the usage chunk, before [DONE]
                assert exchange.reported and fmt == "openai-chat"
                assert_reported(result, exchange)
            else:
                assert not exchange.reported
                assert result.usage_source == "estimated", (n, result)
                assert result.estimate_reason == "upstream_cut"


@EVERY
def test_cut_chunks_are_a_prefix_of_the_whole_stream(fmt: str) -> None:
    usage = FakeUsage(50, 80)
    full = synthesize(fmt, model=MODELS[fmt], usage=usage, stream=True, rng=random.Random(2))
    cut = synthesize(
        fmt, model=MODELS[fmt], usage=usage, stream=True, rng=random.Random(2), cut_after=3
    )
    assert cut.chunks == full.chunks[:3]


@EVERY
def test_an_error_event_after_the_200_is_estimated(fmt: str) -> None:
    """Gemini included: its chunks carry partial usage, which an error leaves partial."""
    usage = FakeUsage(300, 400)
    full = synthesize(fmt, model=MODELS[fmt], usage=usage, stream=True, rng=random.Random(3))
    assert full.usage_after is not None and full.usage_after >= 3
    last = full.usage_after - 1
    for n in sorted({0, 1, 2, last // 2, last - 1, last}):
        exchange = synthesize(
            fmt, model=MODELS[fmt], usage=usage, stream=True, rng=random.Random(3), error_after=n
        )
        assert exchange.error and not exchange.reported
        assert exchange.chunks[:n] == full.chunks[:n]
        result = tap_read(exchange)
        assert result.usage_source == "estimated", (n, result)
        assert result.upstream_error is not None
        assert exchange.error.split(":")[0] in result.upstream_error


def test_an_openai_chat_error_after_the_usage_chunk_keeps_the_usage() -> None:
    usage = FakeUsage(300, 40)
    full = synthesize("openai-chat", model="gpt-4o", usage=usage, stream=True, rng=random.Random(3))
    assert full.usage_after == len(full.chunks) - 1  # then data: [DONE]
    exchange = synthesize(
        "openai-chat",
        model="gpt-4o",
        usage=usage,
        stream=True,
        rng=random.Random(3),
        error_after=full.usage_after,
    )
    assert exchange.reported and exchange.error
    result = tap_read(exchange)
    assert result.usage_source == "reported" and usage_of(result) == usage
    assert result.upstream_error is not None


@EVERY
@pytest.mark.parametrize("status", [400, 429, 500, 503, 529])
def test_error_statuses_are_not_billable(fmt: str, status: int) -> None:
    exchange = synthesize_error(fmt, status, model=MODELS[fmt], rng=random.Random(status))
    assert exchange.usage == FakeUsage(0, 0) and not exchange.reported
    body = json.loads(exchange.body)
    result = tap_read(exchange)
    assert result.usage_source == "none"
    assert result.upstream_error is not None
    assert result.upstream_error.startswith(f"HTTP {status}")
    if fmt == "anthropic-messages":
        assert body["type"] == "error" and body["error"]["type"]
    elif fmt.startswith("bedrock-"):
        assert set(body) == {"message"} and "x-amzn-ErrorType" in exchange.headers
    else:
        assert body["error"]["message"]
    if status == 429:
        assert int(exchange.headers["retry-after"]) > 0


# -- each provider's own shape ------------------------------------------------------------------------


def sse_data(exchange: FakeExchange) -> list[tuple[str | None, Any]]:
    out: list[tuple[str | None, Any]] = []
    for chunk in exchange.chunks:
        name = None
        for line in chunk.decode().splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
                out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def test_anthropic_stream_shape() -> None:
    usage = FakeUsage(
        21,
        340,
        cache_read_tokens=18_420,
        cache_write_tokens=2_051,
        cache_write_1h_tokens=1_027,
    )
    exchange = synthesize(
        "anthropic-messages",
        model="claude-sonnet-4-5",
        usage=usage,
        stream=True,
        rng=random.Random(4),
        server_tools=2,
    )
    assert exchange.request["stream"] is True
    assert exchange.request["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    events = sse_data(exchange)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    start = events[0][1]["message"]["usage"]
    assert start["cache_read_input_tokens"] == 18_420
    assert start["cache_creation"] == {
        "ephemeral_5m_input_tokens": 1_024,
        "ephemeral_1h_input_tokens": 1_027,
    }
    deltas = [obj["usage"] for name, obj in events if name == "message_delta"]
    assert len(deltas) == 3  # one per server tool call, then the final one
    outputs = [d["output_tokens"] for d in deltas]
    assert outputs == sorted(outputs) and outputs[-1] == 340  # cumulative, never a sum
    assert deltas[-1]["input_tokens"] == 21 and start["input_tokens"] < 21
    blocks = [obj["content_block"]["type"] for name, obj in events if "content_block" in obj]
    assert blocks.count("server_tool_use") == blocks.count("web_search_tool_result") == 2


def test_anthropic_thinking_is_shown_but_not_counted_apart() -> None:
    usage = FakeUsage(500, 2_000, reasoning_tokens=1_500)
    exchange = synthesize(
        "anthropic-messages",
        model="claude-opus-4-1",
        usage=usage,
        stream=True,
        rng=random.Random(6),
    )
    assert exchange.request["thinking"]["type"] == "enabled"
    assert exchange.request["max_tokens"] > exchange.request["thinking"]["budget_tokens"]
    kinds = {obj.get("delta", {}).get("type") for _, obj in sse_data(exchange)}
    assert {"thinking_delta", "signature_delta", "text_delta"} <= kinds
    assert exchange.usage == FakeUsage(500, 2_000)
    assert_reported(tap_read(exchange), exchange)


def test_openai_chat_stream_shape() -> None:
    usage = FakeUsage(280, 250, cache_read_tokens=1_920, reasoning_tokens=192)
    exchange = synthesize(
        "openai-chat", model="o4-mini", usage=usage, stream=True, rng=random.Random(7)
    )
    assert exchange.request["stream_options"] == {"include_usage": True}
    events = sse_data(exchange)
    assert events[-1] == (None, "[DONE]")
    last = events[-2][1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == 2_200
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] == 1_920
    assert last["usage"]["completion_tokens"] == 250
    assert last["usage"]["completion_tokens_details"]["reasoning_tokens"] == 192
    assert all(obj["usage"] is None for _, obj in events[:-2])
    text = "".join(obj["choices"][0]["delta"].get("content", "") for _, obj in events[:-2])
    assert len(text) == (250 - 192) * 4


def test_openai_chat_stream_without_include_usage_carries_none() -> None:
    request = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    exchange = synthesize(
        "openai-chat",
        model="gpt-4o",
        usage=FakeUsage(10, 20),
        stream=True,
        rng=random.Random(8),
        request=request,
    )
    assert exchange.usage_after is None and not exchange.reported
    assert all("usage" not in obj for _, obj in sse_data(exchange)[:-1])
    result = tap_read(exchange)
    assert result.usage_source == "estimated"
    assert "include_usage" in (result.estimate_reason or "")


def test_openai_responses_stream_shape() -> None:
    usage = FakeUsage(17, 1_035, cache_read_tokens=64, reasoning_tokens=832)
    exchange = synthesize(
        "openai-responses",
        model="gpt-5",
        usage=usage,
        stream=True,
        rng=random.Random(9),
        server_tools=1,
    )
    events = sse_data(exchange)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in names
    assert "response.web_search_call.completed" in names
    assert [obj["sequence_number"] for _, obj in events] == list(range(len(events)))
    final = events[-1][1]["response"]["usage"]
    assert final["input_tokens"] == 81 and final["input_tokens_details"]["cached_tokens"] == 64
    assert final["output_tokens_details"]["reasoning_tokens"] == 832


def test_openai_responses_at_the_limit_is_incomplete() -> None:
    request = {"model": "gpt-5", "input": "hello", "max_output_tokens": 100, "stream": True}
    exchange = synthesize(
        "openai-responses",
        model="gpt-5",
        usage=FakeUsage(3, 100, reasoning_tokens=60),
        stream=True,
        rng=random.Random(10),
        request=request,
    )
    last_name, last = sse_data(exchange)[-1]
    assert last_name == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert_reported(tap_read(exchange), exchange)


def test_gemini_stream_shape() -> None:
    usage = FakeUsage(1_104, 1_510, cache_read_tokens=4_096, reasoning_tokens=1_200)
    exchange = synthesize(
        "gemini",
        model="gemini-2.5-pro",
        usage=usage,
        stream=True,
        rng=random.Random(11),
        server_tools=1,
    )
    assert all(chunk.endswith(b"\r\n\r\n") for chunk in exchange.chunks)
    events = [obj for _, obj in sse_data(exchange)]
    assert len(events) > 1
    metas = [obj["usageMetadata"] for obj in events]
    assert all(m["promptTokenCount"] == metas[-1]["promptTokenCount"] for m in metas)
    final = metas[-1]
    tool_use = final["toolUsePromptTokenCount"]
    assert final["promptTokenCount"] == 1_104 - tool_use + 4_096  # includes the cache
    assert final["cachedContentTokenCount"] == 4_096
    assert final["candidatesTokenCount"] == 310 and final["thoughtsTokenCount"] == 1_200
    counts = [m.get("candidatesTokenCount", 0) for m in metas]
    assert counts == sorted(counts)
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    assert "groundingMetadata" in events[-1]["candidates"][0]


def test_bedrock_stream_frames() -> None:
    usage = FakeUsage(
        24, 180, cache_read_tokens=10_240, cache_write_tokens=3_072, cache_write_1h_tokens=2_048
    )
    exchange = synthesize(
        "bedrock-converse",
        model=MODELS["bedrock-converse"],
        usage=usage,
        stream=True,
        rng=random.Random(12),
    )
    assert exchange.content_type == "application/vnd.amazon.eventstream"
    assert exchange.request["system"][-1] == {"cachePoint": {"type": "default", "ttl": "1h"}}
    messages: list[tuple[dict[str, Any], bytes]] = []
    decoder = EventStreamDecoder(lambda headers, payload: messages.append((dict(headers), payload)))
    for chunk in exchange.chunks:
        decoder.feed(chunk)  # raises on a CRC or length mismatch
    assert decoder.pending == 0 and len(messages) == len(exchange.chunks)
    kinds = [headers[":event-type"] for headers, _ in messages]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    assert all(h[":message-type"] == "event" for h, _ in messages)
    assert all(h[":content-type"] == "application/json" for h, _ in messages)
    payloads = [json.loads(p) for _, p in messages]
    assert all("p" in p for p in payloads)  # AWS pads every payload
    metadata = payloads[-1]["usage"]
    assert metadata["inputTokens"] == 24 and metadata["cacheWriteInputTokens"] == 3_072
    assert metadata["cacheDetails"] == [
        {"inputTokens": 2_048, "ttl": "1h"},
        {"inputTokens": 1_024, "ttl": "5m"},
    ]
    assert metadata["totalTokens"] == usage.total_tokens


def test_event_stream_encoder_matches_the_spec_layout() -> None:
    frame = event_stream_message({":event-type": "metadata"}, b"{}")
    total = int.from_bytes(frame[:4], "big")
    headers = int.from_bytes(frame[4:8], "big")
    assert total == len(frame) == 16 + headers + 2
    assert frame[12 : 12 + headers] == b"\x0b:event-type\x07\x00\x08metadata"


# -- requests -------------------------------------------------------------------------------------


@EVERY
@STREAM
def test_requests_are_realistic(fmt: str, stream: bool) -> None:
    usage = FakeUsage(2_000, 300, cache_read_tokens=500, reasoning_tokens=100)
    exchange = synthesize(fmt, model=MODELS[fmt], usage=usage, stream=stream, rng=random.Random(13))
    info = read_request(fmt, exchange.request_bytes)
    assert info.readable and info.size == len(exchange.request_bytes)
    assert info.max_output_tokens is not None and info.max_output_tokens >= usage.output_tokens
    if fmt in ("gemini", "bedrock-converse", "bedrock-invoke"):
        assert info.model is None  # in the URL
    else:
        assert info.model == MODELS[fmt] and bool(info.stream) == stream
    assert info.reasoning
    assert info.server_state == ()
    assert abs(len(exchange.request_bytes) / 4 - usage.prompt_tokens) < usage.prompt_tokens * 0.2


def test_text_length_and_determinism() -> None:
    for chars in (0, 1, 17, 4_000):
        text = make_text(random.Random(1), chars)
        assert len(text) == chars
        assert text == make_text(random.Random(1), chars)
    usage = FakeUsage(100, 100)
    a = synthesize("openai-chat", model="m", usage=usage, stream=True, rng=random.Random(14))
    b = synthesize("openai-chat", model="m", usage=usage, stream=True, rng=random.Random(14))
    c = synthesize("openai-chat", model="m", usage=usage, stream=True, rng=random.Random(15))
    assert a == b and a.body != c.body
    custom = synthesize(
        "anthropic-messages",
        model="m",
        usage=usage,
        stream=True,
        rng=random.Random(1),
        text_chars=10,
    )
    text = "".join(
        obj["delta"].get("text", "")
        for name, obj in sse_data(custom)
        if name == "content_block_delta"
    )
    assert len(text) == 10


# -- usage for a request (the server's choice) ----------------------------------------------------


def test_usage_for_request_follows_the_request() -> None:
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "messages": [{"role": "user", "content": "y" * 4_000}],
    }
    size = len(json.dumps(request))
    plain = usage_for_request(
        "anthropic-messages", request, size=size, rng=random.Random(1), output_tokens=(10, 10_000)
    )
    assert plain.prompt_tokens == -(-size // 4)
    assert plain.cache_read_tokens == plain.cache_write_tokens == 0
    assert plain.output_tokens <= 64
    hit = usage_for_request(
        "anthropic-messages", request, size=size, rng=random.Random(1), cache_ratio=1.0
    )
    assert hit.cache_read_tokens > 0.5 * hit.prompt_tokens and hit.cache_write_tokens == 0
    for seed in range(20):
        miss = usage_for_request(
            "anthropic-messages",
            request,
            size=size,
            rng=random.Random(seed),
            cache_ratio=0.01,
        )
        if miss.cache_write_tokens:
            assert miss.cache_write_1h_tokens == miss.cache_write_tokens
            break
    else:
        pytest.fail("a cache miss never wrote the cache")
    for fmt in REASONING_APART:
        openai = usage_for_request(
            fmt,
            {"model": "gpt-4o", "reasoning_effort": "high", "reasoning": {"effort": "high"}},
            size=100,
            rng=random.Random(2),
            cache_ratio=0.0,
            model="gemini-2.5-pro" if fmt == "gemini" else "o3",
        )
        assert 0 < openai.reasoning_tokens < openai.output_tokens

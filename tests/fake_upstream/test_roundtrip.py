"""The synthesized wire formats of every provider, read back by the structural usage taps.

The round trip is the contract: for every format, streamed or not, whole,
re-split anywhere, gzipped or read in the taps' cheaper delta mode, a tap reads
back exactly the usage the fake encoded, as ``reported``; a stream cut before
its usage is ``estimated``.
"""

from __future__ import annotations

import json
import random

import pytest

from ingest.taps import EstimatorConfig, read_request
from spendbus.fake_upstream import (
    FakeUsage,
    fit_usage,
    random_usage,
    synthesize,
    synthesize_error,
)
from spendbus.fake_upstream.text import make_text
from tests.fake_upstream.kit import (
    EVERY,
    MODELS,
    SERVER_TOOLS,
    STREAM,
    assert_reported,
    resplit,
    sse_data,
    tap_read,
)


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

"""What the fake upstream's format tests share: a model per format, the parametrisations,
and reading an exchange back through the real usage taps."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest

from ingest.taps import EstimatorConfig, TapResult, open_tap
from spendbus.fake_upstream import FORMATS, FakeExchange, FakeUsage

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

"""The fake OpenAI Chat Completions stream: the usage chunk, only when asked for."""

from __future__ import annotations

import random

from spendbus.fake_upstream import FakeUsage, synthesize
from tests.fake_upstream.kit import sse_data, tap_read, usage_of


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

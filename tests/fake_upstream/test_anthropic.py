"""The fake Anthropic Messages stream: its events, cumulative usage, server tools, thinking."""

from __future__ import annotations

import random

from spendbus.fake_upstream import FakeUsage, synthesize
from tests.fake_upstream.kit import assert_reported, sse_data, tap_read


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

"""The fake Bedrock stream: AWS event-stream frames (CRCs, padding), the usage in metadata."""

from __future__ import annotations

import json
import random
from typing import Any

from ingest.taps.eventstream import EventStreamDecoder
from spendbus.fake_upstream import FakeUsage, synthesize
from spendbus.fake_upstream.eventstream import event_stream_message
from tests.fake_upstream.kit import MODELS


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

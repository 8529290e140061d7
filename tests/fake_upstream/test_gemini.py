"""The fake Gemini stream: cumulative usageMetadata, grounding, the JSON-array stream."""

from __future__ import annotations

import json
import random

from spendbus.fake_upstream import FakeUsage, random_usage, synthesize
from tests.fake_upstream.kit import MODELS, assert_reported, resplit, sse_data, tap_read


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

"""The fake OpenAI Responses stream: numbered events, web search, an incomplete answer."""

from __future__ import annotations

import random

from spendbus.fake_upstream import FakeUsage, synthesize
from tests.fake_upstream.kit import assert_reported, sse_data, tap_read


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

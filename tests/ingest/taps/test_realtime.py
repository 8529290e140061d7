"""OpenAI Realtime WebSocket sessions: one usage per response.done."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.taps import open_realtime_tap
from tests.ingest.taps.taps_support import CAPTURES

SESSION = (CAPTURES / "realtime/session.jsonl").read_text().splitlines()


def test_one_result_per_response_done_and_open_ones_estimated_at_the_end() -> None:
    tap = open_realtime_tap()
    results = []
    for message in SESSION:
        results.extend(tap.feed_message(message))
    assert [r.as_dict() for r in results] == [
        {
            "model": "gpt-realtime-2025-08-28",
            "input_tokens": 68,
            "cache_read_tokens": 64,
            "cache_write_tokens": 0,
            "cache_write_1h_tokens": 0,
            "output_tokens": 121,
            "reasoning_tokens": 0,
            "usage_source": "reported",
            "units": {"input_audio_tokens": 13, "output_audio_tokens": 91},
        },
        {
            "model": "gpt-realtime-2025-08-28",
            "input_tokens": 34,
            "cache_read_tokens": 256,
            "cache_write_tokens": 0,
            "cache_write_1h_tokens": 0,
            "output_tokens": 28,
            "reasoning_tokens": 0,
            "usage_source": "reported",
            # 130 audio tokens in, 96 of them cached (cache reads): 34 priced as audio
            "units": {"input_audio_tokens": 34, "output_audio_tokens": 22},
        },
    ]
    tail = tap.finish(cut="client_disconnected")
    assert [r.as_dict() for r in tail] == [
        {
            "model": "gpt-realtime-2025-08-28",
            "input_tokens": 200_000,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "cache_write_1h_tokens": 0,
            "output_tokens": 12,
            "reasoning_tokens": 0,
            "usage_source": "estimated",
            "estimate_reason": "client_disconnected",
        },
    ]
    assert tap.finish() == []


def test_response_done_without_usage_is_estimated() -> None:
    tap = open_realtime_tap(model="gpt-realtime")
    tap.feed_client_message('{"type":"response.create"}' + " " * 4000)
    tap.feed_message('{"type":"response.created","response":{"id":"r1"}}')
    tap.feed_message(
        '{"type":"response.output_text.delta","response_id":"r1","delta":"abcdefghij"}'
    )
    (result,) = tap.feed_message(
        '{"type":"response.done","response":{"id":"r1","status":"failed","status_details":'
        '{"type":"failed","error":{"type":"server_error","message":"boom"}},"usage":null}}'
    )
    assert result.usage_source == "estimated"
    assert result.estimate_reason == "no_usage: response.done (failed) carries no usage"
    assert result.upstream_error == "server_error: boom"
    assert (result.model, result.output_tokens, result.input_tokens) == ("gpt-realtime", 3, 200_000)


def test_invalid_usage_in_response_done() -> None:
    tap = open_realtime_tap()
    (result,) = tap.feed_message(
        json.dumps(
            {
                "type": "response.done",
                "response": {"id": "r", "usage": {"input_tokens": -1, "output_tokens": 2}},
            }
        )
    )
    assert result.estimate_reason == "invalid_usage: input_tokens is negative: -1"


def test_audio_tokens_of_response_done_are_units() -> None:
    usage = {
        "input_tokens": 900,
        "output_tokens": 300,
        "input_token_details": {"cached_tokens": 0, "text_tokens": 100, "audio_tokens": 800},
        "output_token_details": {"text_tokens": 60, "audio_tokens": 240},
    }
    tap = open_realtime_tap(model="gpt-realtime")
    (result,) = tap.feed_message(
        json.dumps({"type": "response.done", "response": {"id": "r", "usage": usage}})
    )
    assert (result.input_tokens, result.output_tokens) == (900, 300)
    assert dict(result.units) == {"input_audio_tokens": 800, "output_audio_tokens": 240}


def test_a_large_response_done_is_scanned() -> None:
    tap = open_realtime_tap()
    big = {
        "type": "response.done",
        "response": {
            "id": "r",
            "output": [{"transcript": "x" * 400_000}],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    }
    (result,) = tap.feed_message(json.dumps(big))
    assert (result.usage_source, result.input_tokens, result.output_tokens) == ("reported", 10, 5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=60) | st.sampled_from(SESSION), max_size=10))
def test_never_raises(messages: list[str]) -> None:
    tap = open_realtime_tap()
    for message in messages:
        tap.feed_message(message)
        tap.feed_message(message.encode("utf-8", "surrogatepass")[:30])
    tap.finish()


def test_image_tokens_of_response_done_less_their_cached_part_are_units() -> None:
    """gpt-realtime takes images: input_token_details.image_tokens (inside input_tokens);
    the cached part of audio and images (cached_tokens_details) is a cache read."""
    usage = {
        "input_tokens": 2000,
        "output_tokens": 50,
        "input_token_details": {
            "text_tokens": 200,
            "audio_tokens": 600,
            "image_tokens": 1200,
            "cached_tokens": 1100,
            "cached_tokens_details": {"text_tokens": 100, "audio_tokens": 200, "image_tokens": 800},
        },
        "output_token_details": {"text_tokens": 50, "audio_tokens": 0},
    }
    tap = open_realtime_tap(model="gpt-realtime")
    (result,) = tap.feed_message(
        json.dumps({"type": "response.done", "response": {"id": "r", "usage": usage}})
    )
    assert (result.input_tokens, result.cache_read_tokens) == (900, 1100)
    assert dict(result.units) == {"input_audio_tokens": 400, "input_image_tokens": 400}

"""The provider facts of Bedrock (docs/design.md): ConverseStream's event stream and
InvokeModel's Anthropic events inside base64 chunks."""

from __future__ import annotations

import base64
import json
from typing import Any

from ingest.taps.eventstream import encode_message
from tests.ingest.taps.provider_facts_kit import tap


# -- Bedrock -------------------------------------------------------------------
def frame(event: str, payload: dict[str, Any], kind: str = "event") -> bytes:
    headers = {":message-type": kind, ":content-type": "application/json"}
    headers[":exception-type" if kind == "exception" else ":event-type"] = event
    return encode_message(headers, json.dumps(payload).encode())


BEDROCK_USAGE = {
    "inputTokens": 30,
    "outputTokens": 12,
    "totalTokens": 542,
    "cacheReadInputTokens": 400,
    "cacheWriteInputTokens": 100,
}


def test_bedrock_usage_is_in_the_final_metadata_event() -> None:
    body = (
        frame("messageStart", {"role": "assistant"})
        + frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "hi"}})
        + frame("messageStop", {"stopReason": "end_turn"})
    )
    r = tap("bedrock-converse", body, model="bedrock-model")
    assert r.usage_source == "estimated"
    assert r.model == "bedrock-model"
    r = tap("bedrock-converse", body + frame("metadata", {"usage": BEDROCK_USAGE}))
    assert (r.input_tokens, r.cache_read_tokens, r.cache_write_tokens, r.output_tokens) == (
        30,
        400,
        100,
        12,
    )
    assert r.usage_source == "reported"


def test_bedrock_error_as_a_stream_event_after_200() -> None:
    body = frame("messageStart", {"role": "assistant"}) + frame(
        "throttlingException", {"message": "Too many tokens"}, kind="exception"
    )
    r = tap("bedrock-converse", body)
    assert r.usage_source == "estimated"
    assert r.upstream_error == "throttlingException: Too many tokens"
    assert r.estimate_reason == "upstream_error: throttlingException: Too many tokens"


def test_bedrock_error_message_type() -> None:
    body = encode_message(
        {":message-type": "error", ":error-code": "InternalFailure", ":error-message": "boom"}, b""
    )
    r = tap("bedrock-converse", body)
    assert r.upstream_error == "InternalFailure: boom"


def test_bedrock_cache_details_give_the_1h_part() -> None:
    usage = {
        **BEDROCK_USAGE,
        "cacheWriteInputTokens": 100,
        "cacheDetails": [{"ttl": "1h", "inputTokens": 60}, {"ttl": "5m", "inputTokens": 40}],
    }
    r = tap("bedrock-converse", frame("metadata", {"usage": usage}))
    assert (r.cache_write_tokens, r.cache_write_1h_tokens) == (100, 60)


# -- Bedrock InvokeModel (Anthropic messages) -----------------------------------------
def invoke_chunk(event: dict[str, Any] | str) -> bytes:
    raw = event if isinstance(event, str) else base64.b64encode(json.dumps(event).encode()).decode()
    return frame("chunk", {"bytes": raw, "p": "abc"})


def test_bedrock_invoke_reads_the_anthropic_events_inside_chunks() -> None:
    body = b"".join(
        [
            invoke_chunk(
                {
                    "type": "message_start",
                    "message": {
                        "model": "claude-body",
                        "usage": {"input_tokens": 7, "output_tokens": 1},
                    },
                }
            ),
            invoke_chunk(
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}
            ),
            invoke_chunk({"type": "message_delta", "usage": {"output_tokens": 11}}),
            invoke_chunk(
                {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 7}}
            ),
        ]
    )
    r = tap("bedrock-invoke", body, model="global.anthropic.claude-sonnet-4-5-v1:0")
    assert (r.model, r.input_tokens, r.output_tokens, r.usage_source) == (
        "global.anthropic.claude-sonnet-4-5-v1:0",
        7,
        11,
        "reported",
    )


def test_bedrock_invoke_chunk_that_is_not_base64_is_unreadable() -> None:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}
    body = (
        invoke_chunk(start) + invoke_chunk("not base64!") + invoke_chunk({"type": "message_stop"})
    )
    r = tap("bedrock-invoke", body, model="anthropic.claude-x")
    assert r.usage_source == "estimated"
    assert r.estimate_reason == "unreadable: a chunk's bytes are not base64"
    assert r.input_tokens == 7


def test_bedrock_invoke_chunk_without_bytes_is_unreadable() -> None:
    body = frame("chunk", {"p": "abc"})
    r = tap("bedrock-invoke", body, model="anthropic.claude-x")
    assert r.estimate_reason == "unreadable: a chunk carries no base64 bytes"

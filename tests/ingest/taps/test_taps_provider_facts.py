"""One test per provider fact in docs/design.md ("Provider facts the mapping must get right")."""

from __future__ import annotations

import base64
import json
from typing import Any

from ingest.taps import TapResult, open_tap
from ingest.taps.eventstream import encode_message


def sse(*events: tuple[str | None, Any], crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    out = ""
    for name, obj in events:
        if name:
            out += f"event: {name}{nl}"
        out += f"data: {obj if isinstance(obj, str) else json.dumps(obj)}{nl}{nl}"
    return out.encode()


def tap(
    fmt: str,
    body: bytes,
    *,
    streaming: bool = True,
    cut: str | None = None,
    model: str | None = None,
) -> TapResult:
    t = open_tap(fmt, {"model": "req-model"}, streaming=streaming, model=model)
    t.feed(body)
    return t.finish(cut=cut)


def anthropic_stream(start_usage: dict[str, Any], *deltas: dict[str, Any]) -> bytes:
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"id": "msg_1", "model": "claude-x", "usage": start_usage},
            },
        ),
    ]
    for usage in deltas:
        events.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": None}, "usage": usage},
            )
        )
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


# -- Anthropic -----------------------------------------------------------------
def test_anthropic_input_tokens_already_exclude_cache() -> None:
    body = anthropic_stream(
        {
            "input_tokens": 10,
            "cache_read_input_tokens": 500,
            "cache_creation_input_tokens": 70,
            "output_tokens": 1,
        },
        {"output_tokens": 9},
    )
    r = tap("anthropic-messages", body)
    assert (r.input_tokens, r.cache_read_tokens, r.cache_write_tokens) == (10, 500, 70)
    assert r.total_tokens == 10 + 500 + 70 + 9


def test_anthropic_message_delta_usage_is_cumulative_latest_wins() -> None:
    body = anthropic_stream(
        {"input_tokens": 100, "output_tokens": 1},
        {"input_tokens": 300, "output_tokens": 50},
        {"output_tokens": 80},  # fields it lacks keep their latest value
        {"input_tokens": 300, "output_tokens": 120},
    )
    r = tap("anthropic-messages", body)
    assert (r.input_tokens, r.output_tokens, r.usage_source) == (300, 120, "reported")


def test_anthropic_ephemeral_1h_is_the_1h_part_of_cache_writes() -> None:
    body = anthropic_stream(
        {
            "input_tokens": 5,
            "cache_creation_input_tokens": 1000,
            "output_tokens": 1,
            "cache_creation": {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 600},
        },
        {"output_tokens": 3},
    )
    r = tap("anthropic-messages", body)
    assert (r.cache_write_tokens, r.cache_write_1h_tokens) == (1000, 600)


def test_anthropic_cache_breakdown_larger_than_total_charges_the_larger() -> None:
    body = anthropic_stream(
        {
            "input_tokens": 5,
            "cache_creation_input_tokens": 100,
            "output_tokens": 1,
            "cache_creation": {"ephemeral_5m_input_tokens": 80, "ephemeral_1h_input_tokens": 70},
        },
        {"output_tokens": 3},
    )
    r = tap("anthropic-messages", body)
    assert (r.cache_write_tokens, r.cache_write_1h_tokens) == (150, 70)


def test_anthropic_fallback_iteration_names_the_serving_model() -> None:
    """Without a fallback block (the refusal came before any output of a hop that then
    vanished from content), the fallback_message iteration still says who served."""
    body = anthropic_stream(
        {"input_tokens": 40, "output_tokens": 1},
        {
            "output_tokens": 9,
            "iterations": [
                {"type": "message", "model": "claude-x", "input_tokens": 40, "output_tokens": 0},
                {
                    "type": "fallback_message",
                    "model": "claude-y",
                    "input_tokens": 40,
                    "output_tokens": 9,
                },
            ],
        },
    )
    r = tap("anthropic-messages", body, model="hint-model")
    assert (r.model, r.input_tokens, r.output_tokens) == ("claude-y", 40, 9)


def test_anthropic_iterations_without_a_fallback_keep_the_model() -> None:
    body = anthropic_stream(
        {"input_tokens": 40, "output_tokens": 1},
        {"output_tokens": 9, "iterations": [{"type": "message", "model": "claude-z"}]},
    )
    assert tap("anthropic-messages", body).model == "claude-x"


def test_anthropic_fallback_block_relabels_the_stream() -> None:
    start = anthropic_stream({"input_tokens": 3, "output_tokens": 1}, {"output_tokens": 5})
    block = sse(
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "fallback",
                    "from": {"model": "claude-x"},
                    "to": {"model": "claude-served"},
                    "trigger": {"type": "refusal", "category": "cyber"},
                },
            },
        )
    )
    head, tail = start.split(b"event: message_delta", 1)
    r = tap("anthropic-messages", head + block + b"event: message_delta" + tail)
    assert (r.model, r.usage_source) == ("claude-served", "reported")


def test_anthropic_other_content_blocks_never_relabel() -> None:
    """A tool_use block whose input mentions fallback, or a block without ``to``."""
    blocks = [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"to": {"model": "nope"}}},
        {"type": "fallback", "from": {"model": "claude-x"}},
        {"type": "fallback", "to": "claude-string"},
    ]
    events = [
        ("content_block_start", {"type": "content_block_start", "index": i, "content_block": b})
        for i, b in enumerate(blocks)
    ]
    start = anthropic_stream({"input_tokens": 3, "output_tokens": 1}, {"output_tokens": 5})
    head, tail = start.split(b"event: message_delta", 1)
    r = tap("anthropic-messages", head + sse(*events) + b"event: message_delta" + tail)
    assert (r.model, r.usage_source) == ("claude-x", "reported")


def test_anthropic_thinking_tokens_are_reasoning_inside_output() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1},
        {"output_tokens": 900, "output_tokens_details": {"thinking_tokens": 850}},
    )
    r = tap("anthropic-messages", body)
    assert (r.output_tokens, r.reasoning_tokens, r.total_tokens) == (900, 850, 910)


def test_anthropic_thinking_tokens_above_output_are_invalid() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1},
        {"output_tokens": 90, "output_tokens_details": {"thinking_tokens": 850}},
    )
    r = tap("anthropic-messages", body)
    assert r.usage_source == "estimated"
    assert r.estimate_reason == (
        "invalid_usage: output_tokens_details.thinking_tokens (850) exceeds output_tokens (90)"
    )


# -- OpenAI Chat ---------------------------------------------------------------
def chat_chunk(choices: Any, usage: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "gpt-x",
        "choices": choices,
        "usage": usage,
        **extra,
    }


USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 300,
    "prompt_tokens_details": {"cached_tokens": 600},
    "completion_tokens_details": {"reasoning_tokens": 200},
}


def test_openai_chat_usage_only_with_include_usage_in_last_chunk() -> None:
    text = [(None, chat_chunk([{"index": 0, "delta": {"content": "hi"}}]))]
    r = tap("openai-chat", sse(*text, (None, "[DONE]")))
    assert r.usage_source == "estimated"
    assert r.estimate_reason is not None and r.estimate_reason.startswith("no_usage")
    r = tap("openai-chat", sse(*text, (None, chat_chunk([], USAGE)), (None, "[DONE]")))
    assert r.usage_source == "reported"


def test_openai_chat_usage_chunk_with_choices_null() -> None:
    body = sse(
        (None, chat_chunk([{"index": 0, "delta": {"content": "hi"}}])),
        (None, chat_chunk(None, USAGE)),
        (None, "[DONE]"),
    )
    assert tap("openai-chat", body).usage_source == "reported"


def test_openai_chat_prompt_tokens_include_cached_tokens() -> None:
    r = tap("openai-chat", sse((None, chat_chunk([], USAGE)), (None, "[DONE]")))
    assert (r.input_tokens, r.cache_read_tokens) == (400, 600)


def test_openai_chat_completion_tokens_include_reasoning_tokens() -> None:
    r = tap("openai-chat", sse((None, chat_chunk([], USAGE)), (None, "[DONE]")))
    assert (r.output_tokens, r.reasoning_tokens) == (300, 200)
    assert r.total_tokens == 1300


def test_openai_chat_cached_above_prompt_is_invalid() -> None:
    bad = {**USAGE, "prompt_tokens": 10}
    r = tap("openai-chat", sse((None, chat_chunk([], bad)), (None, "[DONE]")))
    assert r.usage_source == "estimated"
    assert r.estimate_reason == "invalid_usage: cached_tokens (600) exceeds prompt_tokens (10)"


def test_openai_chat_the_served_model_wins_over_the_requested_one() -> None:
    """The response's ``model`` is the snapshot that served (an alias resolves to a dated
    one): it, not the request's model or the URL hint, is charged."""
    served = {
        **chat_chunk([{"index": 0, "delta": {"content": "hi"}}]),
        "model": "gpt-4o-2024-08-06",
    }
    last = {**chat_chunk([], USAGE), "model": "gpt-4o-2024-08-06"}
    r = tap("openai-chat", sse((None, served), (None, last), (None, "[DONE]")), model="gpt-4o")
    assert (r.model, r.usage_source) == ("gpt-4o-2024-08-06", "reported")
    body = {
        "object": "chat.completion",
        "model": "gpt-4o-2024-08-06",
        "choices": [],
        "usage": USAGE,
    }
    r = tap("openai-chat", json.dumps(body).encode(), streaming=False, model="gpt-4o")
    assert r.model == "gpt-4o-2024-08-06"


# -- OpenAI Responses ----------------------------------------------------------
RESP_USAGE = {
    "input_tokens": 900,
    "input_tokens_details": {"cached_tokens": 512},
    "output_tokens": 70,
    "output_tokens_details": {"reasoning_tokens": 40},
}


def test_openai_responses_usage_in_response_completed() -> None:
    body = sse(
        (
            "response.created",
            {"type": "response.created", "response": {"model": "gpt-r", "usage": None}},
        ),
        (
            "response.completed",
            {"type": "response.completed", "response": {"model": "gpt-r", "usage": RESP_USAGE}},
        ),
    )
    r = tap("openai-responses", body)
    assert (r.model, r.usage_source, r.output_tokens, r.reasoning_tokens) == (
        "gpt-r",
        "reported",
        70,
        40,
    )


def test_openai_responses_input_tokens_include_cached_tokens() -> None:
    for terminal in ("response.completed", "response.incomplete", "response.failed"):
        body = sse((terminal, {"type": terminal, "response": {"usage": RESP_USAGE}}))
        r = tap("openai-responses", body)
        assert (r.input_tokens, r.cache_read_tokens, r.usage_source) == (388, 512, "reported")


def test_openai_responses_events_without_event_lines_are_read_by_type() -> None:
    body = sse(
        (None, {"type": "response.output_text.delta", "delta": "hello"}),
        (None, {"type": "response.completed", "response": {"usage": RESP_USAGE}}),
    )
    assert tap("openai-responses", body).usage_source == "reported"


# -- Gemini --------------------------------------------------------------------
def gemini_chunk(text: str, usage: dict[str, Any] | None, finish: bool = False) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finish:
        cand["finishReason"] = "STOP"
    out: dict[str, Any] = {"candidates": [cand], "modelVersion": "gemini-x"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def test_gemini_prompt_token_count_includes_cached_content() -> None:
    usage = {"promptTokenCount": 1000, "cachedContentTokenCount": 800, "candidatesTokenCount": 5}
    r = tap("gemini", sse((None, gemini_chunk("x", usage, True)), crlf=True))
    assert (r.input_tokens, r.cache_read_tokens) == (200, 800)


def test_gemini_thoughts_are_not_in_candidates_and_bill_as_output() -> None:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 95}
    r = tap("gemini", sse((None, gemini_chunk("x", usage, True)), crlf=True))
    assert (r.output_tokens, r.reasoning_tokens) == (100, 95)


def test_gemini_last_chunk_usage_is_authoritative() -> None:
    body = sse(
        (None, gemini_chunk("a", {"promptTokenCount": 10, "candidatesTokenCount": 1})),
        (None, gemini_chunk("b", {"promptTokenCount": 10, "candidatesTokenCount": 7})),
        (None, gemini_chunk("c", {"promptTokenCount": 12, "candidatesTokenCount": 9}, True)),
        crlf=True,
    )
    r = tap("gemini", body)
    assert (r.input_tokens, r.output_tokens, r.usage_source) == (12, 9, "reported")


def test_gemini_zero_counts_omitted_by_proto3_json() -> None:
    r = tap("gemini", sse((None, gemini_chunk("", {"promptTokenCount": 4}, True))))
    assert (r.input_tokens, r.output_tokens, r.usage_source) == (4, 0, "reported")


def test_responses_and_gemini_the_served_model_wins_over_the_requested_one() -> None:
    body = sse(
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {"model": "gpt-5-2025-08-07", "usage": RESP_USAGE},
            },
        ),
    )
    assert tap("openai-responses", body, model="gpt-5").model == "gpt-5-2025-08-07"
    chunk = {
        **gemini_chunk("x", {"promptTokenCount": 4}, True),
        "modelVersion": "gemini-2.5-flash-preview-09-2025",
    }
    r = tap("gemini", sse((None, chunk), crlf=True), model="gemini-2.5-flash")
    assert (r.model, r.usage_source) == ("gemini-2.5-flash-preview-09-2025", "reported")


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


def test_gemini_stream_ending_on_an_error_chunk_is_estimated() -> None:
    error = {"error": {"code": 500, "message": "Internal error", "status": "INTERNAL"}}
    body = sse(
        (None, gemini_chunk("a", {"promptTokenCount": 10, "candidatesTokenCount": 1})),
        (None, error),
        crlf=True,
    )
    r = tap("gemini", body)
    assert (r.usage_source, r.upstream_error) == ("estimated", "INTERNAL: Internal error")
    assert r.estimate_reason == "upstream_error: INTERNAL: Internal error"
    assert r.input_tokens == 10  # the partial usageMetadata still counts


def test_openai_chat_stream_ending_on_an_error_chunk_is_estimated() -> None:
    running = {"prompt_tokens": 50, "completion_tokens": 2}  # continuous usage stats
    body = sse(
        (None, chat_chunk([{"index": 0, "delta": {"content": "hi"}}], running)),
        (None, {"error": {"message": "The server had an error", "type": "server_error"}}),
    )
    r = tap("openai-chat", body)
    assert (r.usage_source, r.upstream_error) == (
        "estimated",
        "server_error: The server had an error",
    )
    assert r.input_tokens == 50


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


# -- Billed units beyond tokens, service tiers -----------------------------------------
def test_anthropic_server_tool_requests_are_units_latest_wins() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1, "server_tool_use": {"web_search_requests": 0}},
        {"output_tokens": 5, "server_tool_use": {"web_search_requests": 2}},
        {
            "output_tokens": 9,
            "server_tool_use": {"web_search_requests": 3, "web_fetch_requests": 1},
            "service_tier": "batch",
        },
    )
    r = tap("anthropic-messages", body)
    assert (dict(r.units), r.service_tier, r.usage_source) == (
        {"web_search": 3, "web_fetch": 1},
        "batch",
        "reported",
    )


def test_anthropic_a_bad_server_tool_count_is_invalid_usage() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1},
        {"output_tokens": 9, "server_tool_use": {"web_search_requests": -1}},
    )
    r = tap("anthropic-messages", body)
    assert r.usage_source == "estimated"
    assert (
        r.estimate_reason == "invalid_usage: server_tool_use: web_search_requests is negative: -1"
    )


def test_units_counted_before_a_cut_are_kept_on_the_estimate() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1},
        {"output_tokens": 5, "server_tool_use": {"web_search_requests": 2}},
    ).split(b"event: message_stop")[0]
    r = tap("anthropic-messages", body, cut="upstream_cut")
    assert (r.usage_source, dict(r.units)) == ("estimated", {"web_search": 2})


def test_openai_chat_service_tier_of_the_usage_chunk() -> None:
    last = {**chat_chunk([], USAGE), "service_tier": "flex"}
    r = tap("openai-chat", sse((None, last), (None, "[DONE]")))
    assert (r.service_tier, r.units) == ("flex", ())


def test_gemini_grounding_is_one_grounded_prompt_and_its_queries() -> None:
    chunk = gemini_chunk("x", {"promptTokenCount": 4, "candidatesTokenCount": 2}, True)
    chunk["candidates"][0]["groundingMetadata"] = {"webSearchQueries": ["a", "b"]}
    r = tap("gemini", sse((None, gemini_chunk("a", None)), (None, chunk), crlf=True))
    assert dict(r.units) == {"grounded_prompt": 1, "grounding_query": 2}
    body = {**chunk, "usageMetadata": {
        "promptTokenCount": 900, "candidatesTokenCount": 2,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 100}, {"modality": "AUDIO", "tokenCount": 800}],
    }}  # fmt: skip
    r = tap("gemini", json.dumps(body).encode(), streaming=False)
    assert dict(r.units) == {"grounded_prompt": 1, "grounding_query": 2, "input_audio_tokens": 800}


def test_a_service_tier_that_is_not_a_word_is_ignored() -> None:
    last = {**chat_chunk([], USAGE), "service_tier": "Not A Tier!"}
    assert tap("openai-chat", sse((None, last), (None, "[DONE]"))).service_tier is None


def test_gemini_odd_modality_details_and_queries_charge_tokens_only() -> None:
    """A modality that is no string, a count that is no count, queries that are no list
    or hold no strings: the totals are charged, those units left out, nothing raises."""
    usage = {
        "promptTokenCount": 50,
        "candidatesTokenCount": 5,
        "promptTokensDetails": [{"modality": ["AUDIO"], "tokenCount": 40}, "x", {"modality": "IMAGE", "tokenCount": -3}],
        "candidatesTokensDetails": [{"modality": "AUDIO", "tokenCount": 5}],
    }  # fmt: skip
    chunk = gemini_chunk("x", usage, True)
    chunk["candidates"][0]["groundingMetadata"] = {"webSearchQueries": [1, None, "q", "q"]}
    for streamed in (True, False):
        body = sse((None, chunk), crlf=True) if streamed else json.dumps(chunk).encode()
        r = tap("gemini", body, streaming=streamed)
        assert (r.usage_source, r.input_tokens, r.output_tokens) == ("reported", 50, 5)
        assert dict(r.units) == {
            "grounded_prompt": 1,
            "grounding_query": 1,
            "output_audio_tokens": 5,
        }
    chunk["candidates"][0]["groundingMetadata"] = {"webSearchQueries": "q"}
    r = tap("gemini", sse((None, chunk), crlf=True))
    assert dict(r.units) == {"grounded_prompt": 1, "output_audio_tokens": 5}


def test_anthropic_declined_hops_are_charged_apart_only_when_they_wrote_output() -> None:
    """Every iteration before the serving fallback_message with output is a separate charge
    at its model; no output: not billed; a bad count in one: invalid_usage."""
    served = {
        "type": "fallback_message",
        "model": "claude-b",
        "input_tokens": 9,
        "output_tokens": 4,
    }
    hops = [
        {"type": "message", "model": "claude-a", "input_tokens": 7, "output_tokens": 0},
        {"type": "message", "model": "claude-c", "input_tokens": 8, "output_tokens": 3},
    ]
    usage = {"input_tokens": 9, "output_tokens": 4, "iterations": [*hops, served]}
    r = tap("anthropic-messages", anthropic_stream({"input_tokens": 9, "output_tokens": 1}, usage))
    assert r.model == "claude-b" and r.usage_source == "reported"
    assert [(c.model, c.input_tokens, c.output_tokens) for c in r.separate_charges] == [
        ("claude-c", 8, 3)
    ]
    # no fallback_message: iterations are not hops of a fallback
    plain = {"input_tokens": 9, "output_tokens": 4, "iterations": hops}
    r = tap("anthropic-messages", anthropic_stream({"input_tokens": 9, "output_tokens": 1}, plain))
    assert r.separate_charges == ()
    bad = {**usage, "iterations": [{**hops[1], "output_tokens": -2}, served]}
    r = tap("anthropic-messages", anthropic_stream({"input_tokens": 9, "output_tokens": 1}, bad))
    assert r.usage_source == "estimated"
    assert r.estimate_reason == "invalid_usage: iterations[0]: output_tokens is negative: -2"

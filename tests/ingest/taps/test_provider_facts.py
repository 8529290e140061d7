"""One test per provider fact in docs/design.md ("Provider facts the mapping must get right"):
Anthropic, OpenAI Chat and Responses, Gemini here; Bedrock in test_provider_facts_bedrock.py,
billed units and service tiers in test_provider_facts_units.py."""

from __future__ import annotations

import json

from tests.ingest.taps.provider_facts_kit import (
    FALLBACK_REQUEST,
    USAGE,
    anthropic_stream,
    chat_chunk,
    gemini_chunk,
    sse,
    tap,
)


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
    r = tap("anthropic-messages", body, request=FALLBACK_REQUEST)
    assert (r.model, r.input_tokens, r.output_tokens) == ("claude-y", 40, 9)
    assert r.model_note is None
    # a request that did not allow fallback: the answer's relabel is not priced
    r = tap("anthropic-messages", body, request={"model": "claude-x"})
    assert (r.model, r.input_tokens, r.output_tokens) == ("claude-x", 40, 9)
    assert r.model_note is not None and "'claude-y'" in r.model_note


def test_anthropic_iterations_without_a_fallback_keep_the_model() -> None:
    body = anthropic_stream(
        {"input_tokens": 40, "output_tokens": 1},
        {"output_tokens": 9, "iterations": [{"type": "message", "model": "claude-z"}]},
    )
    r = tap("anthropic-messages", body, request=FALLBACK_REQUEST)
    assert (r.model, r.model_note) == ("claude-x", None)


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
    body = head + block + b"event: message_delta" + tail
    r = tap("anthropic-messages", body, request=FALLBACK_REQUEST)
    assert (r.model, r.usage_source) == ("claude-served", "reported")
    r = tap("anthropic-messages", body, request={"model": "claude-x"})  # no fallback asked
    assert (r.model, r.usage_source) == ("claude-x", "reported")


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
    r = tap(
        "anthropic-messages",
        head + sse(*events) + b"event: message_delta" + tail,
        request=FALLBACK_REQUEST,
    )
    assert (r.model, r.usage_source, r.model_note) == ("claude-x", "reported", None)


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


def test_openai_chat_a_dated_snapshot_of_the_requested_model_is_priced() -> None:
    """The response's ``model`` is the snapshot that served (an alias resolves to a dated
    one): it is charged when it is the requested model's dated snapshot, whether the
    request named the model in its body or the URL hint did."""
    served = {
        **chat_chunk([{"index": 0, "delta": {"content": "hi"}}]),
        "model": "gpt-4o-2024-08-06",
    }
    last = {**chat_chunk([], USAGE), "model": "gpt-4o-2024-08-06"}
    stream = sse((None, served), (None, last), (None, "[DONE]"))
    r = tap("openai-chat", stream, request={"model": "gpt-4o"})
    assert (r.model, r.usage_source, r.model_note) == ("gpt-4o-2024-08-06", "reported", None)
    body = {
        "object": "chat.completion",
        "model": "gpt-4o-2024-08-06",
        "choices": [],
        "usage": USAGE,
    }
    r = tap("openai-chat", json.dumps(body).encode(), streaming=False, model="gpt-4o")
    assert (r.model, r.model_note) == ("gpt-4o-2024-08-06", None)


def test_openai_chat_another_model_in_the_answer_is_priced_as_requested() -> None:
    """An answer naming another model (a cheaper one, an undated snapshot, a size) is
    priced at the requested model, with a note saying why."""
    for named in ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06-mini"):
        last = {**chat_chunk([], USAGE), "model": named}
        r = tap("openai-chat", sse((None, last), (None, "[DONE]")), request={"model": "gpt-4o"})
        assert (r.model, r.usage_source) == ("gpt-4o", "reported")
        assert r.model_note is not None and repr(named) in r.model_note
    last = {**chat_chunk([], USAGE), "model": "gpt-4-0125-preview"}
    r = tap("openai-chat", sse((None, last), (None, "[DONE]")), request={"model": "gpt-4"})
    assert r.model == "gpt-4"


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
    r = tap("openai-responses", body, request={"model": "gpt-r"})
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


def test_responses_and_gemini_a_dated_snapshot_of_the_requested_model_is_priced() -> None:
    """Responses names the snapshot in ``response.model``, Gemini in ``modelVersion``
    (its stable versions end in three digits): taken when it is the requested model's
    (the URL's for Gemini); a preview or another model is priced as requested."""
    body = sse(
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {"model": "gpt-5-2025-08-07", "usage": RESP_USAGE},
            },
        ),
    )
    assert tap("openai-responses", body, request={"model": "gpt-5"}).model == "gpt-5-2025-08-07"
    r = tap("openai-responses", body, request={"model": "gpt-5-pro"})
    assert (r.model, r.usage_source) == ("gpt-5-pro", "reported")
    for version, priced in (
        ("gemini-1.5-flash-002", "gemini-1.5-flash-002"),
        ("gemini-1.5-flash", "gemini-1.5-flash"),
        ("gemini-1.5-flash-preview-09-2025", "gemini-1.5-flash"),
        ("gemini-1.5-flash-8b", "gemini-1.5-flash"),
    ):
        chunk = {**gemini_chunk("x", {"promptTokenCount": 4}, True), "modelVersion": version}
        r = tap("gemini", sse((None, chunk), crlf=True), model="gemini-1.5-flash")
        assert (r.model, r.usage_source) == (priced, "reported"), version
        assert (r.model_note is None) == (version == priced)


def test_gemini_the_url_names_the_model_not_the_body() -> None:
    """Gemini serves the URL's model: a ``model`` in the body names nothing it serves."""
    chunk = {**gemini_chunk("x", {"promptTokenCount": 4}, True), "modelVersion": "gemini-2.5-pro"}
    r = tap(
        "gemini",
        sse((None, chunk), crlf=True),
        model="gemini-2.5-pro",
        request={"model": "gemini-2.0-flash-lite", "contents": []},
    )
    assert (r.model, r.model_note) == ("gemini-2.5-pro", None)


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

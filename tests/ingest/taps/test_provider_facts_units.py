"""The provider facts of billed units beyond tokens (server tools, grounding), service
tiers and charges billed apart (docs/design.md)."""

from __future__ import annotations

import json

from tests.ingest.taps.provider_facts_kit import (
    FALLBACK_REQUEST,
    REQUEST,
    USAGE,
    anthropic_stream,
    chat_chunk,
    gemini_chunk,
    sse,
    tap,
)


# -- Billed units beyond tokens, service tiers -----------------------------------------
def test_anthropic_server_tool_requests_are_units_latest_wins() -> None:
    body = anthropic_stream(
        {"input_tokens": 10, "output_tokens": 1, "server_tool_use": {"web_search_requests": 0}},
        {"output_tokens": 5, "server_tool_use": {"web_search_requests": 2}},
        {
            "output_tokens": 9,
            "server_tool_use": {"web_search_requests": 3, "web_fetch_requests": 1},
            "service_tier": "priority",
        },
    )
    r = tap("anthropic-messages", body)
    assert (dict(r.units), r.service_tier, r.usage_source) == (
        {"web_search": 3, "web_fetch": 1},
        "priority",
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
    body = sse((None, last), (None, "[DONE]"))
    r = tap("openai-chat", body, request={**REQUEST, "service_tier": "flex"})
    assert (r.service_tier, r.units) == ("flex", ())
    priority = {**chat_chunk([], USAGE), "service_tier": "priority"}
    assert tap("openai-chat", sse((None, priority), (None, "[DONE]"))).service_tier == "priority"


def test_a_discounted_tier_the_request_did_not_ask_for_is_charged_standard() -> None:
    """An answer naming flex or batch halves its own price: only a request that asked for
    that tier is charged at it (issue 32); any other pays the standard rate."""
    for tier in ("flex", "batch"):
        last = {**chat_chunk([], USAGE), "service_tier": tier}
        body = sse((None, last), (None, "[DONE]"))
        for request in (REQUEST, {**REQUEST, "service_tier": "auto"}):
            r = tap("openai-chat", body, request=request)
            assert (r.service_tier, r.usage_source) == (None, "reported"), (tier, request)
        body = anthropic_stream(
            {"input_tokens": 10, "output_tokens": 1},
            {"output_tokens": 9, "service_tier": tier},
        )
        assert tap("anthropic-messages", body).service_tier is None


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


def test_gemini_tier_is_the_response_headers_and_a_discount_needs_asking() -> None:
    """Gemini names the tier that served a call only in ``x-gemini-service-tier``; the
    request asks with ``service_tier`` / ``serviceTier``, spelt ``flex``, ``FLEX`` or
    ``SERVICE_TIER_FLEX`` (Google's docs use all three)."""
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 5}
    body = sse((None, gemini_chunk("hi", usage, finish=True)))
    for request, header, charged in (
        ({"service_tier": "flex"}, "flex", "flex"),
        ({"serviceTier": "FLEX"}, "flex", "flex"),
        ({"service_tier": "SERVICE_TIER_FLEX"}, "SERVICE_TIER_FLEX", "flex"),
        ({}, "flex", None),  # a discount the request did not ask for: standard
        ({"service_tier": "priority"}, "flex", None),
        ({"service_tier": "priority"}, "priority", "priority"),
        ({}, "standard", "standard"),  # at or above standard: as the answer says
        ({"service_tier": "flex"}, None, None),  # no header: no tier said
        ({"service_tier": "flex"}, "Not A Tier!", None),
    ):
        headers = {} if header is None else {"x-gemini-service-tier": header}
        r = tap("gemini", body, request=request, model="gemini-x", response_headers=headers)
        assert (r.service_tier, r.input_tokens, r.output_tokens) == (charged, 10, 5), request
    # the header means nothing on another provider's response
    last = chat_chunk([], USAGE)
    r = tap(
        "openai-chat",
        sse((None, last), (None, "[DONE]")),
        response_headers={"x-gemini-service-tier": "priority"},
    )
    assert r.service_tier is None


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
    r = tap(
        "anthropic-messages",
        anthropic_stream({"input_tokens": 9, "output_tokens": 1}, usage),
        request=FALLBACK_REQUEST,
    )
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

"""Estimates for missing usage, and what requests tell them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ingest.taps import FORMATS, EstimatorConfig, open_tap, read_request
from ingest.taps.estimate import Observed, estimate_usage
from ingest.taps.request import _READERS, RequestInfo
from ingest.taps.usage import Usage

CFG = EstimatorConfig()


def est(request: RequestInfo, **seen: object) -> Usage:
    return estimate_usage(request, Observed(**{"streaming": True, **seen}), CFG)  # type: ignore[arg-type]  # the fields' types are Observed's to check


def test_output_is_text_over_four_at_least_one_per_delta() -> None:
    req = RequestInfo(size=400)
    assert est(req, delta_events=3, text_chars=41).output_tokens == 11
    assert est(req, delta_events=30, text_chars=41).output_tokens == 30


def test_output_capped_by_max_tokens_else_config_cap() -> None:
    assert est(RequestInfo(size=4, max_output_tokens=50), text_chars=10_000).output_tokens == 50
    assert est(RequestInfo(size=4), text_chars=10**9).output_tokens == 128_000
    small = EstimatorConfig(output_cap=1000)
    seen = Observed(streaming=True, text_chars=10**9)
    assert estimate_usage(RequestInfo(size=4), seen, small).output_tokens == 1000


def test_non_streamed_output_is_body_bytes_over_four() -> None:
    seen = Observed(streaming=False, body_bytes=1001)
    assert estimate_usage(RequestInfo(size=4), seen, CFG).output_tokens == 251


def test_unreadable_output_charges_the_cap() -> None:
    req = RequestInfo(size=4, max_output_tokens=700)
    assert est(req, output_unknown=True, text_chars=5).output_tokens == 700


def test_at_least_the_thinking_budget_when_reasoning_else_the_cap() -> None:
    """Issue 21's rule: reasoning on, the output is at least the thinking budget; with no
    budget named (an effort, a reasoning model's default) it is the cap, not a fixed
    4,096 (a high effort thinks far past it)."""
    req = RequestInfo(size=4, max_output_tokens=20_000, reasoning=True, thinking_budget=16_000)
    usage = est(req, delta_events=1, text_chars=4)
    assert (usage.output_tokens, usage.reasoning_tokens) == (16_000, 16_000)
    no_budget = RequestInfo(size=4, max_output_tokens=30_000, reasoning=True)
    assert est(no_budget, text_chars=4).output_tokens == 30_000
    assert est(RequestInfo(size=4, reasoning=True), text_chars=4).output_tokens == 128_000
    assert est(RequestInfo(size=4, max_output_tokens=30_000), text_chars=4).output_tokens == 1
    # the budget counts per candidate, as the cap does
    two = RequestInfo(size=4, reasoning=True, thinking_budget=5_000, candidates=2)
    assert est(two, text_chars=4).output_tokens == 10_000


def test_the_cap_counts_every_candidate() -> None:
    """n=8 without usage writes up to 8 times the max: the estimate's cap is per candidate."""
    eight = RequestInfo(size=4, max_output_tokens=1_000, candidates=8)
    assert est(eight, output_unknown=True).output_tokens == 8_000
    assert est(eight, text_chars=10**9).output_tokens == 8_000
    assert est(eight, text_chars=20_000).output_tokens == 5_000  # what was seen, under the cap
    seen = Observed(streaming=False, body_bytes=10**9)
    assert estimate_usage(eight, seen, CFG).output_tokens == 8_000
    assert est(RequestInfo(size=4, candidates=3), output_unknown=True).output_tokens == 384_000


def test_candidates_are_read_from_n_and_candidate_count() -> None:
    assert read_request("openai-chat", {"n": 8}).candidates == 8
    assert read_request("openai-chat", {"n": 10**6}).candidates == 128
    for bad in (0, -3, "8", 2.0, None, True):
        assert read_request("openai-chat", {"n": bad}).candidates == 1
    config = {"generationConfig": {"candidateCount": 4, "maxOutputTokens": 100}}
    assert read_request("gemini", config).candidates == 4
    assert read_request("gemini", {"generation_config": {"candidate_count": 2}}).candidates == 2
    assert read_request("anthropic-messages", {"n": 8}).candidates == 1  # not Anthropic's
    tap = open_tap("gemini", config, content_type="text/event-stream")
    tap.feed(b'data: {"candidates": [{"content": {"parts": [{"text": "ab"}]}}]}\r\n\r\n')
    result = tap.finish(cut="upstream_cut")
    assert result.output_tokens == 1
    body = {"n": 8, "max_tokens": 50, "stream": True}
    tap = open_tap("openai-chat", body, content_type="text/event-stream", content_encoding="x-no")
    tap.feed(b"\x00\x01")
    assert tap.finish().output_tokens == 400  # unreadable: the cap, every candidate's


@pytest.mark.parametrize(
    ("fmt", "body", "reasoning"),
    [
        ("openai-chat", {"model": "o3"}, True),
        ("openai-chat", {"model": "o4-mini-2025-04-16"}, True),
        ("openai-chat", {"model": "gpt-5"}, True),
        ("openai-chat", {"model": "openai/gpt-5.1-mini"}, True),
        ("openai-chat", {"model": "gpt-5", "reasoning_effort": "none"}, False),
        ("openai-chat", {"model": "gpt-5-chat-latest"}, False),
        ("openai-chat", {"model": "gpt-4.1"}, False),
        ("openai-chat", {"model": "gpt-4.1", "reasoning_effort": "high"}, True),
        ("openai-chat", {"model": "omni-moderation-latest"}, False),
        ("openai-responses", {"model": "o3"}, True),
        ("openai-responses", {"model": "gpt-4o", "reasoning": {"effort": "low"}}, True),
        ("openai-responses", {"model": "gpt-4o", "reasoning": {"summary": "auto"}}, True),
        ("openai-responses", {"model": "gpt-5", "reasoning": {"effort": "none"}}, False),
        ("openai-responses", {"model": "gpt-4o"}, False),
    ],
)
def test_openai_reasoning_by_model_or_effort(
    fmt: str, body: dict[str, object], reasoning: bool
) -> None:
    """A reasoning model reasons without being asked (its default effort), so its
    estimate is the cap too; an effort of ``none`` turns it off."""
    assert read_request(fmt, body).reasoning is reasoning


def test_a_background_response_without_usage_is_the_floor_plus_the_cap() -> None:
    """``background: true`` answers a queued response with null usage and keeps
    generating: charged the server-state floor plus the output cap (was floor + body/4)."""
    request = {"model": "gpt-4.1", "background": True, "max_output_tokens": 3_000, "input": "hi"}
    tap = open_tap("openai-responses", request, content_type="application/json")
    tap.feed(json.dumps({"id": "resp_1", "status": "queued", "usage": None}).encode())
    result = tap.finish()
    assert result.usage_source == "estimated"
    assert (result.input_tokens, result.output_tokens) == (200_000, 3_000)
    no_cap = open_tap("openai-responses", {**request, "max_output_tokens": None})
    no_cap.feed(json.dumps({"id": "resp_1", "status": "queued", "usage": None}).encode())
    assert no_cap.finish().output_tokens == 128_000
    foreground = open_tap("openai-responses", {**request, "background": False})
    foreground.feed(json.dumps({"id": "resp_1", "status": "queued", "usage": None}).encode())
    assert foreground.finish().output_tokens < 100


def test_input_is_request_bytes_over_three_or_the_floor_with_server_state() -> None:
    """Seed 003's rule (bytes / 3, rounded up), which the enforcer's hold uses too: a
    charged estimate is never below the input the request was admitted on."""
    assert est(RequestInfo(size=401)).input_tokens == 134
    assert est(RequestInfo(size=400)).input_tokens == 134
    assert est(RequestInfo(size=399)).input_tokens == 133
    assert est(RequestInfo(size=401, server_state=("conversation",))).input_tokens == 200_000
    assert est(RequestInfo(size=10**7, server_state=("x",))).input_tokens == 3_333_334
    assert est(RequestInfo()).input_tokens == 200_000  # no request: unknown
    assert est(RequestInfo(size=40, readable=False)).input_tokens == 200_000


def test_partial_report_fixes_input_and_floors_output() -> None:
    partial = Usage(
        input_tokens=7,
        cache_read_tokens=9,
        cache_write_tokens=5,
        cache_write_1h_tokens=2,
        output_tokens=300,
    )
    usage = est(RequestInfo(size=10**6, server_state=("x",)), partial=partial, text_chars=8)
    assert usage == Usage(7, 9, 5, 2, 300, 0)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        EstimatorConfig(output_cap=-1)
    with pytest.raises(ValueError):
        EstimatorConfig(delta_text="nope")  # type: ignore[arg-type]  # a bad value is what is refused
    with pytest.raises(ValueError):
        EstimatorConfig(chars_per_token=0)
    with pytest.raises(ValueError, match="request_bytes_per_token"):
        EstimatorConfig(request_bytes_per_token=0)


@pytest.mark.parametrize(
    ("fmt", "request_body", "names"),
    [
        ("openai-responses", {"previous_response_id": "resp_1"}, ["previous_response_id"]),
        ("openai-responses", {"conversation": "conv_1"}, ["conversation"]),
        ("openai-responses", {"prompt": {"id": "pmpt_1"}}, ["stored prompt"]),
        ("openai-responses", {"background": True}, ["background mode"]),
        (
            "openai-responses",
            {"tools": [{"type": "file_search"}, {"type": "function"}]},
            ["server tool file_search"],
        ),
        (
            "openai-responses",
            {"tools": [{"type": "mcp", "server_url": "https://x"}]},
            ["server tool mcp"],
        ),
        (
            "openai-responses",
            {"tools": [{"type": "code_interpreter"}]},
            ["server tool code_interpreter"],
        ),
        (
            "openai-responses",
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
            ["file by id"],
        ),
        (
            "openai-responses",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/cat.png"}],
                    }
                ]
            },
            ["image by URL"],
        ),
        (
            "openai-responses",
            {"input": [{"type": "item_reference", "id": "msg_1"}]},
            ["item_reference"],
        ),
        (
            "openai-chat",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}
                        ],
                    }
                ]
            },
            ["image by URL"],
        ),
        (
            "openai-chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-9"}}]}
                ]
            },
            ["file by id"],
        ),
        ("openai-chat", {"web_search_options": {}}, ["server tool web_search"]),
        (
            "anthropic-messages",
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            ["server tool web_search_20250305"],
        ),
        (
            "anthropic-messages",
            {"tools": [{"type": "code_execution_20250825"}]},
            ["server tool code_execution_20250825"],
        ),
        (
            "anthropic-messages",
            {"mcp_servers": [{"type": "url", "url": "https://m"}]},
            ["MCP servers"],
        ),
        (
            "anthropic-messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
                        ],
                    }
                ]
            },
            ["file by id", "content by file"],
        ),
        (
            "anthropic-messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}
                        ],
                    }
                ]
            },
            ["content by url"],
        ),
        ("gemini", {"cachedContent": "cachedContents/abc"}, ["cached content"]),
        ("gemini", {"tools": [{"codeExecution": {}}]}, ["server tool codeExecution"]),
        (
            "gemini",
            {"contents": [{"parts": [{"fileData": {"fileUri": "https://g/f"}}]}]},
            ["file by URL"],
        ),
        (
            "bedrock-converse",
            {
                "messages": [
                    {"content": [{"document": {"source": {"s3Location": {"uri": "s3://b/k"}}}}]}
                ]
            },
            ["object by S3 location"],
        ),
        ("bedrock-converse", {"promptVariables": {"topic": {"text": "x"}}}, ["stored prompt"]),
    ],
)
def test_server_side_state_is_found_structurally(
    fmt: str, request_body: dict[str, object], names: list[str]
) -> None:
    assert sorted(read_request(fmt, request_body).server_state) == sorted(names)


def test_text_naming_server_state_is_not_server_state() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": 'please use "previous_response_id": "r", "file_id": "f", https://x/a.png',
            }
        ]
    }
    for fmt in ("openai-chat", "openai-responses", "anthropic-messages"):
        assert read_request(fmt, body).server_state == ()


def test_request_limits_and_reasoning() -> None:
    info = read_request(
        "openai-chat",
        {"model": "o3", "stream": True, "max_completion_tokens": 900, "reasoning_effort": "low"},
    )
    assert (info.model, info.stream, info.max_output_tokens, info.reasoning) == (
        "o3",
        True,
        900,
        True,
    )
    info = read_request(
        "gemini",
        {"generationConfig": {"maxOutputTokens": 64, "thinkingConfig": {"thinkingBudget": -1}}},
    )
    assert (info.max_output_tokens, info.reasoning, info.thinking_budget) == (64, True, None)
    info = read_request(
        "gemini", {"generation_config": {"thinking_config": {"thinking_budget": 0}}}
    )
    assert not info.reasoning
    info = read_request(
        "bedrock-converse",
        {
            "inferenceConfig": {"maxTokens": 10},
            "additionalModelRequestFields": {
                "reasoning_config": {"type": "enabled", "budget_tokens": 2000}
            },
        },
    )
    assert (info.max_output_tokens, info.thinking_budget) == (10, 2000)
    assert read_request("openai-chat", b"not json").readable is False
    assert read_request("openai-chat", b"[1]").readable is False
    raw = json.dumps({"model": "m"}).encode()
    assert read_request("openai-chat", raw).size == len(raw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_request_reader_names_only_request_info_fields(fmt: str) -> None:
    """read_request takes the readers' fields by name with ``get``: a key that is not
    a field would be dropped without a word."""
    fields = {field.name for field in dataclasses.fields(RequestInfo)}
    assert set(_READERS[fmt]({})) <= fields


def test_estimate_through_a_tap_applies_the_server_state_floor() -> None:
    tap = open_tap(
        "openai-responses", {"model": "gpt", "previous_response_id": "resp_1", "stream": True}
    )
    tap.feed(b'event: response.output_text.delta\ndata: {"delta": "abcdefgh"}\n\n')
    result = tap.finish(cut="client_disconnected")
    assert (result.input_tokens, result.output_tokens) == (200_000, 2)
    assert result.estimate_reason == "client_disconnected"


def test_requests_name_the_units_they_can_be_charged_at_most() -> None:
    """unit_caps: what the enforcer can know before sending (a server tool's max_uses,
    max_tool_calls, an auto container, a grounded prompt); containers named by id."""
    info = read_request(
        "anthropic-messages",
        {
            "tools": [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2},
                {"type": "web_search_20250305", "name": "web_search_2"},  # no bound: unknown
            ]
        },
    )
    assert info.unit_caps == (("web_fetch", 2), ("web_search", 5))
    info = read_request(
        "openai-responses",
        {
            "max_tool_calls": 3,
            "tools": [
                {"type": "web_search"},
                {"type": "code_interpreter", "container": {"type": "auto"}},
                {"type": "code_interpreter", "container": "cntr_abc"},
            ],
        },
    )
    assert info.unit_caps == (("code_interpreter_session", 1), ("web_search", 3))
    assert info.containers == ("cntr_abc",)
    assert read_request("openai-responses", {"tools": [{"type": "web_search"}]}).unit_caps == ()
    info = read_request("gemini", {"tools": [{"google_search": {}}]})
    assert info.unit_caps == (("grounded_prompt", 1),)
    assert read_request("openai-chat", {"messages": []}).unit_caps == ()


def test_an_undecodable_body_is_charged_the_cap_not_its_bytes_over_four() -> None:
    """A kept difference from seed 003 (which charges an undecodable body its bytes / 4):
    the bytes of an encoding the tap could not undo say nothing of the text (here 40,000
    bytes that claim gzip: / 4 would be 10,000 tokens, and a real gzip body of a longer
    answer fewer still), so the output charged is the cap, the one bound known."""
    request = {
        "model": "gpt-4o",
        "max_tokens": 50_000,
        "messages": [{"role": "user", "content": "hi"}],
    }
    tap = open_tap("openai-chat", request, content_encoding="gzip", status=200)
    tap.feed(bytes(range(256)) * 156 + b"\x00" * 64)  # 40,000 bytes, not gzip
    result = tap.finish()
    assert result.usage_source == "estimated"
    assert result.output_tokens == 50_000  # not 40,000 / 4
    # and with no max in the request, the configured cap, however few the bytes
    uncapped = {k: v for k, v in request.items() if k != "max_tokens"}
    tap = open_tap("openai-chat", uncapped, content_encoding="gzip", status=200)
    tap.feed(b"not gzip")
    assert tap.finish().output_tokens == CFG.output_cap

"""Usage the upstream cannot zero (issue 32, item 6): for each tap family, an answer that
reports its usage twice (a later report lower or zero), gives a usage object or one of its
counts twice in one JSON document (readers keep the last, or the first), writes the key
again with an escape, or names a cheaper model is charged by the rule that cannot be
gamed: the field-wise maximum of every reading of every report, at the requested model's
price unless the provider documents the relabel. Each shape is read whole, split at every
stride and through the general path (no shortcut): the same charge."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

import ingest.taps.base
from ingest.taps import (
    EstimatorConfig,
    TapResult,
    gemini,
    open_realtime_tap,
    open_tap,
    shapes,
)
from ingest.taps import usage as usage_module
from ingest.taps.eventstream import encode_message
from ingest.taps.repeats import MAX_READINGS

PAYLOAD_BYTES = EstimatorConfig(delta_text="payload_bytes")


def read_once(
    fmt: str,
    chunks: list[bytes],
    request: dict[str, Any],
    *,
    streaming: bool,
    model: str | None,
    estimator: EstimatorConfig,
) -> TapResult:
    tap = open_tap(fmt, request, streaming=streaming, model=model, estimator=estimator)
    for chunk in chunks:
        tap.feed(chunk)
    return tap.finish()


def read(
    fmt: str,
    body: bytes,
    request: dict[str, Any],
    *,
    streaming: bool = True,
    model: str | None = None,
    estimator: EstimatorConfig | None = None,
) -> TapResult:
    """``body`` through a tap: whole, in pieces of 1, 7 and 61 bytes, and with every
    shortcut off; all must charge the same. Returns the charge."""
    config = estimator or EstimatorConfig()
    kw: dict[str, Any] = {"streaming": streaming, "model": model, "estimator": config}
    whole = read_once(fmt, [body], request, **kw)
    for stride in (1, 7, 61):
        pieces = [body[i : i + stride] for i in range(0, len(body), stride)]
        assert read_once(fmt, pieces, request, **kw) == whole, stride
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ingest.taps.base.SHORTCUTS, "enabled", False)
        assert read_once(fmt, [body], request, **kw) == whole
    return whole


def counts(r: TapResult) -> tuple[int, int, int, int, int, str]:
    return (
        r.input_tokens,
        r.cache_read_tokens,
        r.cache_write_tokens,
        r.output_tokens,
        r.reasoning_tokens,
        r.usage_source,
    )


def raw(*events: tuple[str | None, str]) -> bytes:
    """SSE events whose data is written as given (JSON with repeated keys)."""
    return b"".join(
        (f"event: {name}\n" if name else "").encode() + b"data: " + data.encode() + b"\n\n"
        for name, data in events
    )


# -- OpenAI Chat -----------------------------------------------------------------------
CHAT = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True}}
CHAT_USAGE = (
    '{"prompt_tokens":1000,"completion_tokens":300,'
    '"prompt_tokens_details":{"cached_tokens":600},'
    '"completion_tokens_details":{"reasoning_tokens":200}}'
)
CHAT_ZERO = '{"prompt_tokens":0,"completion_tokens":0}'
#: what CHAT_USAGE charges
CHAT_CHARGE = (400, 600, 0, 300, 200, "reported")


def chat_text(n: int = 3) -> list[tuple[str | None, str]]:
    first = '{"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant"}}],"usage":null}'
    delta = '{"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}'
    return [(None, first), *[(None, delta)] * n]


def test_chat_a_later_zero_usage_chunk_lowers_nothing() -> None:
    body = raw(
        *chat_text(),
        (None, '{"choices":[],"usage":' + CHAT_USAGE + "}"),
        (None, '{"choices":[],"usage":' + CHAT_ZERO + "}"),
        (None, "[DONE]"),
    )
    r = read("openai-chat", body, CHAT)
    assert counts(r) == CHAT_CHARGE
    assert r.model == "gpt-4o-2024-08-06"  # the requested model's dated snapshot


def test_chat_a_usage_given_twice_in_one_chunk_is_charged_its_largest_reading() -> None:
    for second in ('"usage":' + CHAT_ZERO, '"us\\u0061ge":' + CHAT_ZERO, '"usage":null'):
        chunk = '{"choices":[],"usage":' + CHAT_USAGE + "," + second + "}"
        body = raw(*chat_text(), (None, chunk), (None, "[DONE]"))
        assert counts(read("openai-chat", body, CHAT)) == CHAT_CHARGE, second
    # the usage hidden behind a null in a chunk that still streams text
    hidden = (
        '{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":' + CHAT_USAGE + ',"usage":null}'
    )
    body = raw(*chat_text(), (None, hidden), (None, "[DONE]"))
    assert counts(read("openai-chat", body, CHAT)) == CHAT_CHARGE


def test_chat_a_count_given_twice_is_its_largest_and_conflicts_charge_most() -> None:
    usage = '{"prompt_tokens":1000,"completion_tokens":300,"completion_tokens":0}'
    body = raw(*chat_text(), (None, '{"choices":[],"usage":' + usage + "}"), (None, "[DONE]"))
    assert counts(read("openai-chat", body, CHAT))[3] == 300
    # cached given twice: each reading's input and cache reads, at their maxima (the
    # normalised counts: the larger cached_tokens alone would lower the input)
    usage = (
        '{"prompt_tokens":1000,"completion_tokens":5,'
        '"prompt_tokens_details":{"cached_tokens":0,"cached_tokens":900}}'
    )
    body = raw(*chat_text(), (None, '{"choices":[],"usage":' + usage + "}"), (None, "[DONE]"))
    assert counts(read("openai-chat", body, CHAT)) == (1000, 900, 0, 5, 0, "reported")


def test_chat_a_body_giving_its_usage_twice_is_charged_its_largest() -> None:
    for second in ('"usage":' + CHAT_ZERO, '"\\u0075sage":' + CHAT_ZERO):
        body = (
            '{"object":"chat.completion","model":"gpt-4o","choices":[],"usage":'
            + CHAT_USAGE
            + ","
            + second
            + "}"
        ).encode()
        r = read("openai-chat", body, {"model": "gpt-4o"}, streaming=False)
        assert counts(r) == CHAT_CHARGE, second


def test_chat_a_body_too_large_to_parse_whole_giving_its_usage_twice() -> None:
    text = "word " * 70_000  # past the whole-parse limit: scanned
    body = json.dumps(
        {"object": "chat.completion", "model": "gpt-4o", "choices": [{"message": text}]}
    )[:-1] + (',"usage":' + CHAT_USAGE + ',"usage":' + CHAT_ZERO + "}")
    assert len(body) > ingest.taps.base.WHOLE_PARSE_LIMIT
    tap = open_tap("openai-chat", {"model": "gpt-4o"}, streaming=False)
    tap.feed(body.encode())
    assert counts(tap.finish()) == CHAT_CHARGE


def test_chat_payload_bytes_reads_every_usage_chunk_not_the_last_few() -> None:
    body = raw(
        *chat_text(1),
        (None, '{"choices":[],"usage":' + CHAT_USAGE + "}"),
        *chat_text(6)[1:],
        (None, '{"choices":[],"usage":' + CHAT_ZERO + "}"),
        (None, "[DONE]"),
    )
    assert counts(read("openai-chat", body, CHAT, estimator=PAYLOAD_BYTES)) == CHAT_CHARGE


def test_chat_an_invalid_report_before_a_zero_one_is_estimated_never_free() -> None:
    bad = '{"prompt_tokens":1000,"completion_tokens":-5}'
    body = raw(
        *chat_text(),
        (None, '{"choices":[],"usage":' + bad + "}"),
        (None, '{"choices":[],"usage":' + CHAT_ZERO + "}"),
        (None, "[DONE]"),
    )
    r = read("openai-chat", body, {**CHAT, "max_tokens": 100})
    assert r.usage_source == "estimated"
    assert r.estimate_reason == "invalid_usage: completion_tokens is negative: -5"
    assert r.input_tokens > 0 and r.output_tokens > 0


def test_chat_keys_repeated_past_the_readings_read_are_not_reported() -> None:
    pairs = ",".join(f'"x{i}":{{"a":1,"a":2}}' for i in range(7))  # 2^7 readings
    chunk = '{"choices":[],' + pairs + ',"usage":' + CHAT_USAGE + ',"usage":' + CHAT_ZERO + "}"
    assert MAX_READINGS < 2**7
    body = raw(*chat_text(), (None, chunk), (None, "[DONE]"))
    r = read("openai-chat", body, CHAT)
    assert r.usage_source == "estimated"
    assert r.estimate_reason is not None and r.estimate_reason.startswith("invalid_usage")
    assert r.output_tokens > 0


def test_chat_a_cheaper_model_named_in_the_answer_is_priced_as_requested() -> None:
    body = raw(
        (None, '{"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"a"}}]}'),
        (None, '{"model":"gpt-4o-mini","choices":[],"usage":' + CHAT_USAGE + "}"),
        (None, "[DONE]"),
    )
    r = read("openai-chat", body, CHAT)
    assert (r.model, counts(r)) == ("gpt-4o", CHAT_CHARGE)
    assert r.model_note is not None and "'gpt-4o-mini'" in r.model_note
    assert r.as_dict()["model_note"] == r.model_note  # what `tap inspect` prints


# -- OpenAI Responses --------------------------------------------------------------------
RESPONSES = {"model": "gpt-5", "stream": True}
RESP_USAGE = (
    '{"input_tokens":900,"input_tokens_details":{"cached_tokens":500},'
    '"output_tokens":70,"output_tokens_details":{"reasoning_tokens":40}}'
)
RESP_ZERO = '{"input_tokens":0,"output_tokens":0}'
RESP_CHARGE = (400, 500, 0, 70, 40, "reported")


def completed(usage: str, *, extra: str = "", model: str = "gpt-5-2025-08-07") -> str:
    return (
        '{"type":"response.completed","response":{"model":"'
        + model
        + '","status":"completed","usage":'
        + usage
        + extra
        + "}}"
    )


def test_responses_a_second_terminal_event_with_zero_usage_lowers_nothing() -> None:
    delta = '{"type":"response.output_text.delta","delta":"hi"}'
    body = raw(
        ("response.output_text.delta", delta),
        ("response.completed", completed(RESP_USAGE)),
        ("response.completed", completed(RESP_ZERO)),
    )
    r = read("openai-responses", body, RESPONSES)
    assert (counts(r), r.model) == (RESP_CHARGE, "gpt-5-2025-08-07")


def test_responses_usage_or_response_given_twice_in_one_event() -> None:
    twice = completed(RESP_USAGE, extra=',"usage":' + RESP_ZERO)
    escaped = completed(RESP_USAGE, extra=',"\\u0075sage":' + RESP_ZERO)
    response_twice = completed(RESP_USAGE)[:-1] + ',"response":{"usage":' + RESP_ZERO + "}}"
    for event in (twice, escaped, response_twice):
        assert counts(read("openai-responses", raw(("response.completed", event)), RESPONSES)) == (
            RESP_CHARGE
        ), event
    # an event without a name, read by its type: a type given twice hides nothing
    typed = completed(RESP_USAGE)[:-1] + ',"type":"response.output_text.delta"}'
    r = read("openai-responses", raw((None, typed)), RESPONSES)
    assert counts(r) == RESP_CHARGE


def test_responses_a_body_giving_its_usage_twice() -> None:
    body = (
        '{"object":"response","model":"gpt-5","status":"completed","usage":'
        + RESP_USAGE
        + ',"usage":'
        + RESP_ZERO
        + "}"
    ).encode()
    r = read("openai-responses", body, {"model": "gpt-5"}, streaming=False)
    assert counts(r) == RESP_CHARGE


def test_responses_a_cheaper_model_in_the_answer_is_priced_as_requested() -> None:
    body = raw(("response.completed", completed(RESP_USAGE, model="gpt-5-nano")))
    r = read("openai-responses", body, RESPONSES)
    assert (r.model, counts(r)) == ("gpt-5", RESP_CHARGE)
    assert r.model_note is not None


# -- Anthropic -----------------------------------------------------------------------------
ANTHROPIC = {"model": "claude-opus-4-5", "max_tokens": 1024, "stream": True}
START_USAGE = (
    '{"input_tokens":50,"cache_read_input_tokens":800,"cache_creation_input_tokens":100,'
    '"output_tokens":1}'
)
ANTHROPIC_CHARGE = (50, 800, 100, 900, 0, "reported")


def anthropic_events(*deltas: str, model: str = "claude-opus-4-5-20251101") -> bytes:
    start = (
        '{"type":"message_start","message":{"model":"' + model + '","usage":' + START_USAGE + "}}"
    )
    text = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}'
    return raw(
        ("message_start", start),
        ("content_block_delta", text),
        *[("message_delta", d) for d in deltas],
        ("message_stop", '{"type":"message_stop"}'),
    )


def message_delta(usage: str) -> str:
    return '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":' + usage + "}"


def test_anthropic_a_later_message_delta_with_zero_counts_lowers_nothing() -> None:
    body = anthropic_events(
        message_delta('{"output_tokens":900}'),
        message_delta(
            '{"input_tokens":0,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,'
            '"output_tokens":0}'
        ),
    )
    r = read("anthropic-messages", body, ANTHROPIC)
    assert (counts(r), r.model) == (ANTHROPIC_CHARGE, "claude-opus-4-5-20251101")


def test_anthropic_usage_or_a_count_given_twice_in_one_event() -> None:
    for delta in (
        message_delta('{"output_tokens":900}')[:-1] + ',"usage":{"output_tokens":0}}',
        message_delta('{"output_tokens":900,"output_tokens":0}'),
        message_delta('{"output_tokens":900,"output_t\\u006fkens":0}'),
    ):
        r = read("anthropic-messages", anthropic_events(delta), ANTHROPIC)
        assert counts(r) == ANTHROPIC_CHARGE, delta
    # message_start's input given twice
    start = (
        '{"type":"message_start","message":{"model":"claude-opus-4-5","usage":'
        + START_USAGE
        + ',"usage":{"input_tokens":0,"output_tokens":0}}}'
    )
    body = raw(
        ("message_start", start),
        ("message_delta", message_delta('{"output_tokens":900}')),
        ("message_stop", '{"type":"message_stop"}'),
    )
    assert counts(read("anthropic-messages", body, ANTHROPIC)) == ANTHROPIC_CHARGE


def test_anthropic_unnamed_events_a_type_given_twice_hides_no_usage() -> None:
    hidden = message_delta('{"output_tokens":900}')[:-1] + ',"type":"ping"}'
    body = raw(
        (None, '{"type":"message_start","message":{"usage":' + START_USAGE + "}}"),
        (None, hidden),
        (None, '{"type":"message_stop"}'),
    )
    assert counts(read("anthropic-messages", body, ANTHROPIC)) == ANTHROPIC_CHARGE


def test_anthropic_a_body_giving_its_usage_twice() -> None:
    usage = (
        '{"input_tokens":50,"cache_read_input_tokens":800,"cache_creation_input_tokens":100,'
        '"output_tokens":900}'
    )
    body = (
        '{"type":"message","model":"claude-opus-4-5","usage":'
        + usage
        + ',"usage":{"input_tokens":0,"output_tokens":0}}'
    ).encode()
    r = read("anthropic-messages", body, {"model": "claude-opus-4-5"}, streaming=False)
    assert counts(r) == ANTHROPIC_CHARGE


def test_anthropic_server_tool_requests_are_their_largest_count() -> None:
    body = anthropic_events(
        message_delta('{"output_tokens":900,"server_tool_use":{"web_search_requests":3}}'),
        message_delta('{"output_tokens":900,"server_tool_use":{"web_search_requests":0}}'),
    )
    assert read("anthropic-messages", body, ANTHROPIC).units == (("web_search", 3),)


def test_anthropic_a_cheaper_model_is_priced_as_requested_unless_a_fallback_was_allowed() -> None:
    body = anthropic_events(message_delta('{"output_tokens":900}'), model="claude-3-haiku-20240307")
    r = read("anthropic-messages", body, ANTHROPIC)
    assert (r.model, counts(r)) == ("claude-opus-4-5", ANTHROPIC_CHARGE)
    assert r.model_note is not None
    # a fallback block to the cheaper model: priced as served only if the request allowed it
    block = (
        '{"type":"content_block_start","index":1,"content_block":{"type":"fallback",'
        '"from":{"model":"claude-opus-4-5"},"to":{"model":"claude-3-haiku-20240307"}}}'
    )
    body = anthropic_events(message_delta('{"output_tokens":900}')).replace(
        b"event: message_delta",
        b"event: content_block_start\ndata: " + block.encode() + b"\n\nevent: message_delta",
    )
    assert read("anthropic-messages", body, ANTHROPIC).model == "claude-opus-4-5"
    allowed = {**ANTHROPIC, "fallbacks": "default"}
    assert read("anthropic-messages", body, allowed).model == "claude-3-haiku-20240307"


# -- Gemini ------------------------------------------------------------------------------
GEMINI_USAGE = '{"promptTokenCount":1000,"cachedContentTokenCount":600,"candidatesTokenCount":300,"thoughtsTokenCount":200,"totalTokenCount":1500}'
GEMINI_CHARGE = (400, 600, 0, 500, 200, "reported")


def gemini_chunk(text: str, usage: str, *, finish: bool = False, extra: str = "") -> str:
    end = ',"finishReason":"STOP"' if finish else ""
    return (
        '{"candidates":[{"content":{"parts":[{"text":"'
        + text
        + '"}],"role":"model"},"index":0'
        + end
        + '}],"usageMetadata":'
        + usage
        + extra
        + ',"modelVersion":"gemini-2.5-pro"}'
    )


def gemini_stream(*chunks: str) -> bytes:
    return b"".join(b"data: " + c.encode() + b"\r\n\r\n" for c in chunks)


def growing(n: int) -> list[str]:
    """Chunks with a cumulative usage below GEMINI_USAGE's (the same prompt and cache)."""
    return [
        gemini_chunk(
            f"w{i}",
            '{"promptTokenCount":1000,"cachedContentTokenCount":600,"candidatesTokenCount":'
            + str(i)
            + "}",
        )
        for i in range(n)
    ]


def test_gemini_a_lower_or_zero_usage_later_lowers_nothing_in_any_batch() -> None:
    zero = '{"promptTokenCount":0,"candidatesTokenCount":0}'
    for tail in (
        [gemini_chunk("end", zero, finish=True)],
        [gemini_chunk("x", zero), *growing(5), gemini_chunk("end", "{}", finish=True)],
    ):
        body = gemini_stream(*growing(4), gemini_chunk("peak", GEMINI_USAGE), *tail)
        r = read("gemini", body, {}, model="gemini-2.5-pro")
        assert counts(r) == GEMINI_CHARGE, tail
        assert counts(read("gemini", body, {}, estimator=PAYLOAD_BYTES)) == GEMINI_CHARGE
    # a lower report in the middle of a long run read at once (the held batch)
    body = gemini_stream(
        *growing(50), gemini_chunk("peak", GEMINI_USAGE), *growing(50), gemini_chunk("e", zero)
    )
    assert counts(read("gemini", body, {})) == GEMINI_CHARGE


def test_gemini_usage_metadata_or_a_count_given_twice_in_one_chunk() -> None:
    zero = '{"promptTokenCount":0,"candidatesTokenCount":0}'
    for chunk in (
        gemini_chunk("a", GEMINI_USAGE, extra=',"usageMetadata":' + zero, finish=True),
        gemini_chunk("a", GEMINI_USAGE, extra=',"usageMet\\u0061data":' + zero, finish=True),
        gemini_chunk("a", GEMINI_USAGE[:-1] + ',"candidatesTokenCount":0}', finish=True),
        gemini_chunk("a", GEMINI_USAGE[:-1] + ',"candidatesT\\u006fkenCount":0}', finish=True),
    ):
        body = gemini_stream(*growing(3), chunk)
        assert counts(read("gemini", body, {})) == GEMINI_CHARGE, chunk
        assert counts(read("gemini", body, {}, estimator=PAYLOAD_BYTES)) == GEMINI_CHARGE


def test_gemini_the_compiled_fold_uses_the_shapes_and_usage_constants() -> None:
    assert (gemini._ABSENT, gemini._MAX_COUNT) == (shapes.ABSENT, usage_module.MAX_TOKENS)


def test_gemini_invalid_counts_in_a_run_are_invalid_usage_whichever_path_reads_them() -> None:
    for usage, reason in (
        (
            '{"promptTokenCount":10,"cachedContentTokenCount":20}',
            "invalid_usage: cachedContentTokenCount (20) exceeds promptTokenCount (10)",
        ),
        ('{"promptTokenCount":-1}', "invalid_usage: promptTokenCount is negative: -1"),
        ('{"promptTokenCount":-7}', "invalid_usage: promptTokenCount is negative: -7"),
        ('{"promptTokenCount":1.5}', "invalid_usage: promptTokenCount is not an integer: 1.5"),
    ):
        body = gemini_stream(*growing(3), gemini_chunk("x", usage), *growing(3))
        r = read("gemini", body, {"generationConfig": {"maxOutputTokens": 50}})
        assert (r.usage_source, r.estimate_reason) == ("estimated", reason), usage


def test_gemini_array_bodies_each_element_is_a_report() -> None:
    zero = '{"promptTokenCount":0,"candidatesTokenCount":0}'
    elements = [gemini_chunk("peak", GEMINI_USAGE), gemini_chunk("end", zero, finish=True)]
    body = ("[" + ",".join(elements) + "]").encode()
    assert counts(read("gemini", body, {}, streaming=False)) == GEMINI_CHARGE
    # too large to parse whole: scanned, every element's usage read as it passes
    filler = gemini_chunk("w" * 60_000, '{"promptTokenCount":1}')
    body = ("[" + ",".join([elements[0], *[filler] * 5, elements[1]]) + "]").encode()
    assert len(body) > ingest.taps.base.WHOLE_PARSE_LIMIT
    tap = open_tap("gemini", {}, streaming=False)
    tap.feed(body)
    assert counts(tap.finish()) == GEMINI_CHARGE
    # and one body whose usage repeats: every reading
    body = gemini_chunk("a", GEMINI_USAGE, extra=',"usageMetadata":' + zero).encode()
    assert counts(read("gemini", body, {}, streaming=False)) == GEMINI_CHARGE


def test_gemini_a_cheaper_model_version_is_priced_at_the_urls_model() -> None:
    body = gemini_stream(
        gemini_chunk("a", GEMINI_USAGE, finish=True).replace(
            "gemini-2.5-pro", "gemini-2.0-flash-lite"
        )
    )
    r = read("gemini", body, {"model": "gemini-2.0-flash-lite"}, model="gemini-2.5-pro")
    assert (r.model, counts(r)) == ("gemini-2.5-pro", GEMINI_CHARGE)
    assert r.model_note is not None


# -- Bedrock -------------------------------------------------------------------------------
BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
BEDROCK_USAGE = (
    '{"inputTokens":50,"outputTokens":900,"cacheReadInputTokens":800,"cacheWriteInputTokens":100}'
)
BEDROCK_ZERO = '{"inputTokens":0,"outputTokens":0}'


def frame(event: str, payload: str) -> bytes:
    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload.encode())


def converse(*metadata: str) -> bytes:
    return b"".join(
        [
            frame("messageStart", '{"role":"assistant"}'),
            frame("contentBlockDelta", '{"contentBlockIndex":0,"delta":{"text":"hi"}}'),
            frame("messageStop", '{"stopReason":"end_turn"}'),
            *[frame("metadata", m) for m in metadata],
        ]
    )


def test_bedrock_converse_a_second_metadata_or_a_repeated_usage_lowers_nothing() -> None:
    for body in (
        converse('{"usage":' + BEDROCK_USAGE + "}", '{"usage":' + BEDROCK_ZERO + "}"),
        converse('{"usage":' + BEDROCK_USAGE + ',"usage":' + BEDROCK_ZERO + "}"),
        converse('{"usage":' + BEDROCK_USAGE[:-1] + ',"outputTokens":0}}'),
    ):
        r = read("bedrock-converse", body, {"messages": []}, model=BEDROCK_MODEL)
        assert (counts(r), r.model) == ((50, 800, 100, 900, 0, "reported"), BEDROCK_MODEL)
    body = ('{"output":{},"usage":' + BEDROCK_USAGE + ',"usage":' + BEDROCK_ZERO + "}").encode()
    r = read("bedrock-converse", body, {"messages": []}, streaming=False, model=BEDROCK_MODEL)
    assert counts(r) == (50, 800, 100, 900, 0, "reported")


def chunk(event: str, *, twice: str | None = None) -> bytes:
    encoded = base64.b64encode(event.encode()).decode()
    payload = '{"bytes":"' + encoded + '"'
    if twice is not None:  # a second "bytes" in the same chunk
        payload += ',"bytes":"' + base64.b64encode(twice.encode()).decode() + '"'
    return frame("chunk", payload + ',"p":"abc"}')


def test_bedrock_invoke_a_chunk_giving_bytes_twice_or_a_later_zero() -> None:
    start = '{"type":"message_start","message":{"usage":' + START_USAGE + "}}"
    real = message_delta('{"output_tokens":900}')
    zero = message_delta('{"output_tokens":0}')
    stop = '{"type":"message_stop"}'
    for frames in (
        [chunk(start), chunk(real, twice=zero), chunk(stop)],
        [chunk(start), chunk(real), chunk(zero), chunk(stop)],
        [chunk(start), chunk(real[:-1] + ',"usage":{"output_tokens":0}}'), chunk(stop)],
        [chunk(start), chunk(real[:-1] + ',"type":"ping"}'), chunk(stop)],
    ):
        r = read("bedrock-invoke", b"".join(frames), {"max_tokens": 1024}, model=BEDROCK_MODEL)
        assert (counts(r), r.model) == (ANTHROPIC_CHARGE, BEDROCK_MODEL)


# -- Realtime ------------------------------------------------------------------------------
def test_realtime_a_repeated_usage_and_a_cheaper_session_model() -> None:
    tap = open_realtime_tap(model="gpt-realtime")
    tap.feed_message(json.dumps({"type": "session.created", "session": {"model": "gpt-4o-mini"}}))
    tap.feed_message('{"type":"response.created","response":{"id":"r1"}}')
    done = (
        '{"type":"response.done","response":{"id":"r1","status":"completed","usage":'
        '{"input_tokens":100,"output_tokens":50},"usage":{"input_tokens":0,"output_tokens":0}}}'
    )
    [result] = tap.feed_message(done)
    assert (result.model, result.input_tokens, result.output_tokens) == ("gpt-realtime", 100, 50)
    assert result.usage_source == "reported"

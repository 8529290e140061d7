"""Bad input gets a clear outcome, never a crash, in bounded memory; fuzzing."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.taps import FORMATS, TapResult, open_tap
from tests.ingest.taps.taps_support import GOLDEN, expected, response_bytes, run

MiB = 1 << 20


def feed(fmt: str, chunks: Iterable[bytes], *, cut: str | None = None, **kwargs: Any) -> TapResult:
    tap = open_tap(fmt, kwargs.pop("request", {"model": "m", "max_tokens": 100}), **kwargs)
    for chunk in chunks:
        tap.feed(chunk)
    return tap.finish(cut=cut)


def chat_usage(usage: Any) -> bytes:
    return (
        "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\ndata: [DONE]\n\n"
    ).encode()


# -- malformed structure -----------------------------------------------------------
def test_malformed_json_in_a_usage_event() -> None:
    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"usage": {"output_tokens": 9\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    result = feed("anthropic-messages", [body], streaming=True)
    assert result.usage_source == "estimated"
    assert result.estimate_reason == "unreadable: malformed JSON (Expecting ',' delimiter)"
    assert result.input_tokens == 5


def test_malformed_sse_lines_are_ignored_not_fatal() -> None:
    body = b"garbage line without colon\nevent\n:comment\n\ndata: [DONE]\n\n" + chat_usage(
        {"prompt_tokens": 2, "completion_tokens": 3}
    )
    result = feed("openai-chat", [body], streaming=True)
    assert (result.usage_source, result.input_tokens, result.output_tokens) == ("reported", 2, 3)


def test_invalid_utf8_in_the_usage_event() -> None:
    body = b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3},"x":"\xff"}\n\n'
    result = feed("openai-chat", [body], streaming=True)
    assert result.estimate_reason == "unreadable: invalid UTF-8 in JSON"


def test_invalid_utf8_in_a_skipped_event_does_not_matter() -> None:
    body = (
        b"event: ping\ndata: \xff\xfe\n\n"
        b'event: message_start\ndata: {"message":{"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"usage":{"output_tokens":9}}\n\n'
        b"event: message_stop\ndata: {}\n\n"
    )
    assert feed("anthropic-messages", [body], streaming=True).usage_source == "reported"


def test_truncated_event_stream_message_on_a_normal_end() -> None:
    from ingest.taps.eventstream import encode_message

    frame = encode_message(
        {":message-type": "event", ":event-type": "metadata"},
        b'{"usage":{"inputTokens":1,"outputTokens":2}}',
    )
    result = feed("bedrock-converse", [frame[:-5]], streaming=True)
    assert result.estimate_reason == "unreadable: the event stream ends inside a message"
    assert (
        feed("bedrock-converse", [frame[:-5]], streaming=True, cut="upstream_cut").estimate_reason
        == "upstream_cut"
    )


def test_corrupt_gzip_charges_the_output_cap() -> None:
    result = feed(
        "openai-chat", [b"\x1f\x8b\x08\x00" + b"\x00" * 40], streaming=True, content_encoding="gzip"
    )
    assert result.estimate_reason is not None
    assert result.estimate_reason.startswith("unreadable: gzip: ")
    assert result.output_tokens == 100


def test_unsupported_encoding() -> None:
    result = feed("gemini", [b"whatever"], content_encoding="compress", streaming=True)
    assert result.estimate_reason == "unreadable: unsupported content-encoding compress"


def test_a_json_body_that_is_not_an_object() -> None:
    result = feed("openai-chat", [b'"hello"'], streaming=False)
    assert result.estimate_reason == "unreadable: the body is not a JSON object or array"


# -- token counts --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("usage", "reason"),
    [
        ({"prompt_tokens": "12", "completion_tokens": 3}, 'prompt_tokens is not an integer: "12"'),
        ({"prompt_tokens": -5, "completion_tokens": 3}, "prompt_tokens is negative: -5"),
        ({"prompt_tokens": 1.5, "completion_tokens": 3}, "prompt_tokens is not an integer: 1.5"),
        ({"prompt_tokens": True, "completion_tokens": 3}, "prompt_tokens is not an integer: true"),
        ({"prompt_tokens": 5}, "completion_tokens is missing"),
        (
            {"prompt_tokens": 1e30, "completion_tokens": 3},
            "prompt_tokens is implausibly large: 1e+30",
        ),
        (
            {"prompt_tokens": 10**12, "completion_tokens": 3},
            "prompt_tokens is implausibly large: 1000000000000",
        ),
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 3,
                "completion_tokens_details": {"reasoning_tokens": 4},
            },
            "reasoning_tokens (4) exceeds completion_tokens (3)",
        ),
        ([1, 2], "usage is not an object"),
        ("lots", "usage is not an object"),
    ],
)
def test_bad_token_counts_are_estimated_with_the_reason(usage: Any, reason: str) -> None:
    result = feed("openai-chat", [chat_usage(usage)], streaming=True)
    assert result.usage_source == "estimated"
    assert result.estimate_reason == f"invalid_usage: {reason}"


def test_integral_floats_are_accepted() -> None:
    result = feed(
        "openai-chat", [chat_usage({"prompt_tokens": 12.0, "completion_tokens": 3})], streaming=True
    )
    assert (result.usage_source, result.input_tokens) == ("reported", 12)


def test_nan_and_infinity_are_rejected() -> None:
    body = b'data: {"choices":[],"usage":{"prompt_tokens":NaN,"completion_tokens":Infinity}}\n\n'
    result = feed("openai-chat", [body], streaming=True)
    assert result.estimate_reason == "invalid_usage: prompt_tokens is not an integer: NaN"


# -- nesting -----------------------------------------------------------------------------
def test_deeply_nested_json_body_small_and_large() -> None:
    small = b"[" * 100_000 + b"]" * 100_000
    result = feed("anthropic-messages", [small], streaming=False)
    assert result.estimate_reason in (
        "unreadable: JSON nested too deeply",
        "unreadable: JSON nested deeper than 256 levels",
    )
    large = b'{"a":' + b"[" * 400_000
    result = feed("anthropic-messages", [large], streaming=False)
    assert result.estimate_reason == "unreadable: JSON nested deeper than 256 levels"


def test_deeply_nested_json_in_an_event() -> None:
    body = b"data: " + b"[" * 50_000 + b"\n\n"
    result = feed("gemini", [body], streaming=True)
    assert result.estimate_reason == "unreadable: JSON nested too deeply"


# -- size and memory -------------------------------------------------------------------
def peak_while(fn: Callable[[], TapResult]) -> tuple[TapResult, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return result, peak


def repeat(chunk: bytes, total: int) -> Iterable[bytes]:
    for _ in range(total // len(chunk)):
        yield chunk


def test_100_mib_json_body_is_read_by_structure_in_bounded_memory() -> None:
    chunk = b"x" * (64 * 1024)
    head = b'{"id":"msg_1","type":"message","model":"claude-x","content":[{"type":"text","text":"'
    tail = b'"}],"usage":{"input_tokens":7,"output_tokens":25000000}}'

    def body() -> Iterable[bytes]:
        yield head
        yield from repeat(chunk, 100 * MiB)
        yield tail

    result, peak = peak_while(lambda: feed("anthropic-messages", body(), streaming=False))
    assert (result.usage_source, result.input_tokens, result.output_tokens) == (
        "reported",
        7,
        25_000_000,
    )
    assert peak < MiB, peak


def test_100_mib_sse_without_event_boundaries_in_bounded_memory() -> None:
    chunk = b"data: " + b"y" * (64 * 1024 - 6)
    result, peak = peak_while(lambda: feed("openai-chat", repeat(chunk, 100 * MiB), streaming=True))
    assert result.usage_source == "estimated"
    assert result.output_tokens == 100  # capped at the request's max_tokens
    assert peak < MiB, peak


def test_long_valid_stream_in_bounded_memory() -> None:
    delta = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"' + b"word " * 40 + b'"}}\n\n'
    ) * 16
    start = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"c",'
        b'"usage":{"input_tokens":3,"output_tokens":1}}}\n\n'
    )
    end = (
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":777}}'
        b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
    )

    def body() -> Iterable[bytes]:
        yield start
        yield from repeat(delta, 2 * MiB)
        yield end

    result, peak = peak_while(lambda: feed("anthropic-messages", body(), streaming=True))
    assert (result.usage_source, result.output_tokens) == ("reported", 777)
    assert peak < MiB, peak


def test_gzip_bomb_in_bounded_memory() -> None:
    bomb = gzip.compress(b"data: " + b"z" * (20 * MiB))
    result, peak = peak_while(
        lambda: feed(
            "gemini",
            [bomb[i : i + 65536] for i in range(0, len(bomb), 65536)],
            streaming=True,
            content_encoding="gzip",
        )
    )
    assert result.usage_source == "estimated"
    assert peak < 2 * MiB, peak


# -- fuzzing -----------------------------------------------------------------------------
MODES = [
    {"streaming": True},
    {"streaming": False},
    {"streaming": None},
    {"streaming": True, "content_encoding": "gzip"},
    {"status": 500},
]


def check(result: TapResult, status: int | None = None) -> None:
    assert isinstance(result, TapResult)
    if status is None:
        assert result.usage_source in ("reported", "estimated")
        if result.usage_source == "estimated":
            assert result.estimate_reason
            assert result.total_tokens > 0  # a metered 2xx is never free


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    mode=st.sampled_from(MODES),
    chunks=st.lists(st.binary(max_size=64), max_size=8),
    cut=st.sampled_from([None, "client_disconnected", "upstream_cut"]),
)
def test_fuzz_random_bytes(
    fmt: str, mode: dict[str, Any], chunks: list[bytes], cut: str | None
) -> None:
    check(feed(fmt, chunks, cut=cut, **mode), mode.get("status"))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_captures(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(GOLDEN), label="case")
    raw = bytearray(response_bytes(case))
    for _ in range(data.draw(st.integers(1, 6), label="mutations")):
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)), label="pos")
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]), label="op")
        if not raw:
            break
        if op == "flip":
            raw[pos] ^= data.draw(st.integers(1, 255), label="bits")
        elif op == "delete":
            del raw[pos : pos + data.draw(st.integers(1, 50), label="n")]
        elif op == "insert":
            raw[pos:pos] = data.draw(
                st.sampled_from(
                    [b"\n\n", b"\r", b'"', b"{", b"]", b"\\", b"data: ", b"\xff", b"\x00" * 12]
                ),
                label="ins",
            )
        else:
            del raw[pos:]
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=5), label="cuts")
    bounds = [0, *sorted(set(cuts)), len(raw)]
    chunks = [bytes(raw[a:b]) for a, b in itertools.pairwise(bounds)]
    result = run(case, chunks)
    check(result, case.get("status"))
    if expected(case)["usage_source"] == "none":
        assert result.usage_source in ("none", "reported")


def test_counts_read_before_a_fatal_decode_error_are_kept() -> None:
    start = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"c",'
        b'"usage":{"input_tokens":321,"cache_read_input_tokens":7,"output_tokens":1}}}\n\n'
    )
    filler = b"".join(
        b'event: ping\ndata: {"p":"' + random.Random(i).randbytes(64).hex().encode() + b'"}\n\n'
        for i in range(200)
    )
    good = gzip.compress(start + filler)
    assert len(good) > 12_000
    bad = good[:12_000] + bytes(b ^ 0x55 for b in good[12_000:])
    for chunks in ([bad], [bad[i : i + 1000] for i in range(0, len(bad), 1000)]):
        result = feed("anthropic-messages", chunks, streaming=True, content_encoding="gzip")
        assert result.estimate_reason is not None
        assert (result.input_tokens, result.cache_read_tokens) == (321, 7)
    assert result.estimate_reason is not None
    assert result.estimate_reason.startswith("unreadable: gzip")
    assert (result.input_tokens, result.cache_read_tokens, result.output_tokens) == (321, 7, 100)

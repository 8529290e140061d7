"""The shortcuts of the hot path read exactly what the general path reads.

- ``SSEParser.feed`` takes a chunk holding exactly one event without the general machinery;
- each provider decodes its common delta event into a narrow shape (``read_shape``).

Each is compared with the general path on generated and hostile input, fed one event per
chunk (the shortcut), whole, and split anywhere (mid-line, mid-UTF-8, mid-frame). The third
shortcut, ``loads`` (msgspec first, json's verdict on anything else), is held to json in
test_fastpaths_json.py.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ingest.taps.base
from ingest.taps import EstimatorConfig, open_tap
from ingest.taps.base import read_shape, shape_decoder
from ingest.taps.eventstream import encode_message
from ingest.taps.shapes import GeminiChunk
from ingest.taps.sse import SSEParser

# -- SSE: one event per chunk ------------------------------------------------------------


def sse_events(chunks: list[bytes], *, limit: int = 1 << 20) -> list[tuple[bytes, bytes]]:
    events: list[tuple[bytes, bytes]] = []
    parser = SSEParser(lambda n, d: events.append((n, d)), lambda n: pytest.fail(), limit=limit)
    for chunk in chunks:
        parser.feed(chunk)
    parser.close(complete=True)
    return events


def batching_parser(out: list[tuple[bytes, bytes]]) -> SSEParser:
    """A parser whose events, one by one or in batches, all land in ``out`` in order."""
    return SSEParser(
        lambda n, d: out.append((n, d)),
        lambda n: pytest.fail(),
        limit=1 << 20,
        on_events=out.extend,
        on_datas=lambda datas: out.extend((b"", data) for data in datas),
    )


FIELD_TEXT = st.binary(max_size=12).filter(lambda b: b"\n" not in b and b"\r" not in b)
LINE_END = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def one_event_chunks(draw: st.DrawFn) -> bytes:
    """Chunks shaped like one event: the fast path's shapes and near misses of them."""
    lines = []
    if draw(st.booleans()):
        lines.append(b"event:" + draw(st.sampled_from([b"", b" ", b"  "])) + draw(FIELD_TEXT))
    for _ in range(draw(st.integers(0, 2))):
        lines.append(b"data:" + draw(st.sampled_from([b"", b" ", b"  "])) + draw(FIELD_TEXT))
    if draw(st.booleans()):
        lines.insert(
            draw(st.integers(0, len(lines))),
            draw(st.sampled_from([b": comment", b"id: 7", b"data", b"event", b"retry: 1"])),
        )
    ends = [draw(LINE_END) for _ in range(len(lines) + 1)]
    return b"".join(line + end for line, end in zip([*lines, b""], ends, strict=True))


@settings(max_examples=400, deadline=None)
@given(st.lists(one_event_chunks(), max_size=8), st.sampled_from([1 << 20, 16]))
def test_one_event_per_chunk_reads_what_the_whole_stream_reads(
    chunks: list[bytes], limit: int
) -> None:
    whole = b"".join(chunks)
    want = sse_events([whole], limit=limit) if limit > 16 else None
    if limit > 16:
        assert sse_events(chunks, limit=limit) == want
        assert sse_events([bytes([b]) for b in whole], limit=limit) == want
    else:  # small limit: large events are streamed to a sink, in both ways alike
        got: list[list[Any]] = []
        for feed in (chunks, [whole]):
            events: list[Any] = []
            parser = SSEParser(_Collect(events).event, _Collect(events), limit=limit)
            for chunk in feed:
                parser.feed(chunk)
            parser.close(complete=True)
            got.append(events)
        assert got[0] == got[1]


class _Collect:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def __call__(self, name: bytes) -> _Collect:
        self.events.append(("LARGE", name))
        return self

    def event(self, name: bytes, data: bytes) -> None:
        self.events.append((name, data))

    def feed(self, data: bytes) -> None:
        self.events.append(("PART", data))

    def close(self, name: bytes, ended: bool) -> None:
        self.events.append(("END", name, ended))


def test_the_shapes_the_fast_path_takes() -> None:
    assert sse_events([b"data: x\n\n"]) == [(b"", b"x")]
    assert sse_events([b"data:x\r\n\r\n"]) == [(b"", b"x")]
    assert sse_events([b"event: e\ndata:  y\n\n"]) == [(b"e", b" y")]
    assert sse_events([b"event:\ndata:\n\n"]) == [(b"", b"")]
    # near misses go the general way and still read right
    assert sse_events([b"data: a\nb\r\n\r\n"]) == [(b"", b"a")]
    assert sse_events([b"data: a\r\r\n\r\n"]) == [(b"", b"a")]
    assert sse_events([b"\xef\xbb\xbfdata: x\n\n"]) == [(b"", b"x")]
    # a BOM counts only at the very start: later it is part of a field name ("\ufeffdata")
    assert sse_events([b"data: x\n\n", b"\xef\xbb\xbfdata: y\n\n"]) == [(b"", b"x")]


@pytest.mark.parametrize(
    "chunks",
    [
        [b"\xef", b"\xbb\xbfdata: x\n\n"],
        [b"\xef\xbb", b"\xbfdata: x\n\n"],
        [b"\xef", b"\xbb", b"\xbf", b"data: x\n\n"],
        [b"\xef\xbb", b"\xbfdata: x\r\n\r\n"],
    ],
)
def test_a_bom_split_across_chunks_is_skipped_as_a_whole_one_is(chunks: list[bytes]) -> None:
    assert sse_events(chunks) == [(b"", b"x")]


def test_bytes_that_only_began_like_a_bom_are_kept() -> None:
    # not a BOM after all: the bytes are the start of the stream's first line, as unsplit
    assert sse_events([b"\xef", b"data: x\n\n"]) == sse_events([b"\xefdata: x\n\n"])
    assert sse_events([b"\xef\xbb", b"\n\ndata: y\n\n"]) == [(b"", b"y")]


# -- provider shapes: the narrow decode and the general one give the same tap --------------


def without_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The general path: every chunk read as it comes (nothing held), every event framed
    and parsed on its own (no batches from the SSE parser or the event-stream decoder), no
    narrow shapes. A switch the taps read at run time (their modules are compiled, so
    patching their functions would not reach the calls between them)."""
    monkeypatch.setattr(ingest.taps.base.SHORTCUTS, "enabled", False)


def run(fmt: str, chunks: list[bytes]) -> tuple[Any, ...]:
    tap = open_tap(fmt, {"max_tokens": 64000}, streaming=True, estimator=EstimatorConfig())
    for chunk in chunks:
        tap.feed(chunk)
    result = tap.finish()
    h = tap.handler
    return (result, h.delta_events, h.text_chars, h.reasoning_chars, tuple(h.problems))


def sse(name: str | None, data: bytes) -> bytes:
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + data + b"\n\n"


def frame(event: str, payload: bytes) -> bytes:
    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload)


HOSTILE_TEXT = [
    "plain",
    "",
    'fake "usage": {"output_tokens": 1}',
    '\n\nevent: message_delta\ndata: {"usage":{"output_tokens":1}}\n\n',
    'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]',
    '"delta":{"text":"x"}, "text": 123',
    "héllo 漢字 😀",  # raw UTF-8: decoded strictly before the shape; splits inside characters
    "[" * 700,
]

# the delta events of each format: common ones, near misses, hostile and malformed ones
DELTAS: dict[str, list[bytes]] = {
    "anthropic-messages": [
        *(
            json.dumps(
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": t}},
                ensure_ascii=False,
            ).encode()
            for t in HOSTILE_TEXT
        ),
        b'{"delta":{"type":"thinking_delta","thinking":"hmm"}}',
        b'{"delta":{"type":"input_json_delta","partial_json":"{\\"a\\":"}}',
        b'{"delta":{"text":5}}',
        b'{"delta":{"text":"a"},"delta":{"text":"bbb"}}',
        b'{"delta":{"text":"a"},"x":"\xff"}',
        b'{"delta":{"text":"a"},"x":"\xed\xa0\x80"}',  # an encoded surrogate: not UTF-8
        b'{"delta":{"text":"caf\xc3\xa9 \xe6\xbc"}}',  # text cut inside a character
        b'{"delta":{"text":"a"},"x":' + b"[" * 600 + b"]" * 600 + b"}",
        b'{"delta":{"text":"a"},"x":NaN}',
        b'{"delta":{"text":"a"}',
        b'{"delta":null}',
    ],
    "openai-chat": [
        *(
            json.dumps(
                {"model": "m", "choices": [{"index": 0, "delta": {"content": t}}], "usage": None},
                ensure_ascii=False,
            ).encode()
            for t in HOSTILE_TEXT
        ),
        b'{"choices":[{"delta":{"content":null,"reasoning_content":"think"}}]}',
        b'{"choices":[{"delta":{"reasoning":"r","refusal":"no","role":"assistant"}}]}',
        b'{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}',
        b'{"choices":[{"delta":{"audio":{"transcript":"hi"}}}]}',
        b'{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}',
        b'{"choices":[{"delta":{"content":"a"}}],"error":{"message":"boom"}}',
        b'{"choices":[{"delta":{"content":"a"}}],"error":""}',
        b'{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}',
        b'{"choices":[{"delta":{"content":"a"}}],"x":"\xff"}',
        b'{"choices":[{"delta":{"content":1}}]}',
        b'{"choices":[{"finish_reason":"stop"}]}',
        # usage the upstream repeats (issue 32)
        b'{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":9,"completion_tokens":99},"usage":null}',
        b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":77},"us\u0061ge":{"prompt_tokens":0,"completion_tokens":0}}',
    ],
    "gemini": [
        *(
            json.dumps(
                {
                    "candidates": [{"content": {"parts": [{"text": t}], "role": "model"}}],
                    "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 3},
                    "modelVersion": "gemini-2.5",
                },
                ensure_ascii=False,
            ).encode()
            for t in HOSTILE_TEXT
        ),
        b'{"candidates":[{"content":{"parts":[{"text":"why","thought":true},{"text":"so"}]}}]}',
        b'{"candidates":[{"content":{"parts":[{"text":"a","thought":"yes"}]}}]}',
        b'{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"a":1}}}]}}]}',
        b'{"candidates":[{"content":{"parts":[{"executableCode":{"code":"print(1)"}}]}}]}',
        b'{"candidates":[{"content":{"parts":["text"]}}]}',
        b'{"candidates":[{"content":"text"}],"modelVersion":7}',
        b'{"candidates":[{"finishReason":""},{"finishReason":"STOP"}]}',
        b'{"candidates":[],"usageMetadata":{"promptTokenCount":12345678901234567890123}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"error":{"code":500}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"x":"\xff"}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"responseId":"\xff"}',
        b'{"usageMetadata":null,"candidates":null}',
        # usage the upstream repeats (issue 32): the shape keeps the last, the bytes tell
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":90},"usageMetadata":{"promptTokenCount":9}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":95,"candidatesTokenCount":0}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":9,"thoughtsTokenCount":7,"th\u006fughtsTokenCount":0}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":70,"cachedContentTokenCount":60,"toolUsePromptTokenCount":5}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":1,"cachedContentTokenCount":2}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":-1}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":-3}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":3.0,"totalTokenCount":3}}',
        b'{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"candidatesTokenCount":99999999999}}',
        b'{"candidates":[{"content":{"parts":[{"text":""promptTokenCount": 5 TokenCount""}]}}],"usageMetadata":{"promptTokenCount":9}}',
    ],
    "openai-responses": [
        *(
            json.dumps(
                {"type": "response.output_text.delta", "delta": t}, ensure_ascii=False
            ).encode()
            for t in HOSTILE_TEXT
        ),
        b'{"type":"response.output_text.delta","delta":7}',
        b'{"type":"response.output_text.delta","delta":"a","x":"\xff"}',
        b'{"type":"response.output_text.delta"}',
        b"not json",
    ],
    "bedrock-converse": [
        *(
            json.dumps({"delta": {"text": t}, "p": "abc"}, ensure_ascii=False).encode()
            for t in HOSTILE_TEXT
        ),
        b'{"delta":{"toolUse":{"input":"{\\"a\\":1}"}}}',
        b'{"delta":{"reasoningContent":{"text":"think"}}}',
        b'{"delta":{"text":"a"},"x":"\xff"}',
        b'{"delta":{"text":null}}',
        b"{",
    ],
}


def stream(fmt: str, deltas: list[bytes]) -> list[bytes]:
    """A whole response around ``deltas``, one event (or frame) per chunk."""
    if fmt == "anthropic-messages":
        start = b'{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":9,"output_tokens":1}}}'
        return [
            sse("message_start", start),
            *(sse("content_block_delta", d) for d in deltas),
            sse("message_delta", b'{"type":"message_delta","usage":{"output_tokens":42}}'),
            sse("message_stop", b'{"type":"message_stop"}'),
        ]
    if fmt == "openai-chat":
        return [
            sse(None, b'{"model":"gpt","choices":[{"delta":{"role":"assistant"}}]}'),
            *(sse(None, d) for d in deltas),
            sse(None, b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":42}}'),
            sse(None, b"[DONE]"),
        ]
    if fmt == "gemini":
        end = b'{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":42}}'
        return [*(sse(None, d) for d in deltas), sse(None, end)]
    if fmt == "openai-responses":
        done = b'{"type":"response.completed","response":{"model":"gpt","usage":{"input_tokens":9,"output_tokens":42}}}'
        return [
            *(sse("response.output_text.delta", d) for d in deltas),
            sse("response.reasoning_text.delta", b'{"delta":"why"}'),
            sse("response.completed", done),
        ]
    return [
        *(frame("contentBlockDelta", d) for d in deltas),
        frame("messageStop", b'{"stopReason":"end_turn"}'),
        frame("metadata", b'{"usage":{"inputTokens":9,"outputTokens":42}}'),
    ]


@pytest.mark.parametrize("fmt", sorted(DELTAS))
def test_every_delta_reads_the_same_with_and_without_the_shape(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for delta in DELTAS[fmt]:
        chunks = stream(fmt, [delta])
        fast = run(fmt, chunks)
        with monkeypatch.context() as m:
            without_shapes(m)
            general = run(fmt, chunks)
        assert fast == general, delta


@pytest.mark.parametrize("fmt", sorted(DELTAS))
def test_model_text_cannot_change_the_charge(fmt: str) -> None:
    """Hostile text in the common delta (the shortcut) is counted as text, never as usage."""
    deltas = DELTAS[fmt][: len(HOSTILE_TEXT)]
    result, _, chars, _, problems = run(fmt, stream(fmt, deltas))
    assert result.usage_source == "reported", result
    assert (result.input_tokens, result.output_tokens) == (9, 42)
    assert problems == ()
    assert chars >= sum(len(t) for t in HOSTILE_TEXT)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_split_anywhere_reads_what_one_event_per_chunk_reads(data: st.DataObject) -> None:
    """Mid-line, mid-UTF-8 (the non-ASCII deltas), mid-frame: the same tap."""
    fmt = data.draw(st.sampled_from(sorted(DELTAS)))
    deltas = data.draw(st.lists(st.sampled_from(DELTAS[fmt]), min_size=1, max_size=5))
    chunks = stream(fmt, deltas)
    whole = b"".join(chunks)
    cuts = data.draw(st.lists(st.integers(0, len(whole)), max_size=8))
    bounds = [0, *sorted(cuts), len(whole)]
    split = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(fmt, split) == run(fmt, chunks)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_held_runs_of_events_read_what_the_general_path_reads(data: st.DataObject) -> None:
    """Many events held and read together (runs of the common delta read by one map of the
    shape, the others in their place, a failing run halved down to the event that failed)
    give what reading each chunk, each event and each delta on its own gives."""
    fmt = data.draw(st.sampled_from(sorted(DELTAS)))
    common = DELTAS[fmt][:1]
    deltas = data.draw(st.lists(st.sampled_from(DELTAS[fmt] + common * 6), max_size=40))
    chunks = stream(fmt, deltas)
    whole = b"".join(chunks)
    cuts = data.draw(st.lists(st.integers(0, len(whole)), max_size=6))
    bounds = [0, *sorted(cuts), len(whole)]
    split = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    with pytest.MonkeyPatch.context() as m:
        without_shapes(m)
        general = run(fmt, chunks)
    assert run(fmt, chunks) == general
    assert run(fmt, split) == general


@pytest.mark.parametrize("fmt", sorted(DELTAS))
def test_one_odd_delta_inside_a_long_run_is_read_in_its_place(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = DELTAS[fmt][0]
    for odd in DELTAS[fmt]:
        for at in (0, 37, 99):
            deltas = [common] * 100
            deltas[at] = odd
            chunks = stream(fmt, deltas)
            fast = run(fmt, chunks)
            with monkeypatch.context() as m:
                without_shapes(m)
                general = run(fmt, chunks)
            assert fast == general, (odd, at)


@settings(max_examples=300, deadline=None)
@given(st.lists(one_event_chunks(), max_size=12), st.data())
def test_simple_events_read_at_once_are_the_events_read_one_by_one(
    chunks: list[bytes], data: st.DataObject
) -> None:
    """The SSE parser's batch path (one findall reads a run of whole simple events, taken
    only when they tile it) hands over the events the general path finds, in order."""
    whole = b"".join(chunks)
    cuts = data.draw(st.lists(st.integers(0, len(whole)), max_size=4))
    bounds = [0, *sorted(cuts), len(whole)]
    batched: list[tuple[bytes, bytes]] = []
    parser = batching_parser(batched)
    for a, b in itertools.pairwise(bounds):
        parser.feed(whole[a:b])
    parser.close(complete=True)
    assert batched == sse_events([bytes([b]) for b in whole])


def test_a_chunk_the_proxy_reuses_is_read_as_it_was_fed() -> None:
    """Held chunks that are not bytes are copied: the proxy may overwrite its buffer."""
    events = stream("anthropic-messages", [DELTAS["anthropic-messages"][0]] * 3)
    want = run("anthropic-messages", events)
    tap = open_tap(
        "anthropic-messages", {"max_tokens": 64000}, streaming=True, estimator=EstimatorConfig()
    )
    buffer = bytearray(max(map(len, events)))
    for event in events:
        view = memoryview(buffer)[: len(event)]
        view[:] = event
        tap.feed(view)
        view[:] = b"x" * len(event)
    h = tap.handler
    got = (tap.finish(), h.delta_events, h.text_chars, h.reasoning_chars, tuple(h.problems))
    assert got == want


@pytest.mark.parametrize(
    "stream_bytes",
    [
        b"data: a\n\nid: 5\ndata: b\n\n",  # a field the batch path does not read
        b"data: a\n\n: comment\ndata: b\n\n",
        b"event: x\ndata: b\ndata: c\n\n",  # two data lines: joined with LF
        b"data: a\n\nevent: x\nevent: y\ndata: b\n\n",  # the last name wins
        b"event: \ndata: x\n\n",  # an empty name
        b"event:x\ndata:y\n\n",  # no space after the colon
        b"data:  two spaces\n\n",
        b"data: a\n\n\ndata: b\n\n",  # an extra blank line
        b"garbage\ndata: a\n\n",
        b"data: a\n\ndata: b\n",  # the last event not ended yet
        b"data: a\r\n\r\ndata: b\r\n\r\n",  # CRLF (Gemini)
        b"event: e\r\ndata: a\r\n\r\n",
        b"data: a\rb\r\n\r\n",  # a lone CR ends a line
        b"event: e\rx\r\ndata: a\r\n\r\n",
        b"data: a\r\r\n\r\n",
        b"data: a\r\n\r\n\r\n",
        b"data: a\r\n\r\nid: 1\r\ndata: b\r\n\r\n",
        b"\xef\xbb\xbfdata: a\r\n\r\n",
        b"data: a\n\r\n",
        b"data: a\n\ndata:b\n\n",
        b"data: a\n\ndata: b\nid: 1\n\n",
        b"data: a\n\nevent: x\ndata: b\n\n",
        b"data: a\rb\n\n",
        b"data: a\r\n\r\ndata: b\nc\r\n\r\n",
        b"data: \n\ndata: \n\n",
    ],
)
def test_near_misses_of_the_batch_shape_read_as_the_general_path_reads(
    stream_bytes: bytes,
) -> None:
    batched: list[tuple[bytes, bytes]] = []
    parser = batching_parser(batched)
    parser.feed(stream_bytes)
    parser.close(complete=True)
    assert batched == sse_events([stream_bytes])


def test_messages_before_a_corrupt_one_are_read_when_read_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bedrock messages verified before a CRC mismatch are read (here: an exception after
    the 200) whether the decoder hands them over one by one or together."""
    error = encode_message(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"slow down"}',
    )
    corrupt = bytearray(frame("contentBlockDelta", DELTAS["bedrock-converse"][0]))
    corrupt[-1] ^= 0xFF
    chunks = [frame("contentBlockDelta", DELTAS["bedrock-converse"][0]), error, bytes(corrupt)]
    fast = run("bedrock-converse", [b"".join(chunks)])
    with monkeypatch.context() as m:
        without_shapes(m)
        general = run("bedrock-converse", chunks)
    assert fast == general
    assert fast[0].upstream_error == "throttlingException: slow down"
    assert fast[0].estimate_reason == "unreadable: event-stream message CRC mismatch"


def test_switched_off_the_shortcuts_are_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparisons above hold only if the general path takes no shortcut: nothing is
    held, the SSE parser hands no batches over, no event is decoded into a shape."""
    chunks = stream("gemini", [DELTAS["gemini"][0]] * 3)
    decode = shape_decoder(GeminiChunk)

    def fed_one() -> tuple[int, bool, bool]:
        tap = open_tap("gemini", {"max_tokens": 64000}, streaming=True)
        tap.feed(chunks[0])
        batches = tap._sse is not None and tap._sse.on_datas is not None
        return tap.handler.delta_events, batches, read_shape(decode, b"{}") is not None

    assert fed_one() == (0, True, True)  # held, batched, shaped
    with monkeypatch.context() as m:
        without_shapes(m)
        assert fed_one() == (1, False, False)


@pytest.mark.parametrize("fmt", ["gemini", "openai-chat"])
def test_crlf_runs_read_what_the_general_path_reads(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemini ends its lines with CRLF: held runs of them are split at once too."""
    common = DELTAS[fmt][0]
    for odd in DELTAS[fmt]:
        deltas = [common] * 40
        deltas[17] = odd
        chunks = [c.replace(b"\n", b"\r\n") for c in stream(fmt, deltas)]
        fast = run(fmt, chunks)
        with monkeypatch.context() as m:
            without_shapes(m)
            general = run(fmt, chunks)
        assert fast == general, odd
        assert run(fmt, [b"".join(chunks)]) == general, odd

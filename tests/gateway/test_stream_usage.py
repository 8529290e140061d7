"""The client's copy of a chat stream the gateway asked usage for (stream_usage.py):
the usage chunk dropped, ``"usage": null`` removed, read structurally, split anywhere."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.gateway.stream_usage import MAX_HELD_EVENT, HiddenUsage, asking_for_usage, hidden_usage

ASKED = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":""}}],"usage":null}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"say \\"usage\\":null"}}],'
    b'"usage":null,"obfuscation":"ab"}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"usage":null}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)
#: what the same provider answers without include_usage
PLAIN = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":""}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"say \\"usage\\":null"}}],'
    b'"obfuscation":"ab"}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def relay(chunks: list[bytes], encoding: str | None = None) -> bytes:
    hidden = HiddenUsage(encoding)
    return b"".join(hidden.feed(c) for c in chunks) + hidden.finish()


def test_the_client_gets_the_stream_it_would_have_had() -> None:
    assert relay([ASKED]) == PLAIN
    assert relay([ASKED[i : i + 1] for i in range(len(ASKED))]) == PLAIN


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(ASKED)), max_size=12))
def test_split_anywhere_the_same(points: list[int]) -> None:
    cuts = sorted(set(points))
    chunks = [ASKED[a:b] for a, b in zip([0, *cuts], [*cuts, len(ASKED)], strict=True)]
    assert relay(chunks) == PLAIN


def test_crlf_events_and_an_upstream_that_encodes_anyway() -> None:
    crlf = ASKED.replace(b"\n", b"\r\n")
    assert relay([crlf]) == PLAIN.replace(b"\n", b"\r\n")
    hidden = HiddenUsage("gzip")
    packed = gzip.compress(ASKED)
    out = b"".join(hidden.feed(packed[i : i + 7]) for i in range(0, len(packed), 7))
    assert hidden.decoded and out + hidden.finish() == PLAIN


@pytest.mark.parametrize(
    "payload",
    [
        b'{"choices":[{"delta":{"content":"x"}}]}',  # nothing added: unchanged
        b'{"choices":[],"usage":{"prompt_tokens":1},"usage":null}',  # usage twice: not ours
        b'{"choices":[{"delta":{}}],"usage":{"prompt_tokens":1}}',  # cumulative usage
        b'{"choices":[],"usage":"none"}',  # not an object
        b'{"usage":null',  # unfinished
        b'{"usage":null} {}',  # two values
        b"[1,2]",
        b"\xff\xfe",
        b'{"a":nul}',
    ],
)
def test_what_is_not_that_shape_passes_unchanged(payload: bytes) -> None:
    assert hidden_usage(payload) == payload
    event = b"data: " + payload + b"\n\n"
    assert relay([event]) == event


def test_null_usage_is_removed_wherever_it_stands() -> None:
    assert hidden_usage(b'{"usage": null, "a": 1}') == b'{"a": 1}'
    assert hidden_usage(b'{"a": 1 , "usage" : null }') == b'{"a": 1 }'
    assert hidden_usage(b'{"usage":null}') == b"{}"
    nested = b'{"choices":[{"delta":{"usage":null,"content":"\\"usage\\": null,"}}],"usage":null}'
    assert (
        hidden_usage(nested)
        == b'{"choices":[{"delta":{"usage":null,"content":"\\"usage\\": null,"}}]}'
    )
    assert hidden_usage(b'{"choices":[{"delta":{"usage":null}}]}') == (
        b'{"choices":[{"delta":{"usage":null}}]}'
    )
    assert hidden_usage(b'{"choices":null,"usage":{"total_tokens":4}}') is None


def test_other_events_pass_and_a_huge_unfinished_one_stops_the_rewrite() -> None:
    others = b': keep-alive\n\nevent: x\ndata: {"usage":null}\n\ndata: {"usage":null}\ndata: 1\n\n'
    assert relay([others]) == others
    huge = b"data: " + b"x" * (MAX_HELD_EVENT + 10)
    tail = b'\n\ndata: {"usage":null}\n\n'
    assert relay([huge, tail]) == huge + tail  # past the bound everything passes
    assert relay([b'data: {"usage":null}']) == b'data: {"usage":null}'  # unfinished: as came


def test_the_request_asks_for_usage() -> None:
    raw = b'{"model": "gpt-4o", "stream": true}  \n'
    asked = asking_for_usage(raw, json.loads(raw))
    assert (
        asked == b'{"model": "gpt-4o", "stream": true,"stream_options":{"include_usage":true}}  \n'
    )
    body = {
        "stream": True,
        "stream_options": {"include_usage": False, "include_obfuscation": False},
    }
    asked = asking_for_usage(json.dumps(body).encode(), body)
    assert asked is not None
    assert json.loads(asked)["stream_options"] == {
        "include_usage": True,
        "include_obfuscation": False,
    }
    none = {"stream": True, "stream_options": None}
    assert json.loads(asking_for_usage(b"{}", none) or b"")["stream_options"] == {
        "include_usage": True
    }
    assert asking_for_usage(b'{"stream_options": 3}', {"stream_options": 3}) is None
    assert asking_for_usage(b"{}", {}) is None
    assert asking_for_usage(b"[]", []) is None

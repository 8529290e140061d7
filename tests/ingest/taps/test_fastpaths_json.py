"""The JSON shortcut of the hot path reads exactly what json reads: ``loads`` parses with
msgspec and hands whatever msgspec refuses to json; request bodies parse as ``json.loads``
parses them (generated, hostile and edge-case documents)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.taps.fastjson import json_loads, loads, loads_stdlib

# -- loads: msgspec first, json's verdict on anything else --------------------------------


def same(data: bytes | str) -> None:
    fast, slow = loads(data), loads_stdlib(data)
    assert (repr(fast[0]), fast[1]) == (repr(slow[0]), slow[1]), data


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON, st.sampled_from(["", " ", "\n", "\t ", "\u00a0", "\x0c"]), st.booleans())
def test_loads_agrees_with_json_on_any_document(value: Any, pad: str, as_bytes: bool) -> None:
    text = pad + json.dumps(value) + pad
    same(text.encode("utf-8", "surrogatepass") if as_bytes else text)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_loads_agrees_with_json_on_any_bytes(data: bytes) -> None:
    same(data)


@pytest.mark.parametrize(
    "data",
    [
        b"12345678901234567890123",  # beyond 64 bits: an exact int, never a float
        b'{"n": -99999999999999999999}',
        b"1e400",
        b"NaN",
        b"-Infinity",
        b'"\\ud800"',
        b'"\xed\xa0\x80"',
        b'{"a": "\xff"}',
        b'{"a":1,"b":2,"a":3}',
        b"\xef\xbb\xbf{}",
        b'{"a": 1} x',
        b"",
        b"[" * 400 + b"]" * 400,
        b"[" * 600 + b"]" * 600,
        b"[" * 3000 + b"]" * 3000,
        b'{"pad": "' + b"[" * 2000 + b'", "x": 1}',
    ],
)
def test_loads_agrees_with_json_on_edge_cases(data: bytes) -> None:
    same(data)
    same(data.decode("utf-8", "replace"))


def json_outcome(parse: Any, data: bytes) -> tuple[str, str]:
    try:
        return "value", repr(parse(data))
    except Exception as exc:
        return "error", type(exc).__name__


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    JSON.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=48)
    | JSON.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-16"))
)
def test_request_bodies_parse_as_json_loads_parses_them(data: bytes) -> None:
    """Requests are read with json.loads semantics (UTF-16 and encoded surrogates too)."""
    assert json_outcome(json_loads, data) == json_outcome(json.loads, data)


@pytest.mark.parametrize(
    "data",
    [b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}", b"[" * 3000 + b"]" * 3000, b"1e400", b"NaN"],
)
def test_request_edge_cases_parse_as_json_loads_parses_them(data: bytes) -> None:
    assert json_outcome(json_loads, data) == json_outcome(json.loads, data)

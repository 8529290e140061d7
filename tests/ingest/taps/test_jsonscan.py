"""The incremental JSON path scanner agrees with json.loads."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.taps.base import LARGE
from ingest.taps.jsonscan import JsonBody, JsonPathScanner

KEYS = st.sampled_from(["usage", "model", "a", "us\u00e9", 'q"uote', "back\\slash", "*"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
PATHS = [("usage",), ("model",), ("a", "usage"), ("*", "usage"), ("a", "*", "model")]


def expected_at(doc: Any, path: tuple[str, ...]) -> list[Any]:
    """Every value at ``path`` in document order ("*": any array element)."""
    if not path:
        return [doc]
    head, rest = path[0], path[1:]
    if head == "*":
        if isinstance(doc, list):
            return [v for item in doc for v in expected_at(item, rest)]
        return []
    if isinstance(doc, dict) and head in doc:
        return expected_at(doc[head], rest)
    return []


def scan(raw: bytes, cuts: list[int], **kwargs: Any) -> JsonPathScanner:
    scanner = JsonPathScanner(PATHS, **kwargs)
    bounds = [0, *sorted(c % (len(raw) + 1) for c in cuts), len(raw)]
    for a, b in itertools.pairwise(bounds):
        scanner.feed(raw[a:b])
    scanner.finish()
    return scanner


@settings(max_examples=80, deadline=None)
@given(
    doc=st.dictionaries(KEYS, VALUES, max_size=5) | st.lists(VALUES, max_size=4),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
)
def test_captures_agree_with_json_loads(
    doc: Any, cuts: list[int], ascii_only: bool, indent: int | None
) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()
    scanner = scan(raw, cuts)
    assert scanner.error is None
    for path in PATHS:
        found = expected_at(doc, path)
        if found:
            assert scanner.values[path] == found[-1], path
        else:
            assert path not in scanner.values


def test_keys_inside_strings_are_not_keys() -> None:
    raw = b'{"text": "\\"usage\\": {\\"x\\": 1}, \\"model\\": \\"fake\\"", "model": "real"}'
    scanner = scan(raw, [])
    assert scanner.values == {("model",): "real"}


def test_sparse_rebuild() -> None:
    raw = json.dumps({"a": [{"model": "m1"}, {"model": "m2"}], "usage": {"x": 1}}).encode()
    scanner = scan(raw, [3, 9])
    assert scanner.sparse() == {"a": [{"model": "m2"}], "usage": {"x": 1}}
    scanner = scan(json.dumps([{"usage": 1}, {"usage": 2}]).encode(), [])
    assert scanner.sparse() == [{"usage": 2}]


def test_large_capture_becomes_large() -> None:
    raw = json.dumps({"usage": "x" * 1000, "model": "m"}).encode()
    scanner = scan(raw, [5, 500], capture_limit=100)
    assert scanner.values == {("usage",): LARGE, ("model",): "m"}


def test_errors() -> None:
    assert scan(b"[" * 1000, []).error == "JSON nested deeper than 256 levels"
    assert scan(b'{"a": [1, 2}', []).error == "malformed JSON: mismatched brackets"
    assert scan(b'{"a": 1', []).error == "truncated JSON"
    assert scan(b'{"a": 1} {', []).error == "trailing data after the JSON value"
    assert scan(b'"just a string"', []).error == "the body is not a JSON object or array"
    assert scan(b"   ", []).error == "empty JSON body"


def test_json_body_switches_to_the_scanner_past_its_limit() -> None:
    doc = {"content": "z" * 5000, "usage": {"input_tokens": 3}, "model": "m"}
    body = JsonBody({("usage",), ("model",)}, limit=1000)
    raw = json.dumps(doc).encode()
    for i in range(0, len(raw), 333):
        body.feed(raw[i : i + 333])
    assert body.large
    assert body.close() == ({"usage": {"input_tokens": 3}, "model": "m"}, None)
    small = JsonBody({("usage",)}, limit=1000)
    small.feed(b'{"usage": {"input_tokens": 3}, "other": 1}')
    assert small.close() == ({"usage": {"input_tokens": 3}, "other": 1}, None)

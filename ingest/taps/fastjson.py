"""msgspec for the JSON a tap reads, with json's verdict wherever the two could differ.

msgspec's decoder (C) reads bytes without decoding them to ``str`` first and keeps
integers of any size exact, as json does; it costs a fraction of json per document
(bench/records/comment_figures_2026-12-07.jsonl). It is
stricter than json (no NaN/Infinity, no lone surrogates, no numbers beyond a
double, valid UTF-8 only): whatever it refuses is handed to json, so a document
json accepts gets json's value and one json refuses gets json's error. Both stop
at Python's recursion limit; a document that could nest deeper than
``MAX_FAST_DEPTH`` goes to json directly, so there only json's limit decides.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any

import msgspec

fast_decode: Callable[[bytes | bytearray | str], Any] = msgspec.json.Decoder().decode

MAX_FAST_DEPTH = 512
#: a document this short cannot nest deeper than MAX_FAST_DEPTH
SHALLOW_SIZE = 2 * MAX_FAST_DEPTH


def shallow(data: bytes | bytearray | str) -> bool:
    """True when ``data`` surely nests at most MAX_FAST_DEPTH levels (brackets inside
    strings are counted too: a bound, never an underestimate)."""
    if len(data) <= SHALLOW_SIZE:
        return True
    if isinstance(data, str):
        return data.count("{") + data.count("[") <= MAX_FAST_DEPTH
    return data.count(b"{") + data.count(b"[") <= MAX_FAST_DEPTH


def json_loads(data: bytes) -> Any:
    """``json.loads(data)``: the same value, or the same exception."""
    if shallow(data):
        try:
            return fast_decode(data)
        except Exception:  # json decides, and raises its own error
            pass
    return json.loads(data)


_scan_once: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed: the C scanner takes a decoder
)


def loads(data: bytes | bytearray | str) -> tuple[Any, str | None]:
    """``json.loads`` that reports instead of raising: ``(value, problem)``.

    msgspec reads the common document; whatever it refuses (malformed JSON, NaN,
    lone surrogates, numbers beyond a double...) takes :func:`loads_stdlib`, so the
    value and the problem are exactly json's.
    """
    if shallow(data):
        try:
            return fast_decode(data), None
        except Exception:  # json decides what is wrong, and says it
            pass
    return loads_stdlib(data)


def loads_stdlib(data: bytes | bytearray | str) -> tuple[Any, str | None]:
    """:func:`loads` with the standard library's json only (the reference behaviour).

    Calls the C scanner behind ``json.loads`` directly (a fraction of its overhead
    per call); anything unusual (leading whitespace, a BOM) takes the
    ``json.loads`` path.
    """
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
        try:
            value, end = _scan_once(text, 0)
        except StopIteration:
            value, end = json.loads(data), len(text)
        if end != len(text) and not text[end:].isspace():
            return None, "unreadable: malformed JSON (extra data)"
        return value, None
    except RecursionError:
        return None, "unreadable: JSON nested too deeply"
    except UnicodeDecodeError:
        return None, "unreadable: invalid UTF-8 in JSON"
    except ValueError as exc:
        return None, f"unreadable: malformed JSON ({str(exc).split(':')[0]})"

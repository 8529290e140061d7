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

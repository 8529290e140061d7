"""JSON text as the providers write it: compact (or Google's spaced) ``dumps``, and
templates serialised once and filled per value (streams have thousands of deltas)."""

from __future__ import annotations

import json
import re
from typing import Any


def dumps(obj: Any, *, spaced: bool = False) -> str:
    """``obj`` as compact JSON, non-ASCII kept (``spaced``: as Google's encoders write it)."""
    if spaced:  # Google's encoders put a space after ':' and ','
        return json.dumps(obj, ensure_ascii=False)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def slot(index: int) -> str:
    """A placeholder for :class:`Template` (value number ``index``)."""
    return f"\x00{index}\x00"


_encode_str = json.encoder.encode_basestring  # a JSON string, non-ASCII kept (C)
_SLOT = re.compile(r'"\\u0000(\d+)\\u0000"')


class Template:
    """An event serialised once with :func:`slot` placeholders: filling it in
    costs one ``json.dumps`` per value (streams have thousands of deltas)."""

    def __init__(self, text: str) -> None:
        self.parts = _SLOT.split(text)

    def fill(self, *values: Any) -> str:
        parts = self.parts
        out = [parts[0]]
        for i in range(1, len(parts), 2):
            value = values[int(parts[i])]
            out.append(_encode_str(value) if type(value) is str else json.dumps(value))
            out.append(parts[i + 1])
        return "".join(out)

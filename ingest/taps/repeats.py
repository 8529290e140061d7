"""JSON objects that give a key more than once, and every way of reading them.

RFC 8259 leaves an object whose names repeat to its reader: ``json.loads``, msgspec and
the SDKs keep the last value, other readers the first. So an upstream answer whose usage
(or an object on the way to it) gives a key twice, the second time with lower counts, is
read by a last-wins reader as cheaper than another reader (or the provider's own billing)
reads it: ``{"usage": {...}, "usage": {"output_tokens": 0}}`` would be free.

A tap reads such a document every way a reader could (:func:`readings`): each repeated
key takes each of its values in turn, nested objects and arrays combined. Each reading
is read as the document itself, and the call is charged the field-wise maximum of the
usage they report (``base.Handler.report``), so a repeat can never lower a charge.

Finding repeats needs the pairs of every object, which neither msgspec nor ``json.loads``
keeps: :func:`loads_keeping_repeats` is ``json.loads`` with an ``object_pairs_hook``,
slower, so a handler calls it only when a cheap test (``base.may_repeat``) says a
document could repeat a key that matters. The documents are small and few per response.
"""

from __future__ import annotations

import json
from itertools import product
from typing import Any

#: readings of one document at most; a document that can be read in more ways (keys
#: repeated over and over) is not charged as reported (``invalid_usage``)
MAX_READINGS = 64


class Repeated(dict[str, Any]):
    """A JSON object that gave some key more than once: the last value of each key (what
    ``json.loads`` reads), and in ``earlier`` the values a repeated key had before its
    last, in order."""

    __slots__ = ("earlier",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        earlier: dict[str, list[Any]] = {}
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                earlier.setdefault(key, []).append(seen[key])
            seen[key] = value
        self.earlier = earlier


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    return obj if len(obj) == len(pairs) else Repeated(pairs)


_DECODER = json.JSONDecoder(object_pairs_hook=_object)


def loads_keeping_repeats(data: bytes | bytearray | str) -> tuple[Any, str | None]:
    """``json.loads(data)`` where an object that repeats a key is a :class:`Repeated`;
    ``(value, None)`` or ``(None, the problem)`` as ``fastjson.loads`` reports it."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        return _DECODER.decode(text), None
    except RecursionError:
        return None, "unreadable: JSON nested too deeply"
    except UnicodeDecodeError:
        return None, "unreadable: invalid UTF-8 in JSON"
    except ValueError as exc:
        return None, f"unreadable: malformed JSON ({str(exc).split(':')[0]})"


class TooManyReadings(Exception):
    """The document repeats keys in more ways than MAX_READINGS."""


def readings(value: Any, limit: int = MAX_READINGS) -> list[Any]:
    """Every way of reading ``value``'s repeated keys: ``[value]`` when nothing in it
    repeats a key, else one value per combination (each a plain ``dict``/``list`` tree).
    Raises :class:`TooManyReadings` past ``limit``."""
    return _readings(value, limit)


def _readings(value: Any, limit: int) -> list[Any]:
    if isinstance(value, dict):
        earlier = value.earlier if isinstance(value, Repeated) else None
        options: list[list[Any]] = []
        changed = earlier is not None
        for key, last in value.items():
            candidates = [*earlier[key], last] if earlier and key in earlier else [last]
            alternatives: list[Any] = []
            for candidate in candidates:
                alternatives.extend(_readings(candidate, limit))
            if len(alternatives) != 1 or alternatives[0] is not last:
                changed = True
            options.append(alternatives)
        if not changed:
            return [value]
        return _combine(list(value), options, limit)
    if isinstance(value, list):
        items = [_readings(item, limit) for item in value]
        if all(len(alts) == 1 and alts[0] is item for alts, item in zip(items, value, strict=True)):
            return [value]
        count = 1
        for alts in items:
            count *= len(alts)
            if count > limit:
                raise TooManyReadings
        return [list(combo) for combo in product(*items)]
    return [value]


def _combine(keys: list[str], options: list[list[Any]], limit: int) -> list[dict[str, Any]]:
    count = 1
    for alternatives in options:
        count *= len(alternatives)
        if count > limit:
            raise TooManyReadings
    return [dict(zip(keys, combo, strict=True)) for combo in product(*options)]


def has_repeats(value: Any) -> bool:
    """True when some object in ``value`` (as :func:`loads_keeping_repeats` read it)
    repeats a key."""
    if isinstance(value, Repeated):
        return True
    if isinstance(value, dict):
        return any(has_repeats(item) for item in value.values())
    if isinstance(value, list):
        return any(has_repeats(item) for item in value)
    return False


__all__ = [
    "MAX_READINGS",
    "Repeated",
    "TooManyReadings",
    "has_repeats",
    "loads_keeping_repeats",
    "readings",
]

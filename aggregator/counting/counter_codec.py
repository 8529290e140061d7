"""A counter's changelog value: ``CounterState.to_json()`` as compact JSON, the format
changelog recovery and the local store read (``state.py``) and a generation seeded
from a snapshot starts from."""

from __future__ import annotations

import json

from aggregator.counting.fold import CounterState


def encode_counter(state: CounterState) -> bytes:
    """The changelog value: ``state.to_json()`` as compact JSON.

    Written directly, faster than ``json.dumps`` of the dict (one per counter per batch,
    and a rolling counter carries up to 48 buckets); byte-identical to
    :func:`encode_counter_json`, which it defers to for any value outside the plain shape
    (a test holds the two equal).
    """
    try:
        return _write_counter(state).encode()
    except _NotPlain:
        return encode_counter_json(state)


def encode_counter_json(state: CounterState) -> bytes:
    """The reference encoding of the changelog value."""
    return json.dumps(state.to_json(), separators=(",", ":")).encode()


class _NotPlain(Exception):
    """A value the direct writer does not take: ``json.dumps`` writes it."""


def _plain_string(value: object) -> str:
    """``value`` between quotes, when JSON needs no escape in it (printable ASCII, no ``"``
    or ``\\``): what ``json.dumps`` writes for such a string."""
    if (
        type(value) is not str
        or not value.isascii()
        or not value.isprintable()
        or '"' in value
        or "\\" in value
    ):
        raise _NotPlain
    return f'"{value}"'


def _int(value: object) -> int:
    if type(value) is not int:  # a bool or a float is written differently by json.dumps
        raise _NotPlain
    return value


def _write_counter(state: CounterState) -> str:
    fence = ",".join([f'"{_int(p)}":{_int(o)}' for p, o in state.fence.items()])
    periods = []
    for key, t in state.periods.items():
        alerted = _dumps(t.alerted) if t.alerted else "[]"
        buckets = t.buckets
        for b in buckets:  # int keys: json.dumps writes them as str(b) does (a bool would not)
            if type(b) is not int:
                raise _NotPlain
        periods.append(
            f"{_plain_string(key)}:[{_int(t.nanos)},{_int(t.tokens)},{_int(t.requests)},"
            f"{_int(t.as_of_us)},{alerted},{_dumps(buckets) if buckets else '{}'}]"
        )
    return (
        f'{{"p":{_plain_string(state.period)},"s":{_int(state.seq)},"f":{{{fence}}},'
        f'"t":{{{",".join(periods)}}}}}'
    )


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def decode_counter(value: bytes) -> CounterState:
    return CounterState.from_json(json.loads(value))

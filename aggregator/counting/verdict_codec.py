"""Verdict bytes on the hot path.

At a few thousand events a second most events send a Verdict (a quiet counter sends
at once), and ``VERDICT.encode(verdict_record(...))`` spent most of its time in
fastavro's generic writer and in building datetimes only to turn them back into
microseconds. This writer is the codec's own generated body writer
(``schemas.avro_writer.compile_record_writer``, held byte-identical to fastavro by the
schemas tests) fed with integer microseconds, and ``reset_at`` is looked up per
(window, period) with the period's start (the forecast's trailing window begins no
earlier): every instant of a calendar period starts and ends at the same times. Any
value the generated writer does not take goes through ``VERDICT.encode``, so the
bytes, and the errors, are the codec's; a test holds the two equal.
"""

from __future__ import annotations

from typing import Final

from aggregator.counting.fold import CounterState, verdict_fields, verdict_record
from schemas.avro_writer import BodyWriter, compile_record_writer
from schemas.budgets import Budget
from schemas.codec import VERDICT
from schemas.periods import Window, from_micros, period_end, period_start, to_micros

_writer = compile_record_writer(VERDICT.schema)
if _writer is None:  # the schema gained a type the generator does not specialise
    raise ImportError("the Verdict schema has no generated writer: encode through VERDICT")
_BODY: Final[BodyWriter] = _writer
_HEADER: Final = VERDICT.header
#: (window, period key) -> the period's (start, end) in microseconds (None: never resets)
_BOUNDS: dict[tuple[Window, str], tuple[int, int] | None] = {}
_BOUNDS_LIMIT: Final = 100_000


def period_bounds_us(window: Window, period: str, as_of_us: int) -> tuple[int, int] | None:
    """The period's start and end (``reset_at``); None for total and rolling windows."""
    if window.kind not in ("day", "week", "month"):  # total and rolling windows never reset
        return None
    cache_key = (window, period)
    if cache_key in _BOUNDS:
        return _BOUNDS[cache_key]
    at = from_micros(as_of_us)
    start, end = period_start(window, at), period_end(window, at)
    found = None if start is None or end is None else (to_micros(start), to_micros(end))
    if len(_BOUNDS) >= _BOUNDS_LIMIT:
        _BOUNDS.clear()
    _BOUNDS[cache_key] = found
    return found


def encode_verdict(
    budget: Budget,
    key: str,
    scope_values: tuple[str, ...],
    state: CounterState,
    emitted_at_us: int,
) -> bytes:
    """``VERDICT.encode(verdict_record(budget, key, scope_values, state, emitted_at))``,
    with ``emitted_at`` given in microseconds since the epoch."""
    as_of_us = state.periods[state.period].as_of_us
    bounds = period_bounds_us(budget.window, state.period, as_of_us)
    record = verdict_fields(
        budget,
        key,
        scope_values,
        state,
        reset_at=None if bounds is None else bounds[1],
        as_of=as_of_us,
        emitted_at=emitted_at_us,
        period_start_us=None if bounds is None else bounds[0],
    )
    try:
        return _HEADER + _BODY(record)
    except Exception:  # a value the generated writer does not take: the codec decides
        return VERDICT.encode(
            verdict_record(budget, key, scope_values, state, from_micros(emitted_at_us))
        )

"""Verdict bytes on the hot path.

At a few thousand events a second most events send a Verdict (a quiet counter sends
at once), and ``VERDICT.encode(verdict_record(...))`` spent most of its time in
fastavro's generic writer and in building datetimes only to turn them back into
microseconds. This writer is the codec's own generated body writer
(``schemas.avro_writer.compile_record_writer``, held byte-identical to fastavro by the
schemas tests) fed with integer microseconds, and ``reset_at`` is looked up per
(window, period): every instant of a calendar period ends at the same time. Any
value the generated writer does not take goes through ``VERDICT.encode``, so the
bytes, and the errors, are the codec's; a test holds the two equal.
"""

from __future__ import annotations

from typing import Final

from aggregator.fold import CounterState, verdict_fields, verdict_record
from schemas.avro_writer import BodyWriter, compile_record_writer
from schemas.budgets import Budget
from schemas.codec import VERDICT
from schemas.periods import Window, from_micros, period_end, to_micros

_writer = compile_record_writer(VERDICT.schema)
if _writer is None:  # the schema gained a type the generator does not specialise
    raise ImportError("the Verdict schema has no generated writer: encode through VERDICT")
_BODY: Final[BodyWriter] = _writer
_HEADER: Final = VERDICT.header
#: (window, period key) -> the period's end in microseconds (None: never resets)
_ENDS: dict[tuple[Window, str], int | None] = {}
_ENDS_LIMIT: Final = 100_000


def _reset_at_us(window: Window, period: str, as_of_us: int) -> int | None:
    if window.kind not in ("day", "week", "month"):  # total and rolling windows never reset
        return None
    found = _ENDS.get((window, period), -1)
    if found == -1:
        end = period_end(window, from_micros(as_of_us))
        found = None if end is None else to_micros(end)
        if len(_ENDS) >= _ENDS_LIMIT:
            _ENDS.clear()
        _ENDS[(window, period)] = found
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
    record = verdict_fields(
        budget,
        key,
        scope_values,
        state,
        reset_at=_reset_at_us(budget.window, state.period, as_of_us),
        as_of=as_of_us,
        emitted_at=emitted_at_us,
    )
    try:
        return _HEADER + _BODY(record)
    except Exception:  # a value the generated writer does not take: the codec decides
        return VERDICT.encode(
            verdict_record(budget, key, scope_values, state, from_micros(emitted_at_us))
        )

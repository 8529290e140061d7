"""A budget counter as `spendbus usage` and the admin API show it, from its live verdict:
spend, limits (raised while a raise is in force), state, reset and forecast, as of now.

A rolling counter's spend is what its buckets hold now (the buckets that left the window
since the verdict no longer count); its state follows, and an exceeded one names when it
reopens as its ``reset_at``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from schemas.forecast import Burn
from schemas.periods import from_micros, to_micros
from schemas.raises import RaiseBook
from schemas.rolling import rolling_spend


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def counter_state_of(
    spent: tuple[int, int, int],
    limits: tuple[int | None, int | None, int | None],
    alert_at: Sequence[float],
) -> str:
    """exceeded when a limit is reached, alert past the lowest threshold (the fold's rule)."""
    ratio = max((s / limit for s, limit in zip(spent, limits, strict=True) if limit), default=0.0)
    if ratio >= 1.0:
        return "exceeded"
    return "alert" if alert_at and ratio >= min(alert_at) else "ok"


def counter_row(
    v: Mapping[str, Any], book: RaiseBook, alert_at: Sequence[float], now: datetime
) -> dict[str, Any] | None:
    """The counter of verdict ``v`` as of ``now``; None when its period has ended."""
    reset = v["reset_at"]
    if reset is not None and reset <= now:
        return None  # a past period's counter
    now_us = to_micros(now)
    values = tuple(v["scope_values"])
    granted = book.active(v["budget_id"], values, now_us)
    spent = (v["spent_nanos"], v["spent_tokens"], v["spent_requests"])
    state, reset_at = v["state"], _iso(reset)
    rolling = rolling_spend(v)
    if rolling is not None:
        # the buckets that left the window since the verdict, by this clock
        spent = rolling.at(now_us)
        limits = (v["limit_nanos"], v["limit_tokens"], v["limit_requests"])
        state = counter_state_of(spent, limits, alert_at)
        if state == "exceeded":
            reopens = rolling.fits_at(now_us, limits, (0, 0, 0))
            reset_at = None if reopens is None else _iso(from_micros(reopens))
    span = v["burn_span_us"]
    burn = (
        Burn(
            v["burn_nanos"] or 0,
            v["burn_tokens"] or 0,
            v["burn_requests"] or 0,
            span,
            to_micros(v["as_of"]),
        ).per_hour()
        if span
        else None
    )
    return {
        "budget_id": v["budget_id"],
        "scope": v["scope"],
        "scope_values": list(values),
        "counter": v["counter_key"],
        "action": v["action"],
        "period": v["period"],
        "state": state,
        "spent_nanos": spent[0],
        "spent_tokens": spent[1],
        "spent_requests": spent[2],
        "limit_nanos": v["limit_nanos"],
        "limit_tokens": v["limit_tokens"],
        "limit_requests": v["limit_requests"],
        "raise": None if granted is None else granted.to_json(),
        "reset_at": reset_at,
        "burn_per_hour": burn,
        "exhausts_at": _iso(v["exhausts_at"]),
        "as_of": _iso(v["as_of"]),
        "seq": v["seq"],
    }

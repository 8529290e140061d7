"""Forecasts: when a counter's limits run out at its recent burn rate. The one formula
the aggregator (verdicts, forecast alerts), the enforcers (``usage``, ``/v1/spend``)
and the alert publisher (over ClickHouse's rows) compute.

Everything is event time, so a replay or ``verify`` folding the same events gets the
same answer: no clock is read here.

- **The trailing window** is the last ``FORECAST_BUCKETS`` (12) buckets of
  ``FORECAST_BUCKET_US`` (5 minutes) up to the bucket of the counter's ``as_of`` (its
  newest event), an hour at most, within the counter's period. A counter keeps the
  buckets of each period (``PeriodTotals.buckets`` of a calendar or total window); an
  event older than the window when it arrives is not kept in one, which is what a fold
  in time order ends with too.
- **The burn** is what those buckets hold (spend, tokens, requests) over its **span**:
  from the window's start (the oldest bucket's start, or the period's start when later)
  to ``as_of``, at least one bucket (so the first event of a period does not project an
  infinite rate).
- **The projection** per limit is ``as_of + ceil((limit - spent) * span / burn)``;
  ``exhausts_at`` is the earliest over the limits the counter has. None when no limit
  would be reached (no limit, nothing burnt in the window, or not within
  ``FORECAST_HORIZON_US``, about a century), when a limit is reached
  already (the counter is exceeded), and for rolling windows (their spend leaves the
  window as it arrives: the window's own sum is their rate).

A forecast alert (kind ``forecast``) goes out once per (counter, period) when
``exhausts_at`` falls before the period's end (``forecast_alert_due``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

#: the width of a trailing-window bucket (µs): 5 minutes
FORECAST_BUCKET_US: Final = 300_000_000
#: how many buckets the trailing window holds: 12 x 5 minutes = 1 hour
FORECAST_BUCKETS: Final = 12
#: the trailing window's length (µs)
FORECAST_WINDOW_US: Final = FORECAST_BUCKET_US * FORECAST_BUCKETS
#: a projection further out than this (µs, about a century) is none: nothing runs out
#: in sight, and every time stays representable
FORECAST_HORIZON_US: Final = 36_525 * 86_400_000_000
_HOUR_US: Final = 3_600_000_000


class Burn(NamedTuple):
    """What a counter spent in its trailing window, and the span (µs) that window covers."""

    nanos: int
    tokens: int
    requests: int
    span_us: int
    #: the end of the window: the counter's newest event (µs)
    as_of_us: int

    def per_hour(self) -> dict[str, int]:
        """The burn rates per hour (rounded down): what ``usage`` and ``/v1/spend`` show."""
        span = self.span_us
        return {
            "nanos": self.nanos * _HOUR_US // span,
            "tokens": self.tokens * _HOUR_US // span,
            "requests": self.requests * _HOUR_US // span,
        }


def forecast_bucket(at_us: int) -> int:
    """The index of the trailing-window bucket that holds ``at_us``."""
    return at_us // FORECAST_BUCKET_US


def first_live_bucket(as_of_us: int) -> int:
    """The oldest bucket still in the trailing window of a counter whose newest event is
    at ``as_of_us``."""
    return as_of_us // FORECAST_BUCKET_US - FORECAST_BUCKETS + 1


def burn_of(
    buckets: Mapping[int, Sequence[int]], as_of_us: int, period_start_us: int | None
) -> Burn:
    """The burn of a counter from its buckets (index -> [nanos, tokens, requests]), its
    newest event and its period's start (None: a total window, which never began)."""
    first = first_live_bucket(as_of_us)
    last = first + FORECAST_BUCKETS - 1
    nanos = tokens = requests = 0
    for index, (n, t, r) in buckets.items():
        if first <= index <= last:
            nanos += n
            tokens += t
            requests += r
    start = first * FORECAST_BUCKET_US
    if period_start_us is not None and period_start_us > start:
        start = period_start_us
    return Burn(nanos, tokens, requests, max(as_of_us - start, FORECAST_BUCKET_US), as_of_us)


def exhausts_at_us(
    burn: Burn,
    spent: tuple[int, int, int],
    limits: tuple[int | None, int | None, int | None],
) -> int | None:
    """When the first limit runs out at ``burn`` (µs), or None (see the module)."""
    best: int | None = None
    rates = (burn.nanos, burn.tokens, burn.requests)
    for used, limit, rate in zip(spent, limits, rates, strict=True):
        if limit is None:
            continue
        if used >= limit:
            return None  # exhausted already: the counter is exceeded, not forecast
        if rate <= 0:
            continue
        ahead = -(-(limit - used) * burn.span_us // rate)
        if ahead > FORECAST_HORIZON_US:
            continue
        at = burn.as_of_us + ahead
        if best is None or at < best:
            best = at
    return best


def forecast_alert_due(exhausts_at: int | None, period_end_us: int | None) -> bool:
    """Whether a counter projected to run out at ``exhausts_at`` gets its forecast alert:
    before its period ends (a period that never ends gets none)."""
    return exhausts_at is not None and period_end_us is not None and exhausts_at < period_end_us


def forecast_alert_id(counter_key: str, period: str) -> str:
    """The deterministic id of a counter's forecast alert in one period (once each)."""
    return f"forecast|{counter_key}|{period}"

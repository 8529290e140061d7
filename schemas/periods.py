"""Budget windows and their period keys, by event time in UTC.

=============  ==================  =========================================
window         period key          resets at
=============  ==================  =========================================
day            ``d:2026-11-30``    next midnight UTC
week           ``w:2026-W49``      next Monday 00:00 UTC (ISO week)
month          ``m:2026-11``       first day of next month 00:00 UTC
total          ``t``               never
rolling:<dur>  ``r:<dur>``         never as a whole: kept as 48 buckets of
                                   dur/48; spend is the sum of the buckets
                                   that overlap the last ``dur``
=============  ==================  =========================================

A counter in a new period simply starts at zero: the period key is part of
the counter's identity, so no reset job exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from schemas.errors import ContractError

ROLLING_BUCKETS: Final = 48
#: how far an event's ``occurred_at`` may be ahead of the time it reached Kafka (the
#: earlier of its record timestamp and the folding worker's clock) before the aggregator
#: dead-letters it (reason ``future_event``) instead of counting it: clocks of gateways
#: and workers drift by seconds, not minutes, and an event from the future must never
#: move a counter into a period that has not begun (aggregator/README.md, "Event time")
MAX_FUTURE_SKEW_SECONDS: Final = 300
#: the dead-letter reason of an event beyond that bound
FUTURE_EVENT: Final = "future_event"
_UNIT_SECONDS: Final = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_ROLLING = re.compile(r"^rolling:(\d+)([mhdw])$")
WINDOWS: Final = ("day", "week", "month", "total")
EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Window:
    """A parsed window: ``kind`` is day | week | month | total | rolling."""

    kind: str
    #: rolling windows only: the duration, in microseconds
    rolling_us: int = 0

    @property
    def bucket_us(self) -> int:
        return self.rolling_us // ROLLING_BUCKETS

    @property
    def spec(self) -> str:
        if self.kind != "rolling":
            return self.kind
        return f"rolling:{_format_duration(self.rolling_us)}"


def parse_window(text: str) -> Window:
    """``day`` | ``week`` | ``month`` | ``total`` | ``rolling:<n><m|h|d|w>`` (at least one minute)."""
    text = text.strip()
    if text in WINDOWS:
        return Window(text)
    match = _ROLLING.match(text)
    if not match or int(match.group(1)) == 0:
        raise ContractError(
            f"window {text!r}: expected day, week, month, total or rolling:<n><m|h|d|w> "
            "(e.g. rolling:5h)"
        )
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return Window("rolling", rolling_us=seconds * 1_000_000)


def _format_duration(us: int) -> str:
    seconds = us // 1_000_000
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    raise AssertionError("rolling windows are whole minutes")


def to_utc(ts: datetime) -> datetime:
    if ts.tzinfo is None:
        raise ContractError(f"timestamp {ts.isoformat()} has no time zone; spendbus works in UTC")
    return ts.astimezone(UTC)


def to_micros(ts: datetime) -> int:
    delta = to_utc(ts) - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def period_key(window: Window, ts: datetime) -> str:
    """The key of the period ``ts`` falls in (the counter-identity part)."""
    ts = to_utc(ts)
    kind = window.kind
    if kind == "month":
        return f"m:{ts.year:04d}-{ts.month:02d}"
    if kind == "day":
        return f"d:{ts.year:04d}-{ts.month:02d}-{ts.day:02d}"
    if kind == "week":
        iso = ts.isocalendar()
        return f"w:{iso.year:04d}-W{iso.week:02d}"
    if kind == "total":
        return "t"
    return f"r:{_format_duration(window.rolling_us)}"


def period_end(window: Window, ts: datetime) -> datetime | None:
    """When the period containing ``ts`` ends (the counter's ``reset_at``); None if it never resets."""
    ts = to_utc(ts)
    midnight = ts.replace(hour=0, minute=0, second=0, microsecond=0)
    if window.kind == "day":
        return midnight + timedelta(days=1)
    if window.kind == "week":
        return midnight + timedelta(days=7 - ts.weekday())
    if window.kind == "month":
        first = midnight.replace(day=1)
        return (first + timedelta(days=32)).replace(day=1)
    return None


def period_start(window: Window, ts: datetime) -> datetime | None:
    ts = to_utc(ts)
    midnight = ts.replace(hour=0, minute=0, second=0, microsecond=0)
    if window.kind == "day":
        return midnight
    if window.kind == "week":
        return midnight - timedelta(days=ts.weekday())
    if window.kind == "month":
        return midnight.replace(day=1)
    return None


def rolling_bucket(window: Window, ts_us: int) -> int:
    """Index of the rolling bucket (width = duration / 48) that holds ``ts_us``."""
    return ts_us // window.bucket_us


def rolling_live_buckets(window: Window, now_us: int) -> range:
    """The bucket indexes whose spend still counts at ``now_us``: the last 48, current included."""
    current = rolling_bucket(window, now_us)
    return range(current - ROLLING_BUCKETS + 1, current + 1)

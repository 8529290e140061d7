"""Budget windows and their period keys: the one place periods are computed.

A calendar window (day, week, month) follows the budget's calendar: ``timezone`` (IANA,
default ``UTC``), ``week_start`` (a weekday, default Monday) and ``month_start_day``
(1-28, a billing-cycle day, default 1). Its periods begin at local midnight, so a day
across a DST change lasts 23 or 25 hours; ``reset_at`` is that local midnight in UTC.

=============  ==================  ==============================================
window         period key          resets at
=============  ==================  ==============================================
day            ``d:2026-11-30``    next local midnight (the key is the local date)
week           ``w:2026-W49``      next ``week_start`` 00:00 local; the key is the
                                   ISO week of the week's 4th day (for Monday weeks
                                   the ISO week itself)
month          ``m:2026-11``       next ``month_start_day`` 00:00 local; the key is
                                   the month the cycle began in
total          ``t``               never
rolling:<dur>  ``r:<dur>``         never as a whole: kept as 48 buckets of
                                   dur/48; spend is the sum of the buckets
                                   that overlap the last ``dur``
=============  ==================  ==============================================

Keys of one calendar sort chronologically; with the default calendar they are those of
UTC days, ISO weeks and calendar months. A counter in a new period simply starts at
zero: the period key is part of the counter's identity, so no reset job exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

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
WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
DEFAULT_TIMEZONE: Final = "UTC"
#: a billing-cycle day exists in every month
MAX_MONTH_START_DAY: Final = 28
_HOUR_US: Final = 3_600_000_000
#: every zone offset in use (since the 1970s) is a whole number of quarter hours, so a
#: local midnight falls on a quarter hour UTC
_QUARTER_HOUR_US: Final = 900_000_000


@dataclass(frozen=True, slots=True)
class Window:
    """A parsed window: ``kind`` is day | week | month | total | rolling."""

    kind: str
    #: rolling windows only: the duration, in microseconds
    rolling_us: int = 0
    #: calendar windows: the IANA zone their periods follow
    timezone: str = DEFAULT_TIMEZONE
    #: week windows: the first day of a week, 0 = Monday ... 6 = Sunday
    week_start: int = 0
    #: month windows: the day each cycle begins (1-28)
    month_start_day: int = 1

    @property
    def bucket_us(self) -> int:
        return self.rolling_us // ROLLING_BUCKETS

    @property
    def grain_us(self) -> int:
        """A span of time (aligned on the epoch) within which the period key never changes:
        periods begin on whole hours UTC, or quarter hours in another zone."""
        return _HOUR_US if self.timezone == DEFAULT_TIMEZONE else _QUARTER_HOUR_US

    @property
    def calendar(self) -> dict[str, str | int]:
        """The calendar settings that differ from the default (what ``budgets`` shows)."""
        out: dict[str, str | int] = {}
        if self.timezone != DEFAULT_TIMEZONE:
            out["timezone"] = self.timezone
        if self.week_start:
            out["week_start"] = WEEKDAYS[self.week_start]
        if self.month_start_day != 1:
            out["month_start_day"] = self.month_start_day
        return out

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


def with_calendar(
    window: Window,
    timezone: str | None = None,
    week_start: str | None = None,
    month_start_day: int | None = None,
) -> Window:
    """``window`` following a local calendar; None keeps a setting's default. Settings
    that do not apply to the window (a week start on a month window, any on a rolling
    or total one) are refused, so a budget never silently ignores one."""
    zone = DEFAULT_TIMEZONE if timezone is None else timezone.strip()
    weekday = "monday" if week_start is None else week_start.strip().lower()
    first = 1 if month_start_day is None else month_start_day
    if zone != DEFAULT_TIMEZONE:
        if window.kind not in ("day", "week", "month"):
            raise ContractError(
                f"timezone applies to day, week and month windows, not {window.spec}"
            )
        _zone(zone)
    if weekday not in WEEKDAYS:
        raise ContractError(f"week_start {week_start!r}: expected one of {', '.join(WEEKDAYS)}")
    if weekday != "monday" and window.kind != "week":
        raise ContractError(f"week_start applies to week windows, not {window.spec}")
    if isinstance(first, bool) or not 1 <= first <= MAX_MONTH_START_DAY:
        raise ContractError(
            f"month_start_day {month_start_day!r}: expected a day 1-{MAX_MONTH_START_DAY} "
            "(one every month has)"
        )
    if first != 1 and window.kind != "month":
        raise ContractError(f"month_start_day applies to month windows, not {window.spec}")
    return Window(window.kind, window.rolling_us, zone, WEEKDAYS.index(weekday), first)


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ContractError(
            f"timezone {name!r}: not an IANA time zone (e.g. America/New_York, Europe/Berlin)"
        ) from None


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
    return EPOCH + timedelta(0, 0, us)  # positional: the keyword form costs more


def _midnight(window: Window, day: date) -> datetime:
    """The first instant of local ``day`` in the window's zone, in UTC. A midnight that a
    DST change skips maps (fold 0) to the moment the clocks jump: the day's first instant."""
    if window.timezone == DEFAULT_TIMEZONE:
        return datetime.combine(day, time(), tzinfo=UTC)
    return datetime.combine(day, time(), tzinfo=_zone(window.timezone)).astimezone(UTC)


def _add_months(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return day.replace(year=index // 12, month=index % 12 + 1)


def _first_day(window: Window, ts: datetime) -> date | None:
    """The local date the calendar period containing ``ts`` begins on (None: no calendar)."""
    kind = window.kind
    if kind not in ("day", "week", "month"):
        return None
    ts = to_utc(ts)
    if window.timezone != DEFAULT_TIMEZONE:
        ts = ts.astimezone(_zone(window.timezone))
    today = ts.date()
    if kind == "day":
        return today
    if kind == "week":
        return today - timedelta(days=(today.weekday() - window.week_start) % 7)
    cycle = today.replace(day=window.month_start_day)
    return cycle if today.day >= window.month_start_day else _add_months(cycle, -1)


def _next_first_day(window: Window, first: date) -> date:
    if window.kind == "day":
        return first + timedelta(days=1)
    if window.kind == "week":
        return first + timedelta(days=7)
    return _add_months(first, 1)


def period_key(window: Window, ts: datetime) -> str:
    """The key of the period ``ts`` falls in (the counter-identity part)."""
    kind = window.kind
    if kind == "total":
        to_utc(ts)
        return "t"
    first = _first_day(window, ts)
    if first is None:
        to_utc(ts)
        return f"r:{_format_duration(window.rolling_us)}"
    if kind == "month":
        return f"m:{first.year:04d}-{first.month:02d}"
    if kind == "day":
        return f"d:{first.year:04d}-{first.month:02d}-{first.day:02d}"
    # the ISO week holding most of its days (its Thursday's, for a Monday week): unique
    # per week and chronological, and the ISO week itself by default
    iso = (first + timedelta(days=3)).isocalendar()
    return f"w:{iso.year:04d}-W{iso.week:02d}"


def period_end(window: Window, ts: datetime) -> datetime | None:
    """When the period containing ``ts`` ends (the counter's ``reset_at``, UTC); None if it
    never resets."""
    first = _first_day(window, ts)
    return None if first is None else _midnight(window, _next_first_day(window, first))


def period_start(window: Window, ts: datetime) -> datetime | None:
    """When the period containing ``ts`` began (UTC); None for total and rolling windows."""
    first = _first_day(window, ts)
    return None if first is None else _midnight(window, first)


def rolling_bucket(window: Window, ts_us: int) -> int:
    """Index of the rolling bucket (width = duration / 48) that holds ``ts_us``."""
    return ts_us // window.bucket_us


def rolling_live_buckets(window: Window, now_us: int) -> range:
    """The bucket indexes whose spend still counts at ``now_us``: the last 48, current included."""
    current = rolling_bucket(window, now_us)
    return range(current - ROLLING_BUCKETS + 1, current + 1)

"""Local calendars (issue 23): a budget's ``timezone``, ``week_start`` and
``month_start_day``. Periods, keys and resets across the DST changes of America/New_York
and Europe/Berlin, a billing-cycle month, the UTC default unchanged, the settings refused
with the rule, and BudgetPolicy records written before the calendar existed (v1, v2)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas.avro_schemas import fingerprint, history_versions
from schemas.budgets import Budget, budget_from_yaml
from schemas.codec import BUDGET_POLICY, MAGIC
from schemas.errors import ConfigError
from schemas.periods import Window, parse_window, period_end, period_key, period_start

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def window(spec: str, **calendar: Any) -> Window:
    item = {"id": "b", "scope": "org", "window": spec, "limit_usd": "5", **calendar}
    return budget_from_yaml(item, source="budgets.yaml").window


NEW_YORK_DAY = window("day", timezone="America/New_York")
BERLIN_DAY = window("day", timezone="Europe/Berlin")


@pytest.mark.parametrize(
    ("at", "key", "start", "end"),
    [
        # 2026-03-08: clocks 02:00 EST -> 03:00 EDT, a 23-hour day
        (utc(2026, 3, 8, 4, 59, 59), "d:2026-03-07", utc(2026, 3, 7, 5), utc(2026, 3, 8, 5)),
        (utc(2026, 3, 8, 5), "d:2026-03-08", utc(2026, 3, 8, 5), utc(2026, 3, 9, 4)),
        (utc(2026, 3, 9, 3, 59, 59), "d:2026-03-08", utc(2026, 3, 8, 5), utc(2026, 3, 9, 4)),
        (utc(2026, 3, 9, 4), "d:2026-03-09", utc(2026, 3, 9, 4), utc(2026, 3, 10, 4)),
        # 2026-11-01: clocks 02:00 EDT -> 01:00 EST, a 25-hour day
        (utc(2026, 11, 1, 3, 59), "d:2026-10-31", utc(2026, 10, 31, 4), utc(2026, 11, 1, 4)),
        (utc(2026, 11, 1, 4), "d:2026-11-01", utc(2026, 11, 1, 4), utc(2026, 11, 2, 5)),
        (utc(2026, 11, 2, 4, 59), "d:2026-11-01", utc(2026, 11, 1, 4), utc(2026, 11, 2, 5)),
        (utc(2026, 11, 2, 5), "d:2026-11-02", utc(2026, 11, 2, 5), utc(2026, 11, 3, 5)),
    ],
)
def test_new_york_days_across_both_dst_changes(
    at: datetime, key: str, start: datetime, end: datetime
) -> None:
    assert period_key(NEW_YORK_DAY, at) == key
    assert (period_start(NEW_YORK_DAY, at), period_end(NEW_YORK_DAY, at)) == (start, end)


@pytest.mark.parametrize(
    ("at", "key", "start", "end"),
    [
        # 2026-03-29: 02:00 CET -> 03:00 CEST (23 h); 2026-10-25: 03:00 CEST -> 02:00 CET (25 h)
        (utc(2026, 3, 28, 22, 59), "d:2026-03-28", utc(2026, 3, 27, 23), utc(2026, 3, 28, 23)),
        (utc(2026, 3, 28, 23), "d:2026-03-29", utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)),
        (utc(2026, 3, 29, 22), "d:2026-03-30", utc(2026, 3, 29, 22), utc(2026, 3, 30, 22)),
        (utc(2026, 10, 24, 22), "d:2026-10-25", utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)),
        (utc(2026, 10, 25, 22, 30), "d:2026-10-25", utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)),
    ],
)
def test_berlin_days_across_both_dst_changes(
    at: datetime, key: str, start: datetime, end: datetime
) -> None:
    assert period_key(BERLIN_DAY, at) == key
    assert (period_start(BERLIN_DAY, at), period_end(BERLIN_DAY, at)) == (start, end)


def test_a_sunday_week_in_new_york_spans_the_spring_change() -> None:
    sunday = window("week", timezone="America/New_York", week_start="sunday")
    # Sunday 2026-03-08 00:00 EST to Sunday 2026-03-15 00:00 EDT: 7 days less an hour
    at = utc(2026, 3, 12, 12)
    assert (period_start(sunday, at), period_end(sunday, at)) == (
        utc(2026, 3, 8, 5),
        utc(2026, 3, 15, 4),
    )
    # labelled by the ISO week holding most of its days (Wednesday 2026-03-11: W11)
    assert period_key(sunday, at) == "w:2026-W11"
    assert period_key(sunday, utc(2026, 3, 8, 4, 59)) == "w:2026-W10"  # Saturday night
    assert period_key(sunday, utc(2026, 3, 15, 4)) == "w:2026-W12"
    # a Monday week in UTC keeps the ISO key
    assert period_key(parse_window("week"), at) == "w:2026-W11"


def test_a_billing_cycle_month_on_the_15th_in_berlin() -> None:
    cycle = window("month", timezone="Europe/Berlin", month_start_day=15)
    # 2026-03-15 00:00 CET = 03-14 23:00 UTC; the cycle ends 04-15 00:00 CEST = 04-14 22:00
    before, first = utc(2026, 3, 14, 22, 59), utc(2026, 3, 14, 23)
    assert period_key(cycle, before) == "m:2026-02"
    assert period_end(cycle, before) == first
    assert period_key(cycle, first) == "m:2026-03"
    assert (period_start(cycle, first), period_end(cycle, first)) == (first, utc(2026, 4, 14, 22))
    # a cycle spanning the year: 2026-12-15 .. 2027-01-15
    assert period_key(cycle, utc(2027, 1, 10)) == "m:2026-12"
    assert period_end(cycle, utc(2027, 1, 10)) == utc(2027, 1, 14, 23)


def _reference_utc_key(kind: str, at: datetime) -> str:
    if kind == "day":
        return at.strftime("d:%Y-%m-%d")
    if kind == "month":
        return at.strftime("m:%Y-%m")
    iso = at.isocalendar()
    return f"w:{iso.year:04d}-W{iso.week:02d}"


@pytest.mark.parametrize("kind", ["day", "week", "month"])
def test_the_default_calendar_is_utc_days_iso_weeks_and_calendar_months(kind: str) -> None:
    rng = random.Random(23)
    w = parse_window(kind)
    assert window(kind) == w and w.calendar == {}
    for _ in range(2_000):
        at = utc(2020, 1, 1) + timedelta(seconds=rng.randint(0, 10 * 365 * 86400))
        assert period_key(w, at) == _reference_utc_key(kind, at)
        start, end = period_start(w, at), period_end(w, at)
        assert start is not None and end is not None
        assert start <= at < end and start.hour == end.hour == 0 and start.tzinfo == UTC


CALENDARS = [
    window("day", timezone="America/New_York"),
    window("day", timezone="Asia/Kathmandu"),  # +05:45
    window("week", timezone="Europe/Berlin", week_start="sunday"),
    window("week", timezone="Australia/Lord_Howe", week_start="wednesday"),  # 30-min DST
    window("month", timezone="America/New_York", month_start_day=28),
    window("month", timezone="Europe/Berlin", month_start_day=15),
]


@pytest.mark.parametrize("w", CALENDARS, ids=lambda w: f"{w.kind}-{w.timezone}")
def test_every_instant_lies_in_its_period_and_keys_change_only_at_its_bounds(w: Window) -> None:
    rng = random.Random(w.timezone)
    for _ in range(1_000):
        at = utc(2026, 1, 1) + timedelta(seconds=rng.randint(0, 2 * 365 * 86400))
        key, start, end = period_key(w, at), period_start(w, at), period_end(w, at)
        assert start is not None and end is not None and start <= at < end
        assert period_key(w, start) == key == period_key(w, end - timedelta(microseconds=1))
        assert period_key(w, end) > key  # chronological
        assert period_start(w, end) == end
        # the grain the aggregator's caches rely on: bounds fall on whole grains
        for bound in (start, end):
            assert int(bound.timestamp() * 1_000_000) % w.grain_us == 0


@pytest.mark.parametrize(
    ("calendar", "message"),
    [
        ({"timezone": "Mars/Olympus"}, "not an IANA time zone"),
        ({"timezone": "America/New_York", "window": "rolling:5h"}, "timezone applies to day"),
        ({"week_start": "funday", "window": "week"}, "expected one of monday"),
        ({"week_start": "sunday", "window": "month"}, "week_start applies to week windows"),
        ({"month_start_day": 29}, "expected a day 1-28"),
        ({"month_start_day": 0}, "expected a day 1-28"),
        ({"month_start_day": 15, "window": "day"}, "month_start_day applies to month windows"),
    ],
)
def test_a_bad_calendar_is_refused_with_the_rule(calendar: dict[str, Any], message: str) -> None:
    item = {"id": "b", "scope": "org", "window": "month", "limit_usd": "5", **calendar}
    with pytest.raises(ConfigError, match=message):
        budget_from_yaml(item, source="budgets.yaml")


def test_the_calendar_travels_on_the_policy_record() -> None:
    b = budget_from_yaml(
        {
            "id": "acme-cycle",
            "scope": "org",
            "window": "month",
            "limit_usd": "500",
            "timezone": "America/New_York",
            "month_start_day": 15,
        }
    )
    record = BUDGET_POLICY.decode(BUDGET_POLICY.encode(b.to_record(NOW)))
    assert (record["timezone"], record["week_start"], record["month_start_day"]) == (
        "America/New_York",
        "monday",
        15,
    )
    assert Budget.from_record(record) == b


@pytest.mark.parametrize("version", [1, 2])
def test_a_policy_written_before_calendars_reads_as_utc(version: int) -> None:
    """A record as a v1 or v2 producer wrote it (its own schema, its own fingerprint)."""
    old = history_versions("BudgetPolicy")[version - 1]
    fields = {f["name"] for f in old["fields"]}
    assert "timezone" not in fields
    for spec in ("day", "week", "month", "total", "rolling:5h"):
        b = budget_from_yaml({"id": "old", "scope": "org", "window": spec, "limit_usd": "9"})
        record = {k: v for k, v in b.to_record(NOW).items() if k in fields}
        buf = BytesIO()
        buf.write(MAGIC + fingerprint(old))
        schemaless_writer(buf, parse_schema(old), record)
        decoded = BUDGET_POLICY.decode(buf.getvalue())
        assert (decoded["timezone"], decoded["week_start"], decoded["month_start_day"]) == (
            "UTC",
            "monday",
            1,
        )
        read = Budget.from_record(decoded)
        assert read.window == parse_window(spec) and read == b
        assert period_key(read.window, NOW) == period_key(parse_window(spec), NOW)

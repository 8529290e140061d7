"""schemas/rolling.py: a rolling verdict's buckets, read at any time (Verdict v3, issue 37)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.errors import ContractError
from schemas.periods import parse_window, to_micros
from schemas.rolling import leaves_at_us, rolling_spend, rolling_window_of, verdict_buckets

WINDOW = parse_window("rolling:2m")  # buckets of 2.5 s
WIDTH = 2_500_000
AS_OF = to_micros(datetime(2026, 12, 7, 10, 0, 1, tzinfo=UTC))  # 1 s into its bucket
NEWEST = AS_OF // WIDTH


def record(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "counter_key": "k",
        "period": "r:2m",
        "as_of": AS_OF,
        "spent_nanos": 30,
        "spent_tokens": 3,
        "spent_requests": 2,
        "bucket_ages": [47, 0],
        "bucket_nanos": [10, 20],
        "bucket_tokens": [1, 2],
        "bucket_requests": [1, 1],
    }
    return base | fields


def test_only_rolling_period_keys_name_a_rolling_window() -> None:
    assert rolling_window_of("r:2m") == WINDOW
    assert rolling_window_of("r:1d") == parse_window("rolling:1d")
    for other in ("m:2026-12", "d:2026-12-07", "t", "r:", "r:5s", ""):
        assert rolling_window_of(other) is None
    assert rolling_spend(record(period="m:2026-12")) is None


def test_the_verdict_carries_the_buckets_in_the_window_without_empty_ones() -> None:
    buckets = {
        NEWEST - 48: [5, 5, 5],  # left the window at as_of: not carried
        NEWEST - 47: [10, 1, 1],
        NEWEST - 3: [0, 0, 0],  # a refusal counted in no limit: nothing to carry
        NEWEST: [20, 2, 1],
    }
    assert verdict_buckets(WINDOW, buckets, AS_OF) == ([47, 0], [10, 20], [1, 2], [1, 1])


def test_spend_drops_as_each_bucket_leaves_the_window() -> None:
    spend = rolling_spend(record())
    assert spend is not None
    oldest_leaves = leaves_at_us(WINDOW, AS_OF, 47)
    assert oldest_leaves == (NEWEST + 1) * WIDTH  # the bucket after as_of's begins
    assert spend.first_leaves_at_us == oldest_leaves
    assert spend.at(AS_OF) == (30, 3, 2)
    assert spend.at(oldest_leaves - 1) == (30, 3, 2)
    assert spend.at(oldest_leaves) == (20, 2, 1)
    assert spend.at(leaves_at_us(WINDOW, AS_OF, 0)) == (0, 0, 0)


def test_when_a_request_fits_again() -> None:
    spend = rolling_spend(record())
    assert spend is not None
    oldest_leaves = leaves_at_us(WINDOW, AS_OF, 47)
    # two requests of a limit of two: one more fits once the oldest bucket left
    assert spend.fits_at(AS_OF, (None, None, 2), (0, 0, 1)) == oldest_leaves
    # it fits already
    assert spend.fits_at(AS_OF, (None, None, 3), (0, 0, 1)) == AS_OF
    # $25 of a limit of 25 nanos: under it once the oldest left, but 10 more need both gone
    assert spend.fits_at(AS_OF, (25, None, None), (0, 0, 0)) == oldest_leaves
    assert spend.fits_at(AS_OF, (25, None, None), (10, 0, 0)) == leaves_at_us(WINDOW, AS_OF, 0)
    # a need larger than the limit never fits
    assert spend.fits_at(AS_OF, (25, None, None), (26, 0, 0)) is None


def test_a_v2_verdict_keeps_its_spend_in_its_newest_bucket() -> None:
    spend = rolling_spend(
        record(bucket_ages=[], bucket_nanos=[], bucket_tokens=[], bucket_requests=[])
    )
    assert spend is not None
    newest_leaves = leaves_at_us(WINDOW, AS_OF, 0)
    assert spend.leaves_at == (newest_leaves,)
    assert spend.at(newest_leaves - 1) == (30, 3, 2) and spend.at(newest_leaves) == (0, 0, 0)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"bucket_nanos": [10]}, "differ in length"),
        ({"bucket_ages": [48, 0]}, "bucket age 48 outside 0-47"),
        ({"bucket_ages": [-1, 0]}, "bucket age -1 outside 0-47"),
        ({"spent_nanos": 29}, "sum past its spend"),
    ],
)
def test_buckets_that_do_not_fit_the_record_are_refused(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ContractError, match=says) as refused:
        rolling_spend(record(**fields))
    assert refused.value.reason == "bad_buckets"

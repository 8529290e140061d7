"""A rolling window's spend at any time, from what its verdict carries (Verdict v3).

A rolling window keeps 48 buckets of duration / 48 (``schemas/periods.py``): bucket
``i`` (the one holding ``[i × width, (i + 1) × width)``) counts while ``now < (i + 48) ×
width``. A verdict is the counter's state at its ``as_of`` (its newest event), and no
verdict follows when traffic stops (a refusal is not counted, so the counter never
moves again), so every reader drops the buckets that left the window since, by its own
clock: the enforcer and what shows spend (the sidecar, the gateway, ``spendbus usage``).
Otherwise an exhausted rolling budget would refuse for as long as its owner waits.

The verdict carries each bucket with spend still in the window at ``as_of`` as its
*age*, how many buckets it lies before ``as_of``'s (0 to 47), and its sums
(``bucket_ages``, ``bucket_nanos``, ``bucket_tokens``, ``bucket_requests``: parallel
arrays, one byte of age each). What its spend fields hold beyond the buckets' sums (a v2
verdict carries no buckets) is taken to be in ``as_of``'s own bucket: the latest it can
be, so a reader never lets spend go early.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from schemas.errors import ContractError
from schemas.periods import ROLLING_BUCKETS, Window, parse_window, to_micros

_ROLLING_PERIOD: Final = re.compile(r"^r:(\d+[mhdw])$")
#: the verdict fields that carry a rolling window's buckets (Verdict v3)
BUCKET_FIELDS: Final = ("bucket_ages", "bucket_nanos", "bucket_tokens", "bucket_requests")


@lru_cache(maxsize=1024)
def rolling_window_of(period: str) -> Window | None:
    """The rolling window whose period key is ``period`` (``r:5h``), None for any other key."""
    match = _ROLLING_PERIOD.match(period)
    if match is None:
        return None
    return parse_window(f"rolling:{match.group(1)}")


def leaves_at_us(window: Window, as_of_us: int, age: int) -> int:
    """When the bucket ``age`` buckets before ``as_of_us``'s leaves the window (µs)."""
    width = window.bucket_us
    return (as_of_us // width - age + ROLLING_BUCKETS) * width


def verdict_buckets(
    window: Window, buckets: Mapping[int, Sequence[int]], as_of_us: int
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The Verdict v3 bucket fields of a rolling counter: ``buckets`` (bucket index ->
    [nanos, tokens, requests]) still in the window at ``as_of_us``, oldest first, without
    empty ones (a refused request counted in no limit costs nothing to carry)."""
    newest = as_of_us // window.bucket_us
    ages: list[int] = []
    nanos: list[int] = []
    tokens: list[int] = []
    requests: list[int] = []
    for index in sorted(buckets):
        age = newest - index
        sums = buckets[index]
        if age >= ROLLING_BUCKETS or age < 0 or not (sums[0] or sums[1] or sums[2]):
            continue
        ages.append(age)
        nanos.append(sums[0])
        tokens.append(sums[1])
        requests.append(sums[2])
    return ages, nanos, tokens, requests


@dataclass(frozen=True, slots=True)
class RollingSpend:
    """A rolling verdict's spend as its buckets leave the window: ``leaves_at`` ascending
    (µs), and at index ``k`` of ``nanos``/``tokens``/``requests`` the spend left once the
    first ``k`` have gone (so index 0 is the verdict's spend, the last one zero)."""

    leaves_at: tuple[int, ...]
    nanos: tuple[int, ...]
    tokens: tuple[int, ...]
    requests: tuple[int, ...]

    @property
    def first_leaves_at_us(self) -> int | None:
        """When the spend first drops (None: it never does, nothing is in the window)."""
        return self.leaves_at[0] if self.leaves_at else None

    def at(self, now_us: int) -> tuple[int, int, int]:
        """(nanos, tokens, requests) still in the window at ``now_us``."""
        k = bisect_right(self.leaves_at, now_us)
        return self.nanos[k], self.tokens[k], self.requests[k]

    def fits_at(
        self,
        now_us: int,
        limits: tuple[int | None, int | None, int | None],
        needs: tuple[int, int, int],
    ) -> int | None:
        """The first time from ``now_us`` at which, for every limit, what is left in the
        window is under it and leaves room for ``needs`` (a request's worst case, times
        the replicas): ``now_us`` if it fits already, None if it never will (the need alone
        passes a limit)."""
        first = k = bisect_right(self.leaves_at, now_us)
        spent = (self.nanos, self.tokens, self.requests)
        while True:
            if all(
                limit is None or (left[k] < limit and left[k] + need <= limit)
                for limit, left, need in zip(limits, spent, needs, strict=True)
            ):
                return now_us if k == first else self.leaves_at[k - 1]
            if k == len(self.leaves_at):
                return None
            k += 1


def rolling_spend(record: Mapping[str, Any]) -> RollingSpend | None:
    """The spend of a rolling window's Verdict record (a v1/v2 record: all of it in
    ``as_of``'s bucket), or None for a verdict of another window. ``as_of`` in µs or a
    datetime. Raises ContractError on buckets that do not fit the record."""
    window = rolling_window_of(record["period"])
    if window is None:
        return None
    as_of = record["as_of"]
    as_of_us = as_of if isinstance(as_of, int) else to_micros(as_of)
    ages = record.get("bucket_ages") or ()
    columns = [record.get(name) or () for name in BUCKET_FIELDS[1:]]
    if any(len(column) != len(ages) for column in columns):
        raise ContractError(
            f"verdict {record.get('counter_key')!r}: bucket_ages, bucket_nanos, bucket_tokens "
            "and bucket_requests differ in length",
            reason="bad_buckets",
        )
    totals = [
        int(record["spent_nanos"]),
        int(record["spent_tokens"]),
        int(record["spent_requests"]),
    ]
    by_time: dict[int, list[int]] = {}
    for i, age in enumerate(ages):
        if not 0 <= age < ROLLING_BUCKETS:
            raise ContractError(
                f"verdict {record.get('counter_key')!r}: bucket age {age} outside 0-"
                f"{ROLLING_BUCKETS - 1}",
                reason="bad_buckets",
            )
        sums = by_time.setdefault(leaves_at_us(window, as_of_us, age), [0, 0, 0])
        for j in range(3):
            sums[j] += int(columns[j][i])
    carried = [sum(s[j] for s in by_time.values()) for j in range(3)]
    rest = [totals[j] - carried[j] for j in range(3)]
    if any(r < 0 for r in rest):
        raise ContractError(
            f"verdict {record.get('counter_key')!r}: its buckets sum past its spend",
            reason="bad_buckets",
        )
    if any(rest):
        newest = by_time.setdefault(leaves_at_us(window, as_of_us, 0), [0, 0, 0])
        for j in range(3):
            newest[j] += rest[j]
    leaves = tuple(sorted(by_time))
    nanos, tokens, requests = [totals[0]], [totals[1]], [totals[2]]
    for at in leaves:
        gone = by_time[at]
        nanos.append(nanos[-1] - gone[0])
        tokens.append(tokens[-1] - gone[1])
        requests.append(requests[-1] - gone[2])
    return RollingSpend(leaves, tuple(nanos), tuple(tokens), tuple(requests))

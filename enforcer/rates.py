"""Rate limits: the token buckets a budget's ``rate:`` is enforced with on this replica.

One :class:`RateBucket` per (counter, rate limit), refilled at this replica's share
of the rate; the functions below find, drop, charge and refund them for the checker
(which keeps the buckets and the charges per hold).
"""

from __future__ import annotations

from typing import Final, final

from enforcer.counters import CounterStatus
from enforcer.state import CounterId

#: a bucket holds this fraction of its window's count (1 s of a per-minute rate, 1/60 s of
#: a per-second one), and at least MIN_REQUESTS_BURST requests or one token
BURST_FRACTION: Final = 1 / 60
#: a request bucket holds at least two: with room for one only, the refill that comes
#: between the bucket filling and the next request is lost, and a saturated replica
#: admits under its rate (bench/bench_rate_limits.py)
MIN_REQUESTS_BURST: Final = 2.0
#: buckets kept before the full (idle) ones are dropped
MAX_BUCKETS: Final = 100_000


@final
class RateBucket:
    """One rate limit of one counter on this replica: a token bucket refilled at
    count / window / replicas (this replica's share), refilling up to
    count / replicas x BURST_FRACTION, at least 2 requests or the largest request's
    tokens. Requests take 1
    and need a whole one; tokens take the request's worst case and need the level above
    0 (they may go into debt: settle gives back what was not used, even above the
    bucket's size: it is the past's over-charge, not new room)."""

    __slots__ = ("count", "largest", "level", "tokens", "updated_us", "window_us")

    def __init__(self, tokens: bool, count: int, window_us: int, share: int, now_us: int) -> None:
        self.tokens = tokens
        self.count = count
        self.window_us = window_us
        #: tokens: the largest worst case taken (the bucket holds at least one of them)
        self.largest = 1.0
        self.level = self.capacity(share)
        self.updated_us = now_us

    def capacity(self, share: int) -> float:
        # tokens: room for the largest request seen, or the refill that comes while the
        # bucket waits full for the next one is lost (the bucket admits under its rate)
        least = self.largest if self.tokens else MIN_REQUESTS_BURST
        return max(least, self.count / share * BURST_FRACTION)

    def refill(self, now_us: int, share: int) -> float:
        """The level now (refilled since the last look, at this replica's share; a level
        above the bucket's size, from a settle's refund, is kept, not cut)."""
        if now_us > self.updated_us:
            cap = self.capacity(share)
            if self.level < cap:
                level = self.level + (now_us - self.updated_us) * self.count / (
                    self.window_us * share
                )
                self.level = cap if level > cap else level
            self.updated_us = now_us
        return self.level

    def wait_us(self, share: int) -> int:
        """How long until this bucket admits again (0: it does now)."""
        need = 1.0 - self.level if not self.tokens else -self.level
        if need <= 0 and (self.tokens or self.level >= 1.0):
            return 0
        wait = need * self.window_us * share / self.count
        whole = int(wait)
        return whole + 1 if whole < wait else whole


#: the buckets of a checker: one per (counter id, index into the plan's rates)
Buckets = dict[tuple[CounterId, int], RateBucket]


def bucket_for(
    buckets: Buckets,
    cid: CounterId,
    index: int,
    spec: tuple[bool, int, int],
    share: int,
    now_us: int,
) -> RateBucket:
    key = (cid, index)
    bucket = buckets.get(key)
    if bucket is None:
        if len(buckets) >= MAX_BUCKETS:
            drop_full_buckets(buckets, share, now_us)
        bucket = RateBucket(spec[0], spec[1], spec[2], share, now_us)
        buckets[key] = bucket
    return bucket


def drop_full_buckets(buckets: Buckets, share: int, now_us: int) -> None:
    full = [
        key
        for key, bucket in buckets.items()
        if bucket.refill(now_us, share) >= bucket.capacity(share)
    ]
    for key in full:
        del buckets[key]


def slowest_bucket(
    buckets: Buckets, rows: list[CounterStatus], rated: list[int], share: int, now_us: int
) -> tuple[int, int, tuple[bool, int, int]]:
    """(row, µs until it admits, its rate spec) of the rated counter whose bucket admits
    last; row -1 when every bucket admits now."""
    worst = -1
    worst_wait = 0
    worst_spec: tuple[bool, int, int] = (False, 0, 0)
    for i in rated:
        row = rows[i]
        plan = row.plan
        for index in range(len(plan.rates)):
            spec = plan.rates[index]
            bucket = bucket_for(buckets, row.counter_id, index, spec, share, now_us)
            bucket.refill(now_us, share)
            wait = bucket.wait_us(share)
            if wait > worst_wait:
                worst, worst_wait, worst_spec = i, wait, spec
    return worst, worst_wait, worst_spec


def take(
    buckets: Buckets, rows: list[CounterStatus], rated: list[int], tokens: int
) -> list[tuple[RateBucket, int]]:
    """Take one request (and the worst case's tokens) from every bucket of the rated
    counters; the token charges, for settle to give back what was not used."""
    charges: list[tuple[RateBucket, int]] = []
    for i in rated:
        row = rows[i]
        for index in range(len(row.plan.rates)):
            bucket = buckets[(row.counter_id, index)]
            if bucket.tokens:
                bucket.level -= tokens
                if tokens > bucket.largest:
                    bucket.largest = float(tokens)
                charges.append((bucket, tokens))
            else:
                bucket.level -= 1.0
                charges.append((bucket, 1))
    return charges


def refund(charges: list[tuple[RateBucket, int]], used_tokens: int, sent: bool) -> None:
    """Settle: give back the tokens the worst case took beyond what was used; release
    (never sent): give back everything, the request included."""
    for bucket, taken in charges:
        if bucket.tokens:
            bucket.level += taken - (used_tokens if sent else 0)
        elif not sent:
            bucket.level += taken

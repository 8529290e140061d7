"""The largest max output tokens a refused request would be admitted with now.

Refusal path only (a request too large, or kept out by what is in flight): the
refusal says what would fit, so a client can retry with a smaller ``max_tokens``.
"""

from __future__ import annotations

from enforcer.counters import CounterStatus
from enforcer.plans import EXCEEDED_I
from schemas.periods import from_micros
from schemas.pricing import PriceBook


def fitting_max_tokens(
    prices: PriceBook,
    share: int,
    rows: list[CounterStatus],
    model: str,
    input_tokens: int,
    max_output: int,
    now_us: int,
    units: dict[str, int] | None = None,
) -> int | None:
    """The largest max output tokens (below ``max_output``) with which this request
    would be admitted now by every enforce counter in ``rows`` (this replica's share,
    its holds included); None when not even 0 fits. Refusal path only: the worst case
    is linear in the output tokens but for its one rounding, so a guess from the
    slope is checked, then moved by single tokens (two or three price lookups, not a
    search: each costs microseconds)."""
    if not fits(prices, share, rows, model, input_tokens, 0, now_us, units):
        return None
    if max_output <= 1:
        return 0
    at = from_micros(now_us)
    base = prices.worst_case_nanos(
        model, at=at, input_tokens=input_tokens, max_output_tokens=0, units=units
    )
    top = prices.worst_case_nanos(
        model, at=at, input_tokens=input_tokens, max_output_tokens=max_output, units=units
    )
    slope = (top - base) / max_output
    guess = max_output - 1
    for row in rows:
        plan = row.plan
        if not plan.holdable:
            continue
        limit_tokens = row.limit_tokens
        if limit_tokens is not None:
            room = (limit_tokens - row.spent_tokens) // share - row.held_tokens - input_tokens
            guess = min(guess, room)
        limit_nanos = row.limit_nanos
        if limit_nanos is not None and slope > 0:
            room_nanos = (limit_nanos - row.spent_nanos) / share - row.held_nanos - base
            guess = min(guess, int(room_nanos / slope))
    guess = max(0, guess)
    # fits(low), not fits(high): the request was refused at max_output
    if fits(prices, share, rows, model, input_tokens, guess, now_us, units):
        if not fits(prices, share, rows, model, input_tokens, guess + 1, now_us, units):
            return guess  # the common case: the guess was exact
        low, high = guess + 1, max_output
    else:
        if guess == 0 or fits(prices, share, rows, model, input_tokens, guess - 1, now_us, units):
            return max(0, guess - 1)
        low, high = 0, guess - 1
    while high - low > 1:  # the guess was off by more than one token: search
        middle = (low + high) // 2
        if fits(prices, share, rows, model, input_tokens, middle, now_us, units):
            low = middle
        else:
            high = middle
    return low


def fits(
    prices: PriceBook,
    share: int,
    rows: list[CounterStatus],
    model: str,
    input_tokens: int,
    output: int,
    now_us: int,
    units: dict[str, int] | None = None,
) -> bool:
    nanos = -1
    for row in rows:
        plan = row.plan
        if not plan.holdable:
            continue
        if row.state_i == EXCEEDED_I:
            return False
        limit_requests = row.limit_requests
        if (
            limit_requests is not None
            and row.spent_requests + share * (row.held_requests + 1) > limit_requests
        ):
            return False
        limit_tokens = row.limit_tokens
        if (
            limit_tokens is not None
            and row.spent_tokens + share * (row.held_tokens + input_tokens + output) > limit_tokens
        ):
            return False
        limit_nanos = row.limit_nanos
        if limit_nanos is not None:
            if nanos < 0:
                nanos = prices.worst_case_nanos(
                    model,
                    at=from_micros(now_us),
                    input_tokens=input_tokens,
                    max_output_tokens=output,
                    units=units,
                )
            if row.spent_nanos + share * (row.held_nanos + nanos) > limit_nanos:
                return False
    return True

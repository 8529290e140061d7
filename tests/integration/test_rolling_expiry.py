"""Rolling windows expire where they are enforced (issue 37), against brute force.

Random events are folded by the aggregator's own fold, in a random arrival order, into
one rolling counter; its verdict goes through the real encoder and codec into an
enforcer whose clock is set to a random check time. What the enforcer counts, decides
and names as the reopening time must equal a recomputation from the events alone: the
events whose bucket is among the 48 up to the check time (or up to the newest event,
when the check is earlier: the verdict cannot unsee it), and the first bucket boundary
at which the request fits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.fold import CounterState, apply
from aggregator.counting.verdict_codec import encode_verdict
from schemas.codec import VERDICT
from schemas.ids import counter_key
from schemas.periods import ROLLING_BUCKETS, from_micros, to_micros
from schemas.usage import ALLOWED, BUDGET_EXCEEDED
from tests.enforcer.kit import NOW, FakeClock, budget, ctx, loaded_enforcer

#: the request every check makes: 1000 input + 1000 output tokens of the kit's model
#: ($3 / $15 per Mtok)
NEED = (18_000_000, 2000, 1)
WINDOWS = ("rolling:2m", "rolling:5h", "rolling:1d")


def in_window(events: list[tuple[int, int, int, int]], width: int, at_us: int) -> list[int]:
    """(nanos, tokens, requests) of the events whose bucket counts at ``at_us``."""
    first = at_us // width - ROLLING_BUCKETS + 1
    live = [e for e in events if e[0] // width >= first]
    return [sum(e[1] for e in live), sum(e[2] for e in live), sum(e[3] for e in live)]


def fits(spent: list[int], limits: tuple[int | None, ...]) -> bool:
    return all(
        limit is None or (s < limit and s + need <= limit)
        for s, need, limit in zip(spent, NEED, limits, strict=True)
    )


event_strategy = st.tuples(
    st.floats(min_value=0.0, max_value=2.0),  # when, in windows after the start
    st.integers(min_value=0, max_value=400_000_000),  # nanos
    st.integers(min_value=0, max_value=3000),  # tokens
    st.booleans(),  # counted as a request (allowed) or not (refused)
)


@settings(max_examples=300, deadline=None)
@given(
    window=st.sampled_from(WINDOWS),
    raw_events=st.lists(event_strategy, min_size=1, max_size=30),
    arrival=st.randoms(use_true_random=False),
    checks=st.lists(st.floats(min_value=-0.5, max_value=2.0), min_size=1, max_size=6),
    limit_nanos=st.one_of(st.none(), st.integers(min_value=1, max_value=2_000_000_000)),
    limit_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=20_000)),
    limit_requests=st.one_of(st.none(), st.integers(min_value=1, max_value=12)),
)
def test_the_enforcer_counts_decides_and_reopens_as_brute_force_says(
    window: str,
    raw_events: list[tuple[float, int, int, bool]],
    arrival: Any,
    checks: list[float],
    limit_nanos: int | None,
    limit_tokens: int | None,
    limit_requests: int | None,
) -> None:
    rolling = budget(
        "rolling",
        window=window,
        limit_nanos=limit_nanos,
        limit_tokens=limit_tokens,
        limit_requests=limit_requests,
    )
    span = rolling.window.rolling_us
    width = rolling.window.bucket_us
    start_us = to_micros(NOW - timedelta(days=3))
    # (occurred µs, nanos, tokens, requests)
    events = [
        (start_us + int(when * span), nanos, tokens, 1 if counted else 0)
        for when, nanos, tokens, counted in raw_events
    ]
    state = CounterState()
    order = list(range(len(events)))
    arrival.shuffle(order)
    for offset, i in enumerate(order):
        at_us, nanos, tokens, requests = events[i]
        event = {
            "occurred_at": from_micros(at_us),
            "outcome": "allowed" if requests else "refused",
            "charge_of": None,
        }
        apply(state, rolling, event, nanos, 0, offset, occurred_us=at_us, tokens=tokens)
    key = counter_key("rolling", ["acme"])
    as_of_us = max(e[0] for e in events)
    record = VERDICT.decode(encode_verdict(rolling, key, ("acme",), state, as_of_us + 1000))
    limits = (limit_nanos, limit_tokens, limit_requests)
    for check in checks:
        now_us = as_of_us + int(check * span)
        clock = FakeClock(from_micros(now_us))
        enforcer, _ = loaded_enforcer([rolling], [record], clock=clock)
        counted_at = max(now_us, as_of_us)
        spent = in_window(events, width, counted_at)
        (row,) = enforcer.usage(ctx())
        assert [row.spent_nanos, row.spent_tokens, row.spent_requests] == spent, (
            f"spend at {check} windows after the newest event"
        )
        decision = enforcer.peek(ctx())
        if fits(spent, limits):
            assert decision.decision == ALLOWED
            continue
        assert decision.decision == BUDGET_EXCEEDED
        # spend changes only at bucket boundaries: the first one at which the request fits
        boundaries = [(counted_at // width + k) * width for k in range(1, ROLLING_BUCKETS + 1)]
        reopens = next(
            (b for b in boundaries if fits(in_window(events, width, b), limits)),
            None,
        )
        refusing = decision.refusing
        assert refusing is not None and refusing.end_us == reopens
        expected_retry = None if reopens is None else max(1, -(-(reopens - now_us) // 1_000_000))
        assert decision.retry_after == expected_retry

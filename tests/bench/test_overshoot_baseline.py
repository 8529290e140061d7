"""The overshoot bench's comparator: the flush-and-poll gate behaves as the design it stands for."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.overshoot_baseline import PollGate, SharedTotal
from schemas.codec import USAGE_EVENT
from schemas.pricing import PriceBook
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

CAP = 1_000_000_000  # $1


def gate(shared: SharedTotal) -> PollGate:
    return PollGate(shared, PriceBook.from_file(), "cap", CAP)


def served(input_tokens: int, output_tokens: int) -> UsageEvent:
    return new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="r0",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def context(g: PollGate) -> Any:
    return g.context(org_id="acme", secret_id="sk-1", provider="anthropic", model="m")


def test_spend_counts_only_after_a_flush_and_only_for_the_replica_that_flushed() -> None:
    shared = SharedTotal()
    a, b = gate(shared), gate(shared)
    # $3/M input, $15/M output: 100k input + 50k output = $0.30 + $0.75 = $1.05 > the cap
    a.settle(None, served(100_000, 50_000))
    assert a.local_nanos == 1_050_000_000
    assert a.check(context(a)).allowed  # post-paid: not flushed, not known
    a.flush()
    assert shared.nanos == 1_050_000_000
    assert not a.check(context(a)).allowed
    assert b.check(context(b)).allowed  # b's cache is as old as its last flush
    b.flush()
    refused = b.check(context(b))
    assert not refused.allowed
    assert refused.status == 402
    assert refused.body == {
        "error": "budget_exceeded",
        "budget_id": "cap",
        "limit_nanos": CAP,
        "spent_nanos": 1_050_000_000,
    }
    assert (a.refusals, b.refusals, a.checks, b.checks) == (1, 1, 2, 2)


def test_reaching_the_cap_exactly_exhausts_it() -> None:
    shared = SharedTotal(nanos=CAP)
    g = gate(shared)
    g.flush()
    assert not g.check(context(g)).allowed


def test_a_refusal_is_a_valid_zero_token_usage_event_and_an_allowed_call_has_none() -> None:
    shared = SharedTotal(nanos=CAP)
    g = gate(shared)
    allowed = g.check(context(g))
    assert allowed.allowed and allowed.refusal_event() is None and allowed.hold_id is None
    g.flush()
    refused = g.check(context(g))
    event = refused.refusal_event(gateway_id="r0", stream=True)
    assert event is not None
    assert USAGE_EVENT.decode(USAGE_EVENT.encode(event))["decision"] == "budget_exceeded"
    assert (event["outcome"], event["input_tokens"], event["output_tokens"]) == ("refused", 0, 0)
    assert event["decision_budget_id"] == "cap" and event["status_code"] == 402
    assert g.release(None) is False  # nothing is ever held


def test_a_context_without_an_org_or_secret_is_refused_loudly() -> None:
    g = gate(SharedTotal())
    with pytest.raises(ValueError, match="org_id"):
        g.context(org_id=" ", secret_id="sk-1")
    with pytest.raises(ValueError, match="secret_id"):
        g.context(org_id="acme")


async def test_the_timer_flushes_and_stop_flushes_what_is_left() -> None:
    shared = SharedTotal()
    g = PollGate(shared, PriceBook.from_file(), "cap", CAP, flush_interval_s=3600, first_flush_s=0)
    await g.start()
    await asyncio.sleep(0.01)  # the first flush is due at once; the next in an hour
    assert shared.flushes == 1 and shared.nanos == 0
    g.settle(None, served(1_000, 0))
    await g.stop()  # stop flushes what is left
    assert shared.flushes == 2 and shared.nanos == 3_000_000
    assert g.local_nanos == 0 and g.cached_nanos == 3_000_000

"""Issue 17's reproduction on the broker: a spent secret stays refused when one event
dated next March arrives (it is dead-lettered, reason future_event), and even a verdict
of that future period, had an aggregator sent one, does not lift it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregator.replay.generations import topic_values
from enforcer import Enforcer, EnforcerConfig
from runtime.topic_reader import read_latest_values
from schemas.codec import DEAD_LETTER, VERDICT
from schemas.ids import counter_key
from schemas.periods import FUTURE_EVENT, period_end, period_key
from schemas.records import UsageEvent
from schemas.usage import BUDGET_EXCEEDED, new_usage_event
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline, publish_usage

pytestmark = pytest.mark.integration

MARCH = datetime(2027, 3, 15, tzinfo=UTC)


def spend(n: int, **over: Any) -> list[UsageEvent]:
    """``n`` calls of sk-1 at acme, now: 20k input tokens of Sonnet each ($0.06)."""
    fields: dict[str, Any] = dict(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-1",
        org_id="acme",
        gateway_id="it",
        input_tokens=20_000,
        output_tokens=1,
    )
    fields.update(over)
    return [new_usage_event(**fields) for _ in range(n)]


def test_one_event_from_the_future_does_not_lift_an_exhausted_budget(pipeline: Pipeline) -> None:
    asyncio.run(publish_usage(pipeline.bootstrap, pipeline.topics.usage_raw, spend(2)))
    key = counter_key("per-secret", ("acme", "sk-1"))

    async def main() -> None:
        config = EnforcerConfig(bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix)
        async with Enforcer(config) as enforcer:
            await enforcer.wait_ready(60)
            ctx = enforcer.context(org_id="acme", secret_id="sk-1", model="claude-sonnet-4-5")

            async def decision(wanted: str) -> str:
                for _ in range(300):
                    found = enforcer.check(ctx, reserve=False).decision
                    if found == wanted:
                        return found
                    await asyncio.sleep(0.1)
                return found

            assert await decision(BUDGET_EXCEEDED) == BUDGET_EXCEEDED  # $0.12 of $0.10
            # one event dated next March, 1 input and 1 output token
            future = spend(1, occurred_at=MARCH, input_tokens=1, output_tokens=1)
            await publish_usage(pipeline.bootstrap, pipeline.topics.usage_raw, future)
            for _ in range(300):
                letters = await topic_values(pipeline.bootstrap, pipeline.topics.usage_dlq)
                if letters:
                    break
                await asyncio.sleep(0.2)
            (letter,) = [DEAD_LETTER.decode(v) for v in letters if v is not None]
            assert letter["reason"] == FUTURE_EVENT and "2027-03-15" in letter["detail"]
            assert enforcer.check(ctx, reserve=False).decision == BUDGET_EXCEEDED
            (status,) = [s for s in enforcer.usage(ctx) if s.budget_id == "per-secret"]
            now = datetime.now(UTC)
            assert status.period == period_key(status.plan.window, now)
            # a verdict of March (an aggregator of before this fix) is kept aside
            live = await read_latest_values(pipeline.bootstrap, pipeline.topics.budget_verdicts)
            value = live[key.encode()]
            assert value is not None  # not a tombstone
            held = VERDICT.decode(value)
            forged = {
                **held,
                "period": "m:2027-03",
                "spent_nanos": 1,
                "seq": held["seq"] + 1,
                "as_of": MARCH,
                "reset_at": period_end(status.plan.window, MARCH),
                "emitted_at": now + timedelta(milliseconds=1),
            }
            await publish(
                pipeline.bootstrap,
                pipeline.topics.budget_verdicts,
                [(key.encode(), VERDICT.encode(forged))],
            )
            for _ in range(100):
                if enforcer.state.ahead:
                    break
                await asyncio.sleep(0.1)
            assert enforcer.state.ahead, "the forged verdict never arrived"
            assert enforcer.check(ctx, reserve=False).decision == BUDGET_EXCEEDED
            # and the current period's later verdicts still apply: more spend, still refused
            await publish_usage(pipeline.bootstrap, pipeline.topics.usage_raw, spend(1))
            for _ in range(300):
                (status,) = [s for s in enforcer.usage(ctx) if s.budget_id == "per-secret"]
                if status.spent_nanos > held["spent_nanos"]:
                    break
                await asyncio.sleep(0.1)
            assert status.spent_nanos > held["spent_nanos"]
            assert enforcer.check(ctx, reserve=False).decision == BUDGET_EXCEEDED

    asyncio.run(main())

"""A rate-limited budget end to end: the enforcer follows it from budget.policies, throttles
past its rate, and the refusal's usage event reaches ClickHouse's ``decisions`` as
``throttled`` through the aggregator worker (which counts a rate-only budget like any)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from enforcer import Enforcer, EnforcerConfig
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY
from schemas.records import UsageEvent
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline, publish_usage

pytestmark = pytest.mark.integration

RATED = {
    "id": "rate-acme",
    "scope": "secret",
    "match": {"org_id": "acme-rate"},
    "rate": {"requests_per_minute": 60},  # a bucket of 2
}


async def decide_and_publish(pipeline: Pipeline) -> list[UsageEvent]:
    [budget] = budgets_from_yaml([RATED])
    await publish(
        pipeline.bootstrap,
        pipeline.topics.budget_policies,
        [(budget.budget_id.encode(), BUDGET_POLICY.encode(budget.to_record(datetime.now(UTC))))],
    )
    config = EnforcerConfig(bootstrap=pipeline.bootstrap, topic_prefix=pipeline.topics.prefix)
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        while "rate-acme" not in enforcer.state.budgets:
            await asyncio.sleep(0.05)
        ctx = enforcer.context(
            org_id="acme-rate",
            secret_id="sk-rate",
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            input_tokens=100,
            max_output_tokens=100,
        )
        decisions = [enforcer.check(ctx) for _ in range(3)]
    assert [d.decision for d in decisions] == ["allowed", "allowed", "throttled"]
    refusal = decisions[2].refusal_event()
    assert refusal is not None
    await publish_usage(pipeline.bootstrap, pipeline.topics.usage_raw, [refusal])
    return [refusal]


def test_a_throttled_refusal_is_a_throttled_row_of_decisions(pipeline: Pipeline) -> None:
    [refusal] = asyncio.run(decide_and_publish(pipeline))
    query = (
        "SELECT decision, outcome, status_code, decision_budget_id, refused FROM decisions "
        f"WHERE event_id = '{refusal['event_id']}'"
    )
    rows = pipeline.sql_until(query, lambda rows: len(rows) == 1)
    assert rows == [["throttled", "refused", 429, "rate-acme", 1]]

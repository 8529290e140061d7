"""An enforcer cut off from the broker: its fail mode as configured, then recovery."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from enforcer import Enforcer, EnforcerConfig
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.faults]


async def decisions_until(enforcer: Enforcer, ctx: Any, wanted: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    decision = enforcer.peek(ctx).decision
    while decision != wanted and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        decision = enforcer.peek(ctx).decision
    return decision


@pytest.mark.parametrize("fail_mode", ["closed", "open"])
async def test_broker_gone_then_back(local_broker: Any, fail_mode: str) -> None:
    topics = Topics(prefix=f"cut{uuid.uuid4().hex[:8]}.")
    await ensure_topics(local_broker.bootstrap, topics, partitions=2)
    budget = budgets_from_yaml(
        # no price table here: the budget admits the unpriced checks this test makes
        [
            {
                "id": "org",
                "scope": "org",
                "window": "month",
                "limit_usd": "10",
                "unpriced": "allow_free",
            }
        ]
    )[0]
    await publish(
        local_broker.bootstrap,
        topics.budget_policies,
        [(b"org", BUDGET_POLICY.encode(budget.to_record(datetime.now(UTC))))],
    )
    config = EnforcerConfig(
        bootstrap=local_broker.bootstrap,
        topic_prefix=topics.prefix,
        fail_mode=fail_mode,
        grace_s=3.0,
    )
    async with Enforcer(config) as enforcer:
        await enforcer.wait_ready(60)
        ctx = enforcer.context(org_id="acme", secret_id="sk-1")
        assert enforcer.peek(ctx).decision == "allowed"

        await asyncio.to_thread(local_broker.stop)
        try:
            wanted = "failed_closed" if fail_mode == "closed" else "failed_open"
            decision = await decisions_until(enforcer, ctx, wanted, timeout=30)
            assert decision == wanted
            refused = enforcer.peek(ctx)
            if fail_mode == "closed":
                assert refused.status == 503 and refused.retry_after == 30
            else:
                assert refused.allowed
            print(f"cut off: {refused.decision} after the {config.grace_s:g}s grace")
        finally:
            await asyncio.to_thread(local_broker.start)
        # back: the follower reconnects by itself and decisions are fresh again
        assert await decisions_until(enforcer, ctx, "allowed", timeout=60) == "allowed"

"""Refusal events go through the ingest publisher that ``spendbus enforcer serve`` wires in
(its spool and retries): one made while the broker is away is spooled, and reaches
usage.raw once the broker is back. Our own broker (``local_broker``): it is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from enforcer import EnforcerConfig
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, USAGE_EVENT
from schemas.topics import Topics
from spendbus.commands.enforcer import serve_publishing_refusals
from spendbus.stack.compacted import publish
from spendbus.stack.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PARTITIONS = 2


async def usage_events(bootstrap: str, topic: str, count: int, timeout: float) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                out.extend((m.key, USAGE_EVENT.decode(m.value)) for m in messages)
        return out
    finally:
        await consumer.stop()


async def test_a_refusal_made_while_the_broker_is_away_arrives_after(
    local_broker: Any, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"refspool{uuid.uuid4().hex[:8]}.")
    await ensure_topics(local_broker.bootstrap, topics, partitions=PARTITIONS)
    # an enforce USD budget and no price table: every check is refused (model_unpriced)
    budget = budgets_from_yaml(
        [{"id": "org", "scope": "org", "window": "month", "limit_usd": "10"}]
    )[0]
    await publish(
        local_broker.bootstrap,
        topics.budget_policies,
        [(b"org", BUDGET_POLICY.encode(budget.to_record(datetime.now(UTC))))],
    )
    config = EnforcerConfig(
        bootstrap=local_broker.bootstrap,
        topic_prefix=topics.prefix,
        sidecar_port=0,
        sidecar_token="spool-test-token",
        grace_s=600.0,  # the verdicts stay fresh while the broker is away
    )
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        serve_publishing_refusals(config, tmp_path / "spool", lambda s: started.set_result(s.port))
    )
    try:
        port = await asyncio.wait_for(started, 60)
        url = f"http://127.0.0.1:{port}"
        ctx = {"org_id": "acme", "secret_id": "sk-1", "provider": "anthropic", "model": "m-x"}
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                if (await http.get(f"{url}/readyz")).status == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the sidecar did not become ready")
            await asyncio.to_thread(local_broker.stop)
            try:
                auth = {"Authorization": "Bearer spool-test-token"}
                answer = await (await http.post(f"{url}/v1/check", json=ctx, headers=auth)).json()
                assert not answer["allowed"] and answer["published"], answer
                assert answer["body"]["reason"] == "model_unpriced"
                metrics = await (await http.get(f"{url}/metrics")).text()
                # handed to the publisher's spool, with no broker to take it
                assert 'spendbus_enforcer_refusals_published_total{result="ok"} 1.0' in metrics
                assert any((tmp_path / "spool").iterdir())
            finally:
                await asyncio.to_thread(local_broker.start)
        events = await usage_events(local_broker.bootstrap, topics.usage_raw, 1, timeout=90)
        assert len(events) == 1, events
        key, event = events[0]
        assert key == b"acme" and event["outcome"] == "refused"
        assert event["decision_budget_id"] == "org" and event["model"] == "m-x"
        assert event["input_tokens"] == 0 and event["output_tokens"] == 0
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving

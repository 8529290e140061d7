"""A rolling:2m budget spent to its limit, with no traffic afterwards, admits its key again
once the spend has left the window, and its refusal said when (issue 37).

On the real path: the broker, the aggregator worker with its ClickHouse store, and the
gateway with its enforcer following the verdicts, called with a real HTTP client. The
enforcer's clock is injected, so two minutes pass without waiting for them. The worker
is on the real clock, and so are the events. Afterwards the verdict, ClickHouse's
budget_history and `verify` agree on the counter and its buckets.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from aggregator.replay.verify import verify_counters
from runtime.topic_reader import read_latest_values
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, VERDICT
from schemas.ids import counter_key
from schemas.periods import ROLLING_BUCKETS, parse_window, to_micros
from schemas.pricing import default_price_file, load_price_file
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.enforcer.kit import FakeClock
from tests.gateway.kit import KEY_OF, eventually, gateway_stack, request_for
from tests.pipeline_kit import Pipeline, poll

pytestmark = pytest.mark.integration

ROLLING = Budget(
    budget_id="two-minutes",
    scope="secret",
    window=parse_window("rolling:2m"),
    match={"org_id": ("acme",)},
    limit_requests=2,
)
COUNTER = ("two-minutes", "acme", "sk-anthropic")


def iso_z(us: int) -> str:
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    return at.isoformat().replace("+00:00", "Z")


async def publish_reference(bootstrap: str, topics: Topics) -> None:
    """The prices and the budget, before the worker starts (the gateway's stack publishes
    the same records again: compacted, one value per key)."""
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
    )
    now = datetime.now(UTC)
    await publish(
        bootstrap,
        topics.budget_policies,
        [(ROLLING.budget_id.encode(), BUDGET_POLICY.encode(ROLLING.to_record(now)))],
    )


async def spend_wait_and_come_back(
    bootstrap: str, topics: Topics, home: Path, clock: FakeClock
) -> None:
    path, body, key = request_for("anthropic-messages", False)
    headers = {"x-api-key": KEY_OF["sk-anthropic"], "anthropic-version": "2023-06-01"}
    assert key == KEY_OF["sk-anthropic"]
    async with (
        gateway_stack(bootstrap, topics, home, budgets=[ROLLING], clock=clock) as stack,
        aiohttp.ClientSession() as session,
    ):
        state = stack.enforcer.state

        def held_requests() -> int:
            verdict = state.verdicts.get(COUNTER)
            return -1 if verdict is None else verdict.spent_requests

        for _ in range(2):
            async with session.post(stack.url + path, json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        # the worker counts both: the verdict the enforcer holds reaches the limit
        await eventually(lambda: held_requests() == 2, timeout=90)
        allowed = await stack.events(2)  # in time order
        first_us = to_micros(allowed[0]["occurred_at"])
        width = ROLLING.window.bucket_us
        # one more request fits once the first one's bucket has left the window
        reopens_us = (first_us // width + ROLLING_BUCKETS) * width
        now_us = int(clock() * 1_000_000)

        async with session.post(stack.url + path, json=body, headers=headers) as resp:
            assert resp.status == 402
            refusal = await resp.json()
            assert refusal["error"] == "budget_exceeded" and refusal["reason"] == "exhausted"
            assert refusal["budget_id"] == "two-minutes"
            assert refusal["reset_at"] == iso_z(reopens_us)
            assert resp.headers["Retry-After"] == str(-(-(reopens_us - now_us) // 1_000_000))
        # the refusal is on the ledger, counted in no limit: the spend stays where it was
        outcomes = sorted(e["outcome"] for e in await stack.events(3))
        assert outcomes == ["allowed", "allowed", "refused"]
        await asyncio.sleep(1.0)
        assert held_requests() == 2

        # no traffic; the enforcer's clock moves on to just before the bucket leaves
        clock.set(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=reopens_us - 1))
        assert not stack.enforcer.peek(
            stack.enforcer.context(org_id="acme", secret_id="sk-anthropic")
        ).allowed
        clock.set(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=reopens_us))
        verdict = state.verdicts[COUNTER]
        assert verdict.spent_requests == 2  # no new verdict: the enforcer dropped the bucket
        async with session.post(stack.url + path, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        await stack.publisher.flush(30)


def test_a_rolling_budget_reopens_with_no_traffic_and_said_when(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    pipeline = Pipeline(kafka_bootstrap, topics, tmp_path / "worker", clickhouse_dsn)
    asyncio.run(publish_reference(kafka_bootstrap, topics))
    pipeline.worker.start(timeout=180)
    try:
        clock = FakeClock(datetime.now(UTC))
        asyncio.run(spend_wait_and_come_back(kafka_bootstrap, topics, tmp_path, clock))
        # four events: two allowed, one refused, the one admitted after the clock moved
        pipeline.stats_until(lambda stats: stats.get("events", 0) >= 4)
        rows = pipeline.sql_until(
            "SELECT spent_requests, events FROM budget_history WHERE budget_id = 'two-minutes'",
            lambda rows: bool(rows) and int(rows[0][1]) == 4,
        )
        # ClickHouse holds the window as of its newest event, on the real clock: all three
        # allowed requests are within two minutes of each other there
        assert [int(v) for v in rows[0]] == [3, 4]
        report = poll(
            lambda: asyncio.run(
                verify_counters(kafka_bootstrap, topics, history_query=pipeline.sql)
            ),
            lambda report: report.ok,
            timeout=30,
        )
        assert report.ok, report.differences[:5]
        assert report.rolling, "the rolling counter's buckets were compared with the store's"
        # a verdict whose spend is right but whose buckets would leave at other times is
        # found: the enforcers expire what the buckets say
        key = counter_key(COUNTER[0], COUNTER[1:])
        live = asyncio.run(read_latest_values(kafka_bootstrap, topics.budget_verdicts))
        value = live[key.encode()]
        assert value is not None
        verdict = VERDICT.decode(value)
        forged = {
            **verdict,
            "seq": verdict["seq"] + 1,
            "bucket_ages": [age + 1 for age in verdict["bucket_ages"]],
        }
        asyncio.run(
            publish(
                kafka_bootstrap, topics.budget_verdicts, [(key.encode(), VERDICT.encode(forged))]
            )
        )
        report = asyncio.run(verify_counters(kafka_bootstrap, topics))
        assert [(d.counter_key, d.field) for d in report.differences] == [(key, "buckets")]
    finally:
        pipeline.worker.stop()

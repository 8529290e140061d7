"""Counters that count nothing any more are pruned (issue 37 item 4, seed 003): the counters
of a removed budget and a session counter idle past the session time leave the state, with a
tombstone on the counters' changelog and on the verdict topic; a restart does not bring them
back; a budget defined again is counted again from its period's start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer

from aggregator.config import AggregatorConfig
from aggregator.counting.fold import CounterState, PeriodTotals
from aggregator.counting.process import BatchProcessor
from aggregator.counting.pruning import find_prunable
from aggregator.counting.reference import Reference
from aggregator.counting.stage import CountingStage
from aggregator.counting.state import CountingStore
from aggregator.metrics import Metrics
from runtime.topic_reader import read_latest_values
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import BUDGET_POLICY, USAGE_EVENT, VERDICT
from schemas.ids import counter_key
from schemas.records import UsageEvent
from schemas.topics import Topics, usage_raw_key
from schemas.usage import new_usage_event
from tests.pipeline_kit import price_book

BUDGETS_YAML = """
- {id: per-secret, scope: secret, window: month, limit_usd: "100"}
- {id: doomed, scope: org, window: month, limit_usd: "100"}
- {id: per-job, scope: session, window: total, limit_requests: 100}
"""
HOUR_US = 3_600_000_000


def _budgets() -> dict[str, Budget]:
    return {b.budget_id: b for b in budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))}


def _state(newest_us: int) -> CounterState:
    return CounterState(period="total", periods={"total": PeriodTotals(1, 1, 1, newest_us)})


def test_the_counters_of_removed_budgets_and_idle_sessions_are_found() -> None:
    budgets = {k: v for k, v in _budgets().items() if k != "doomed"}
    now_us = 1_800_000_000_000_000
    counters = {
        counter_key("per-secret", ["acme", "sk-1"]): _state(now_us - 900 * HOUR_US),
        counter_key("doomed", ["acme"]): _state(now_us),
        counter_key("per-job", ["acme", "bob", "job-old"]): _state(now_us - 2 * HOUR_US),
        counter_key("per-job", ["acme", "bob", "job-live"]): _state(now_us - HOUR_US // 2),
        "not a composed key": _state(0),
    }
    found = find_prunable(counters, budgets, now_us, HOUR_US)
    assert found.removed_budget == [counter_key("doomed", ["acme"])]
    assert found.idle_session == [counter_key("per-job", ["acme", "bob", "job-old"])]
    assert found.budgets_gone == {"doomed"}
    # a calendar counter is never idle-pruned, however old its last event
    assert counter_key("per-secret", ["acme", "sk-1"]) not in found.keys


def _event(n: int, at: datetime, session: str) -> UsageEvent:
    return new_usage_event(
        event_id=f"prune-{n:03d}",
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4-5",
        secret_id="sk-1",
        org_id="acme",
        user_id="bob",
        session_id=session,
        gateway_id="prune",
        input_tokens=1_000 + n,
        output_tokens=10,
        occurred_at=at,
    )


@pytest.mark.integration
def test_pruned_counters_leave_state_and_verdicts_and_a_budget_defined_again_recounts(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    config = AggregatorConfig(
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        app_id=f"{topics.prefix}agg",
        data_dir=tmp_path / "worker",
        commit_seconds=0.2,
        prune_seconds=0.2,
        session_idle_seconds=3600,
    )
    now = datetime.now(UTC)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    early = max(month_start, now - timedelta(hours=3))  # in this month, idle past the hour
    events = [_event(n, early, "job-old") for n in range(3)]
    events += [_event(n, now, "job-live") for n in range(3, 6)]
    prices = price_book()
    doomed_key = counter_key("doomed", ["acme"])
    old_job = counter_key("per-job", ["acme", "bob", "job-old"])
    live_job = counter_key("per-job", ["acme", "bob", "job-live"])
    reference = Reference()
    reference.prices = prices
    policies = {b.budget_id: BUDGET_POLICY.encode(b.to_record(now)) for b in _budgets().values()}
    for budget_id, policy in policies.items():
        reference.apply_policy(budget_id.encode(), policy)

    async def until(predicate: Callable[[], bool], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while not predicate():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.1)

    async def verdicts() -> dict[str, int | None]:
        """Each counter's last verdict on the topic: its spend, None for a tombstone."""
        values = await read_latest_values(kafka_bootstrap, topics.budget_verdicts)
        return {
            key.decode(): None if value is None else VERDICT.decode(value)["spent_nanos"]
            for key, value in values.items()
        }

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for event in events:
                await producer.send_and_wait(
                    topics.usage_raw, USAGE_EVENT.encode(event), usage_raw_key("acme")
                )
        finally:
            await producer.stop()
        ready = asyncio.Event()
        ready.set()
        metrics = Metrics()
        stage = CountingStage(
            config, topics, BatchProcessor(reference, source_topic=topics.usage_raw), metrics, ready
        )
        await stage.start()
        try:
            await until(lambda: metrics.totals.get("events", 0) >= len(events), "folded")
            # the idle job goes at the next sweep; the live one and the budgets' stay
            await until(lambda: metrics.totals.get("pruned_idle_session", 0) == 1, "idle pruned")
            counters = {k for s in stage.store.partitions.values() for k in s.counters}
            assert old_job not in counters and {doomed_key, live_job} <= counters
            # the budget removed: its counter goes, with its verdict
            reference.apply_policy(b"doomed", None)
            await until(lambda: metrics.totals.get("pruned_removed_budget", 0) == 1, "removed")
            # the next checkpoint delivers the tombstones
            deadline = asyncio.get_running_loop().time() + 60
            seen = await verdicts()
            while seen.get(doomed_key, 0) is not None or seen.get(old_job, 0) is not None:
                assert asyncio.get_running_loop().time() < deadline, seen
                await asyncio.sleep(0.2)
                seen = await verdicts()
            assert (seen[live_job] or 0) > 0
        finally:
            await stage.stop()

        # the changelog's tombstones: a restore from scratch has neither counter
        scratch = CountingStore(
            tmp_path / "scratch", config.counter_changelog, config.seen_changelog
        )
        await scratch.recover(kafka_bootstrap, set(range(4)))
        restored = {k for s in scratch.partitions.values() for k in s.counters}
        assert doomed_key not in restored and old_job not in restored and live_job in restored
        scratch.drop(set(range(4)))

        # defined again, the budget counts its period again: every event of this month
        reference.apply_policy(b"doomed", policies["doomed"])
        metrics = Metrics()
        stage = CountingStage(
            config, topics, BatchProcessor(reference, source_topic=topics.usage_raw), metrics, ready
        )
        await stage.start()
        try:
            want = sum(prices.price_event(e).cost_nanos for e in events)

            def recounted() -> bool:
                for store in stage.store.partitions.values():
                    state = store.counters.get(doomed_key)
                    if state is not None:
                        return state.periods[state.period].nanos == want
                return False

            await until(recounted, "recounted")
            # the re-read folds the idle job's events into a counter without a fence again:
            # it is back until the next sweep prunes it once more
            await until(
                lambda: all(old_job not in s.counters for s in stage.store.partitions.values()),
                "pruned again",
            )
        finally:
            await stage.stop()

    asyncio.run(scenario())

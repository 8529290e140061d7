"""Seeding a generation worker from a snapshot, so it starts past offset 0.

:func:`seed_generation` writes the snapshot (``snapshots.py``) into the generation's
counting changelogs (the encoding ``aggregator.counting.state`` recovers), publishes
each counter's verdict, and commits the generation's group at the fences, so the worker
recovers the state and reads on from there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from aggregator.config import AggregatorConfig
from aggregator.counting.batch_output import VerdictChange
from aggregator.counting.changelogs import ensure_changelogs
from aggregator.counting.counter_codec import encode_counter
from aggregator.counting.fold import CounterState
from aggregator.counting.reference import Reference
from aggregator.replay.snapshots import FoldState, ledger_ends
from runtime.kafka import committed_offsets, topic_partitions
from schemas.errors import ConfigError
from schemas.ids import decompose


@dataclass(frozen=True)
class SeedResult:
    """What :func:`seed_generation` wrote for one generation."""

    counters: int
    dedupe_entries: int
    verdicts: int
    #: counters whose budget is gone: seeded, but no verdict (the counting stage sends none)
    without_budget: int
    #: usage.raw partition -> the offset the generation's group was committed at
    fences: dict[int, int]


async def seed_generation(
    config: AggregatorConfig, state: FoldState, reference: Reference
) -> SeedResult:
    """Make a fresh generation's worker start from ``state`` (a snapshot) instead of offset 0.

    In this order (a crash before step 4 leaves a group without offsets: seeding again
    rewrites the same compacted values, so it is safe to retry):

    1. refuse a generation whose counting group has committed offsets already (its
       workers ran: seeding would move them back), or a snapshot of another ledger;
    2. create the two changelog topics exactly as the counting stage does;
    3. write every counter and dedupe entry into changelog partition = source partition,
       in the encoding ``aggregator.counting.state`` recovers, and each counter's verdict (the
       counting stage's own ``VerdictChange.encode``) into the generation's verdict topic:
       a counter no later event touches would otherwise never get one. All acknowledged;
    4. commit the counting group's usage.raw offsets at the snapshot's fences (a manual
       commit; the group has no members yet). The worker then recovers the changelogs and
       reads on from the fences.
    """
    # Step 1
    partitions = await _check_seedable(config, state)
    # Step 2: the counting stage's own code (topic config, partitions) creates them
    await ensure_changelogs(config, config.topics)
    # Step 3
    verdicts, without_budget = await _write_state(config, state, reference)
    # Step 4
    fences = {tp.partition: state.fences.get(tp.partition, 0) for tp in partitions}
    await _commit_fences(config, partitions, fences)
    return SeedResult(len(state.counters), len(state.seen), verdicts, without_budget, fences)


async def _check_seedable(config: AggregatorConfig, state: FoldState) -> list[TopicPartition]:
    """The generation's usage.raw partitions, once its group never committed and the
    snapshot's partitions and fences fit this ledger; ConfigError if not."""
    topics = config.topics
    bootstrap = config.bootstrap
    security = config.kafka_security
    group = config.counting_group
    if await committed_offsets(bootstrap, group, security=security):
        raise ConfigError(
            f"consumer group {group} has committed offsets already: its generation was "
            "started before and cannot be seeded from a snapshot (replay into a new name)"
        )
    partitions = await topic_partitions(bootstrap, topics.usage_raw, security=security)
    numbers = {tp.partition for tp in partitions}
    foreign = sorted(set(state.fences) - numbers)
    if foreign:
        raise ConfigError(
            f"the snapshot has partitions {foreign} that {topics.usage_raw} does not have "
            f"({len(numbers)} partitions): it was taken of another ledger"
        )
    ends = await ledger_ends(bootstrap, topics, security=security)
    for partition, fence in state.fences.items():
        if fence > ends[partition]:
            raise ConfigError(
                f"{topics.usage_raw}[{partition}]: snapshot fence {fence} is past the end "
                f"{ends[partition]}: it was taken of another ledger"
            )
    return partitions


async def _write_state(
    config: AggregatorConfig, state: FoldState, reference: Reference
) -> tuple[int, int]:
    """Every counter, its verdict and every dedupe entry, all acknowledged; (verdicts
    sent, counters without a budget)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=config.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=20,
        max_request_size=4 * 1024 * 1024,
        **config.kafka_security.client_kwargs(),
    )
    await producer.start()
    verdicts = without_budget = 0
    emitted_at = datetime.now(UTC)
    try:
        futures: list[asyncio.Future[Any]] = []
        for key, (partition, data) in sorted(state.counters.items()):
            counter = CounterState.from_json(data)
            futures.append(
                await producer.send(
                    config.counter_changelog,
                    key=key.encode(),
                    value=encode_counter(counter),
                    partition=partition,
                )
            )
            if not counter.period:
                continue  # never applied an event: the counting stage sends no verdict
            budget_id, *scope_values = decompose(key)
            budget = reference.budgets.get(budget_id)
            if budget is None:
                without_budget += 1
                continue
            change = VerdictChange(budget, tuple(scope_values), counter)
            futures.append(
                await producer.send(
                    config.topics.budget_verdicts,
                    key=key.encode(),
                    value=change.encode(key, emitted_at),
                )
            )
            verdicts += 1
        for event_id, (partition, position) in state.seen.items():
            futures.append(
                await producer.send(
                    config.seen_changelog,
                    key=event_id.encode(),
                    value=position.encode(),
                    partition=partition,
                )
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return verdicts, without_budget


async def _commit_fences(
    config: AggregatorConfig, partitions: list[TopicPartition], fences: dict[int, int]
) -> None:
    """The counting group's usage.raw offsets committed at ``fences`` (no members yet)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=config.bootstrap,
        group_id=config.counting_group,
        enable_auto_commit=False,
        **config.kafka_security.client_kwargs(),
    )
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.commit({tp: fences[tp.partition] for tp in partitions})
    finally:
        await consumer.stop()

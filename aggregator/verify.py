"""Recompute every counter from the ledger and compare with what the pipeline shows.

The fold is deterministic (windows and prices by event time), so reading
usage.raw from the start through the same :class:`BatchProcessor` must give
the counters that the live verdicts show. ``verify`` does that in memory,
without touching the running generation, and lists every difference: the
check an SRE runs after an incident, and the first half of a replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from aggregator.fold import CounterState
from aggregator.process import BatchProcessor, BatchStats, RawRecord
from aggregator.reference import Reference, ReferenceFollower
from schemas.codec import VERDICT
from schemas.errors import ContractError
from schemas.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from schemas.topics import Topics

#: called with (records read so far, records to read)
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Difference:
    counter_key: str
    field: str
    recomputed: Any
    live: Any


@dataclass
class VerifyReport:
    records: int = 0
    counters: int = 0
    stats: BatchStats = field(default_factory=BatchStats)
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


async def _read_to_end(
    bootstrap: str,
    topic_list: list[str],
    batch: Callable[[list[Any]], None],
    progress: Progress | None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Read ``topic_list`` from the beginning to the end offsets seen at start, in batches."""
    partitions = await topic_partitions(bootstrap, *topic_list, security=security)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        **security.client_kwargs(),
    )
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        total = sum(ends.values())
        pending = {tp for tp in partitions if ends[tp] > 0}
        read = 0
        while pending:
            fetched = await consumer.getmany(*pending, timeout_ms=1000, max_records=5000)
            for tp, messages in fetched.items():
                messages = [m for m in messages if m.offset < ends[tp]]
                batch(messages)
                read += len(messages)
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
            if progress is not None:
                progress(read, total)
        return read
    finally:
        await consumer.stop()


async def recompute(
    bootstrap: str,
    topics: Topics,
    progress: Progress | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> tuple[dict[str, CounterState], VerifyReport, Reference]:
    """Fold all of usage.raw in memory: the counters as a fresh generation would hold them."""
    reference = Reference()
    follower = ReferenceFollower(bootstrap, topics, reference, security=security)
    await follower.start()
    try:
        await asyncio.wait_for(follower.ready.wait(), timeout=60)
    finally:
        await follower.stop()
    processor = BatchProcessor(reference, source_topic=topics.usage_raw, stage="verify")
    counters: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    report = VerifyReport()

    def fold(messages: list[Any]) -> None:
        records = [RawRecord(m.partition, m.offset, m.key, m.value, m.timestamp) for m in messages]
        out = processor.process(
            records, lambda _, key: counters.get(key), lambda _, key: seen.get(key)
        )
        for (_, counter), state in out.counter_writes.items():
            counters[counter] = state
        for (_, event_id), position in out.seen_writes.items():
            seen[event_id] = position
        for name in ("events", "charged", "duplicates", "dead_letters", "unpriced", "cost_nanos"):
            setattr(report.stats, name, getattr(report.stats, name) + getattr(out.stats, name))

    report.records = await _read_to_end(
        bootstrap, [topics.usage_raw], fold, progress, security=security
    )
    states = {key: CounterState.from_json(value) for key, value in counters.items()}
    report.counters = len(states)
    return states, report, reference


async def verify(
    bootstrap: str,
    topics: Topics,
    progress: Progress | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> VerifyReport:
    """Recompute, then compare each counter's newest period with its live verdict."""
    states, report, _ = await recompute(bootstrap, topics, progress, security=security)
    live: dict[str, dict[str, Any]] = {}

    def keep(messages: list[Any]) -> None:
        for m in messages:
            if m.key is None:
                continue
            if m.value is None:
                live.pop(m.key.decode(), None)
                continue
            try:
                live[m.key.decode()] = VERDICT.decode(m.value)
            except ContractError:
                continue

    await _read_to_end(bootstrap, [topics.budget_verdicts], keep, None, security=security)
    for key, state in sorted(states.items()):
        verdict = live.get(key)
        if verdict is None:
            report.differences.append(Difference(key, "verdict", "present", "missing"))
            continue
        totals = state.periods[state.period]
        for name, mine, theirs in (
            ("period", state.period, verdict["period"]),
            ("spent_nanos", totals.nanos, verdict["spent_nanos"]),
            ("spent_tokens", totals.tokens, verdict["spent_tokens"]),
            ("spent_requests", totals.requests, verdict["spent_requests"]),
        ):
            if mine != theirs:
                report.differences.append(Difference(key, name, mine, theirs))
    for key in sorted(set(live) - set(states)):
        report.differences.append(Difference(key, "verdict", "missing", "present"))
    return report

"""Fold the ledger in memory, and counter snapshots that let a fold start past offset 0.

``fold_ledger`` runs usage.raw through the same :class:`BatchProcessor` the
workers run, in memory, from offset 0 or from a :class:`Snapshot`, up to the
end offsets seen when it starts (or given ones). What it returns is exactly
the state a worker of a fresh generation holds after reading the same
offsets: the counters (with their per-partition offset fences), the event-id
dedupe entries, and where each partition was read to.

A snapshot is that state written to the compacted ``Topics.counter_snapshots``
topic (docs/replay.md), with its *fence* per partition: the next ledger offset
it has not read. Starting a fold at the fences with the snapshot's state gives
the same result as folding from 0 (``tests/replay/test_snapshots.py`` holds it
to that): the counters carry their own fences, and the dedupe entries travel
with them, so an event id published before the fence and again after is still
charged once.

Record layout on the topic (keys are UTF-8; values JSON):

* ``<id>|<partition>|c|<n>``: chunk n of the partition's counters ``{key: state}``
* ``<id>|<partition>|s|<n>``: chunk n of the partition's dedupe entries ``{event_id: position}``
* ``<id>|manifest``: ``{"fences": {partition: next offset}, "chunks": {partition: [c, s]},
  "orgs": {org: [events, nanos]}, "stats": {...}}``, written last: a snapshot
  without its manifest is incomplete and never read. Snapshot ids sort by time.
Older snapshots' keys are tombstoned once a newer manifest is acknowledged.

``seeding.py`` starts a real generation worker from a snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from aggregator.counting.batch_output import BatchStats
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.reference import Reference, ReferenceFollower
from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import read_latest_values, read_until
from schemas.codec import PRICED_USAGE, USAGE_EVENT
from schemas.errors import ConfigError, ContractError
from schemas.topics import Topics

#: called with (records read so far, records to read)
Progress = Callable[[int, int], None]
#: called with (counter key, CounterState.to_json()) after each change
CounterListener = Callable[[str, dict[str, Any]], None]
#: counters or dedupe entries per snapshot record (stays well under Kafka's 1 MB message limit)
CHUNK: Final = 500
#: per-partition fetch size of the ledger fold and the snapshot reads (large records, many)
_FETCH_BYTES: Final = 8 * 1024 * 1024
_STAT_FIELDS: Final = ("events", "charged", "duplicates", "dead_letters", "unpriced", "cost_nanos")


@dataclass
class FoldState:
    """Everything a fresh generation's worker holds after reading the ledger up to ``fences``."""

    #: counter key -> (source partition, CounterState.to_json())
    counters: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    #: event id (or unpriced-model marker) -> (source partition, "partition:offset")
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: partition -> next ledger offset not read
    fences: dict[int, int] = field(default_factory=dict)
    #: org -> [charged events, cost nanos]
    orgs: dict[str, list[int]] = field(default_factory=dict)
    stats: BatchStats = field(default_factory=BatchStats)

    def canonical(self) -> bytes:
        """The counters as bytes that equal exactly when the counters do (sorted, compact):
        two replays of one ledger give byte-identical output."""
        return json.dumps(
            {key: state for key, (_, state) in sorted(self.counters.items())},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    def org_spend(self) -> dict[str, int]:
        return {org: nanos for org, (_, nanos) in self.orgs.items()}


@dataclass(frozen=True)
class Bounds:
    """An event-time slice of the ledger for investigations (``--since`` / ``--until``)."""

    since: datetime | None = None
    until: datetime | None = None

    def keeps(self, value: bytes | None) -> bool:
        if self.since is None and self.until is None:
            return True
        try:
            occurred: datetime = USAGE_EVENT.decode(value)["occurred_at"]  # type: ignore[arg-type]  # None: ContractError
        except ContractError:
            return True  # the processor dead-letters it and counts it
        return (self.since is None or occurred >= self.since) and (
            self.until is None or occurred < self.until
        )


async def load_reference(
    bootstrap: str, topics: Topics, timeout_s: float = 60.0, *, security: KafkaSecurity = PLAINTEXT
) -> Reference:
    """Budgets and price versions as they are now (read whole from their compacted topics)."""
    reference = Reference()
    follower = ReferenceFollower(bootstrap, topics, reference, security=security)
    await follower.start()
    try:
        await follower.wait_ready(timeout_s)
    finally:
        await follower.stop()
    return reference


async def ledger_ends(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> dict[int, int]:
    """The end offset of every usage.raw partition now."""
    partitions = await topic_partitions(bootstrap, topics.usage_raw, security=security)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, **security.client_kwargs()
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items()}


async def fold_ledger(
    bootstrap: str,
    topics: Topics,
    reference: Reference,
    *,
    start: FoldState | None = None,
    until: dict[int, int] | None = None,
    bounds: Bounds | None = None,
    progress: Progress | None = None,
    on_counter: CounterListener | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> FoldState:
    """Fold usage.raw from ``start``'s fences (or 0) to ``until`` (default: the ends now).

    ``on_counter`` (slower: the fold goes record by record) sees every state each counter
    passes through, e.g. to find the state a verdict of a given seq showed."""
    state = start if start is not None else FoldState()
    bounds = bounds if bounds is not None else Bounds()
    processor = BatchProcessor(reference, source_topic=topics.usage_raw, stage="replay")
    partitions = await topic_partitions(bootstrap, topics.usage_raw, security=security)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        max_partition_fetch_bytes=_FETCH_BYTES,
        **security.client_kwargs(),
    )
    await consumer.start()
    try:
        consumer.assign(partitions)
        ends = (
            until
            if until is not None
            else {tp.partition: end for tp, end in (await consumer.end_offsets(partitions)).items()}
        )
        stops: dict[TopicPartition, int] = {}
        total = 0
        for tp in partitions:
            begin = state.fences.get(tp.partition, 0)
            end = stops[tp] = ends.get(tp.partition, 0)
            if begin > end:
                raise ConfigError(
                    f"{tp.topic}[{tp.partition}]: start offset {begin} is past the end {end}"
                )
            state.fences[tp.partition] = begin
            consumer.seek(tp, begin)
            total += end - begin
        read = 0
        async for tp, messages in read_until(consumer, stops, max_records=20_000):
            if on_counter is None:
                _fold(processor, state, messages, bounds)
            else:
                for message in messages:
                    _fold(processor, state, [message], bounds, on_counter)
            state.fences[tp.partition] = messages[-1].offset + 1
            read += len(messages)
            if progress is not None:
                progress(read, total)
        state.fences.update((tp.partition, end) for tp, end in stops.items())
        return state
    finally:
        await consumer.stop()


def _fold(
    processor: BatchProcessor,
    state: FoldState,
    messages: list[Any],
    bounds: Bounds,
    on_counter: CounterListener | None = None,
) -> None:
    records = [
        RawRecord(m.partition, m.offset, m.key, m.value, m.timestamp)
        for m in messages
        if bounds.keeps(m.value)
    ]
    counters, seen = state.counters, state.seen

    def counter(_: int, key: str) -> Any:
        held = counters.get(key)
        return None if held is None else held[1]

    def seen_at(_: int, key: str) -> Any:
        held = seen.get(key)
        return None if held is None else held[1]

    out = processor.process(records, counter, seen_at)
    for (partition, key), value in out.counter_writes.items():
        counters[key] = (partition, value)
        if on_counter is not None:
            on_counter(key, value)
    for (partition, key), position in out.seen_writes.items():
        seen[key] = (partition, position)
    for name in _STAT_FIELDS:
        setattr(state.stats, name, getattr(state.stats, name) + getattr(out.stats, name))
    # spend per org, read back from what the processor priced (one entry per charged event)
    for _, org, priced, _ in out.priced:
        cost = PRICED_USAGE.decode(priced)["cost_nanos"]
        entry = state.orgs.setdefault(org.decode(), [0, 0])
        entry[0] += 1
        entry[1] += cost


# --- snapshots on the compacted topic ---------------------------------------------------


def new_snapshot_id(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("s%Y%m%dT%H%M%S%fZ")


def _chunks(items: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, value in items:
        if not out or len(out[-1]) >= CHUNK:
            out.append({})
        out[-1][key] = value
    return out


def snapshot_records(snapshot_id: str, state: FoldState) -> list[tuple[bytes, bytes]]:
    """The records of one snapshot, manifest last."""
    records: list[tuple[bytes, bytes]] = []
    chunk_counts: dict[int, list[int]] = {}
    for partition in sorted(state.fences):
        counters = _chunks(sorted((k, s) for k, (p, s) in state.counters.items() if p == partition))
        seen = _chunks(sorted((k, pos) for k, (p, pos) in state.seen.items() if p == partition))
        chunk_counts[partition] = [len(counters), len(seen)]
        for kind, chunks in (("c", counters), ("s", seen)):
            for n, chunk in enumerate(chunks):
                records.append((f"{snapshot_id}|{partition}|{kind}|{n}".encode(), _dumps(chunk)))
    manifest = {
        "fences": {str(p): f for p, f in sorted(state.fences.items())},
        "chunks": {str(p): c for p, c in sorted(chunk_counts.items())},
        "orgs": dict(sorted(state.orgs.items())),
        "stats": asdict(state.stats),
    }
    records.append((f"{snapshot_id}|manifest".encode(), _dumps(manifest)))
    return records


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def snapshot_from_records(values: dict[bytes, bytes | None]) -> tuple[str, FoldState] | None:
    """The newest complete snapshot among the topic's live values, or None."""
    manifests = sorted(
        k.decode().split("|")[0]
        for k, v in values.items()
        if v is not None and k.endswith(b"|manifest")
    )
    for snapshot_id in reversed(manifests):
        manifest = json.loads(values[f"{snapshot_id}|manifest".encode()] or b"{}")
        state = FoldState(
            fences={int(p): f for p, f in manifest["fences"].items()},
            orgs={org: list(v) for org, v in manifest["orgs"].items()},
            stats=BatchStats(**manifest["stats"]),
        )
        complete = True
        for p, (n_counters, n_seen) in manifest["chunks"].items():
            partition = int(p)
            for kind, count in (("c", n_counters), ("s", n_seen)):
                for n in range(count):
                    raw = values.get(f"{snapshot_id}|{partition}|{kind}|{n}".encode())
                    if raw is None:
                        complete = False
                        break
                    target: dict[str, Any] = state.counters if kind == "c" else state.seen
                    for key, value in json.loads(raw).items():
                        target[key] = (partition, value)
        if complete:
            return snapshot_id, state
    return None


async def latest_snapshot(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> tuple[str, FoldState] | None:
    return snapshot_from_records(
        await read_latest_values(
            bootstrap, topics.counter_snapshots, security=security, fetch_bytes=_FETCH_BYTES
        )
    )


async def write_snapshot(
    bootstrap: str,
    topics: Topics,
    state: FoldState,
    *,
    keep: int = 2,
    security: KafkaSecurity = PLAINTEXT,
) -> str:
    """Publish ``state`` as a new snapshot (manifest last), then tombstone all but the
    newest ``keep`` complete snapshots. Returns the snapshot id."""
    snapshot_id = new_snapshot_id()
    existing = await read_latest_values(
        bootstrap, topics.counter_snapshots, security=security, fetch_bytes=_FETCH_BYTES
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=4 * 1024 * 1024,
        **security.client_kwargs(),
    )
    await producer.start()
    try:
        records = snapshot_records(snapshot_id, state)
        # the manifest only after every chunk is acknowledged: a crash leaves no manifest
        sent = [
            await producer.send(topics.counter_snapshots, key=k, value=v) for k, v in records[:-1]
        ]
        for future in sent:
            await future
        key, value = records[-1]
        await (await producer.send(topics.counter_snapshots, key=key, value=value))
        complete = sorted(
            {
                k.decode().split("|")[0]
                for k, v in existing.items()
                if v and k.endswith(b"|manifest")
            }
            | {snapshot_id}
        )
        kept = set(complete[-keep:])
        stale = [
            k for k, v in existing.items() if v is not None and k.decode().split("|")[0] not in kept
        ]
        futures = [await producer.send(topics.counter_snapshots, key=k, value=None) for k in stale]
        for future in futures:
            await future
    finally:
        await producer.stop()
    return snapshot_id


def incomplete_snapshots(values: dict[bytes, bytes | None]) -> list[str]:
    """Snapshot ids whose chunks are on the topic without their manifest (never used)."""
    with_manifest = {
        k.decode().split("|")[0] for k, v in values.items() if v and k.endswith(b"|manifest")
    }
    return sorted(
        {k.decode().split("|")[0] for k, v in values.items() if v is not None} - with_manifest
    )

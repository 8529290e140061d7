"""The counting stage's state: counters and event-id dedupe per usage.raw partition.

The source of truth is two compacted changelog topics (co-partitioned with
usage.raw: changelog partition p holds the state of source partition p), written
once per counter per batch and once per new event id, and flushed before the
source offsets are committed (``counting.py``).

Each owned partition also has a local RocksDB (``<root>/<counter changelog>/<p>``)
that caches a **prefix** of both changelog partitions, Kafka-Streams style: a
checkpoint whose changelog records the broker acknowledged writes them, with the
changelog offsets they reach, in one ``WriteBatch`` (``persist``), so the store
always equals the changelogs up to its recorded offsets and is never ahead of
them. A worker given a partition opens its store, checks the recorded offsets
against the changelogs' log start and end offsets, reads only the tail past them
(``recover``) and then serves; offsets outside ``[start, end]`` (topic recreated,
records removed) wipe the store and restore from the start.

In memory: the counters (bounded by the number of counters) and the event ids of
the current checkpoint interval (``pending_seen``, bounded by
``AggregatorConfig.max_pending_event_ids``); older event ids are looked up in RocksDB.

Keys in RocksDB: ``c<counter key>`` -> the changelog value (``counter_codec.py``),
``s<event id>`` -> the position (``partition:offset``) that
first carried it, ``m:offsets`` -> JSON of the changelog topics and the offsets the
store reaches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch

from aggregator.counting.counter_codec import decode_counter, encode_counter
from aggregator.counting.fold import CounterState
from runtime.kafka import PLAINTEXT, KafkaSecurity

log = logging.getLogger(__name__)

_COUNTER = b"c"
_SEEN = b"s"
_META = b"m:offsets"
#: seconds to wait for a store another process still holds (its owner is giving it up)
OPEN_RETRY_SECONDS = 30.0


class _StoreLocked(Exception):
    """Another process (or owner) still holds a partition's RocksDB."""


def _scan(db: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key without prefix, value) pairs whose key starts with ``prefix``, in order."""
    for key, value in db.items(from_key=prefix):
        assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
        if not key.startswith(prefix):
            break
        yield key[len(prefix) :], value


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    # most dedupe lookups are misses (a new event id): a bloom filter answers them
    # without reading a data block
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    # and the same for the ids still in the memtable (a checkpoint interval's worth)
    options.set_memtable_whole_key_filtering(True)
    options.set_memtable_prefix_bloom_ratio(0.1)
    return options


@dataclass
class RecoveryStats:
    partitions: int = 0
    #: counters in memory after the recovery
    counters: int = 0
    #: event-id records (tombstones included) applied from the seen changelog
    seen: int = 0
    #: changelog records read from Kafka (both topics)
    records: int = 0
    #: partitions whose local store did not match the changelogs and was wiped
    wiped: int = 0
    #: counters loaded from the local stores
    local_counters: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class SealedPartition:
    """A partition's entries of one checkpoint, waiting for their changelog acknowledgements."""

    #: key -> changelog value (None: a pruned counter's tombstone)
    counters: dict[str, bytes | None] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)


#: what ``CountingStore.seal`` took out of the pending entries: partition -> its entries
SealedState = dict[int, SealedPartition]


@dataclass
class PartitionState:
    """One owned partition: its counters, its RocksDB and what is not persisted yet."""

    path: Path
    db: Rdict | None = None
    counters: dict[str, CounterState] = field(default_factory=dict)
    #: counters changed since the last persist: key -> the changelog value (None: pruned)
    pending_counters: dict[str, bytes | None] = field(default_factory=dict)
    #: counters changed since the last ``write_changed``: key -> the live state (not encoded)
    changed: dict[str, CounterState] = field(default_factory=dict)
    #: event ids first seen since the last seal: id -> position
    pending_seen: dict[str, str] = field(default_factory=dict)
    #: entries sealed by a checkpoint, until it persists them (still read by ``seen``)
    sealed: SealedPartition = field(default_factory=SealedPartition)
    #: changelog offsets the RocksDB reaches: {"counters": n, "seen": n}
    offsets: dict[str, int] = field(default_factory=lambda: {"counters": 0, "seen": 0})

    def seen(self, event_id: str) -> str | None:
        position = self.pending_seen.get(event_id) or self.sealed.seen.get(event_id)
        if position is not None:
            return position
        assert self.db is not None, f"the store of {self.path} is closed"
        raw = self.db.get(_SEEN + event_id.encode())
        return None if raw is None else raw.decode()


class CountingStore:
    """The state of the partitions this worker owns (see the module docstring)."""

    def __init__(self, root: Path, counters_topic: str, seen_topic: str) -> None:
        self.root = Path(root)
        self.counters_topic = counters_topic
        self.seen_topic = seen_topic
        self.partitions: dict[int, PartitionState] = {}
        #: event ids held in memory over all partitions (pending or sealed: not persisted yet)
        self.pending_seen = 0
        #: counters touched and not written since (``touch_counter`` / ``write_changed``)
        self.changed_counters = 0
        #: what the last ``recover`` did (for /stats and tests)
        self.last_recovery: RecoveryStats | None = None

    # --- the hot path ----------------------------------------------------------------
    def counter(self, partition: int, key: str) -> CounterState | None:
        return self.partitions[partition].counters.get(key)

    def seen(self, partition: int, event_id: str) -> str | None:
        return self.partitions[partition].seen(event_id)

    def touch_counter(self, partition: int, key: str, state: CounterState) -> None:
        """Keep ``state`` (the live object); its changelog value is made by the next
        ``write_changed``, once however often it changed meanwhile."""
        store = self.partitions[partition]
        store.counters[key] = state
        changed = store.changed
        if key not in changed:
            self.changed_counters += 1
        changed[key] = state  # the object the fold holds now, should it ever be replaced

    def write_changed(self) -> list[tuple[int, str, bytes]]:
        """Every counter touched since the last call: encoded as it is now, put (pending
        for the next checkpoint), and returned as (partition, key, changelog value)."""
        written: list[tuple[int, str, bytes]] = []
        for partition, store in self.partitions.items():
            if store.changed:
                put = self.put_counter
                written += [(partition, k, put(partition, k, v)) for k, v in store.changed.items()]
                store.changed = {}
        self.changed_counters = 0
        return written

    def put_counter(self, partition: int, key: str, state: CounterState) -> bytes:
        """Keep ``state`` and return its changelog value (persisted at the next checkpoint)."""
        value = encode_counter(state)
        store = self.partitions[partition]
        store.counters[key] = state
        store.pending_counters[key] = value
        return value

    def prune_counter(self, partition: int, key: str) -> None:
        """Forget a counter (pruning.py): its deletion persists with the next checkpoint,
        as its changelog's tombstone does."""
        store = self.partitions[partition]
        store.counters.pop(key, None)
        if store.changed.pop(key, None) is not None:
            self.changed_counters -= 1
        store.pending_counters[key] = None

    def put_seen(self, partition: int, event_id: str, position: str) -> None:
        pending = self.partitions[partition].pending_seen
        if event_id not in pending:
            self.pending_seen += 1
        pending[event_id] = position

    # --- checkpoints -----------------------------------------------------------------
    def seal(self) -> SealedState:
        """Take the pending entries of every partition out, for one checkpoint to persist;
        entries put afterwards are the next checkpoint's. Sealed event ids stay visible to
        ``seen`` until persisted. Entries a previous checkpoint left unpersisted join them."""
        sealed: SealedState = {}
        for partition, store in self.partitions.items():
            entry = store.sealed
            if entry.counters or entry.seen:  # not persisted yet: older, so updated in place
                entry.counters.update(store.pending_counters)
                entry.seen.update(store.pending_seen)
            else:
                entry = store.sealed = SealedPartition(store.pending_counters, store.pending_seen)
            store.pending_counters = {}
            store.pending_seen = {}
            sealed[partition] = entry
        return sealed

    def persist(
        self, reached: dict[tuple[str, int], int], sealed: SealedState | None = None
    ) -> None:
        """Write what the changelogs acknowledged into each partition's RocksDB.

        ``reached``: (changelog topic, partition) -> the offset past the last record the
        broker acknowledged. ``sealed``: the entries those records carry (``seal()``; by
        default everything pending now). Call only once every changelog record of them
        was acknowledged, and none past them is counted in ``reached``. One WriteBatch per
        partition: its entries and the offsets they reach, so the store never runs ahead
        of the changelogs.
        """
        if sealed is None:
            sealed = self.seal()
        for partition, entry in sealed.items():
            store = self.partitions.get(partition)
            if store is None or store.sealed is not entry:
                continue  # given up meanwhile, or sealed again by a later checkpoint
            counters_at = reached.get((self.counters_topic, partition), store.offsets["counters"])
            seen_at = reached.get((self.seen_topic, partition), store.offsets["seen"])
            moved = (counters_at, seen_at) != (store.offsets["counters"], store.offsets["seen"])
            if not (moved or entry.counters or entry.seen):
                continue
            unplaced = (entry.counters and (self.counters_topic, partition) not in reached) or (
                entry.seen and (self.seen_topic, partition) not in reached
            )
            if store.db is None or unplaced:
                # no acknowledgement says where these records are: leave the store behind
                # (the entries stay sealed; the next checkpoint carries them on)
                log.error("partition %d: pending state without a changelog offset", partition)
                continue
            batch = WriteBatch(raw_mode=True)
            for key, value in entry.counters.items():
                if value is None:
                    batch.delete(_COUNTER + key.encode())
                else:
                    batch.put(_COUNTER + key.encode(), value)
            for event_id, position in entry.seen.items():
                batch.put(_SEEN + event_id.encode(), position.encode())
            offsets = {"counters": counters_at, "seen": seen_at}
            batch.put(_META, self._meta(offsets))
            store.db.write(batch)
            store.offsets = offsets
            self.pending_seen -= len(entry.seen)
            store.sealed = SealedPartition()

    def _meta(self, offsets: dict[str, int]) -> bytes:
        return json.dumps(
            {"counters_topic": self.counters_topic, "seen_topic": self.seen_topic, **offsets}
        ).encode()

    # --- ownership -------------------------------------------------------------------
    def close(self, partitions: set[int] | None = None) -> None:
        """Close the RocksDB of ``partitions`` (all by default); memory state is kept."""
        for partition in self.partitions if partitions is None else partitions:
            store = self.partitions.get(partition)
            if store is not None and store.db is not None:
                store.db.close()
                store.db = None

    async def reopen(self, partitions: set[int]) -> None:
        """Reopen the stores of partitions kept across a rebalance (closed on revoke)."""
        for partition in partitions:
            store = self.partitions[partition]
            if store.db is None:
                store.db = await self._open(store.path)

    def drop(self, partitions: set[int]) -> None:
        """Give partitions up: close their stores (the files stay for a later assignment)."""
        self.close(partitions)
        for partition in partitions:
            store = self.partitions.pop(partition, None)
            if store is not None:
                self.pending_seen -= len(store.pending_seen) + len(store.sealed.seen)
                self.changed_counters -= len(store.changed)

    def event_ids(self, partition: int) -> Iterator[tuple[str, str]]:
        """Every event id of a partition with its position (persisted and pending)."""
        store = self.partitions[partition]
        assert store.db is not None
        pending, sealed = store.pending_seen, store.sealed.seen
        for key, value in _scan(store.db, _SEEN):
            event_id = key.decode()
            if event_id not in pending and event_id not in sealed:
                yield event_id, value.decode()
        yield from ((i, p) for i, p in sealed.items() if i not in pending)
        yield from pending.items()

    async def _open(self, path: Path) -> Rdict:
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + OPEN_RETRY_SECONDS
        while True:
            try:
                return Rdict(str(path), options=_options())
            except Exception as exc:  # rocksdict raises a bare Exception ("lock hold by ...")
                if "lock" not in str(exc).lower():
                    raise
                if time.monotonic() > deadline:
                    raise _StoreLocked(f"{path} is still locked by another owner: {exc}") from exc
                await asyncio.sleep(0.2)  # the previous owner is still closing it

    def _read_meta(self, db: Rdict) -> dict[str, int] | None:
        """The recorded offsets, or None if the store was written for other changelogs."""
        raw = db.get(_META)
        if raw is None:
            return {"counters": 0, "seen": 0}
        meta = json.loads(raw)
        if (meta.get("counters_topic"), meta.get("seen_topic")) != (
            self.counters_topic,
            self.seen_topic,
        ):
            return None
        return {"counters": int(meta["counters"]), "seen": int(meta["seen"])}

    async def _wipe(self, store: PartitionState) -> None:
        if store.db is not None:
            store.db.close()
            store.db = None
        shutil.rmtree(store.path, ignore_errors=True)
        store.db = await self._open(store.path)
        store.offsets = {"counters": 0, "seen": 0}

    # --- recovery --------------------------------------------------------------------
    async def recover(
        self, bootstrap: str, partitions: set[int], *, security: KafkaSecurity = PLAINTEXT
    ) -> RecoveryStats:
        """Open each partition's store and bring it to the changelogs' current end."""
        stats = RecoveryStats(partitions=len(partitions))
        if not partitions:
            return stats
        started = time.perf_counter()
        unreadable = await self._open_stores(partitions)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            **security.client_kwargs(),
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in self._topic_of() for p in partitions]
            consumer.assign(tps)
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            pending = await self._seek_recorded(
                consumer, partitions, unreadable, starts, ends, stats
            )
            # the counters' latest values: the local store, then the tail over it
            latest = self._local_counters(partitions, stats)
            await self._apply_tail(consumer, pending, ends, latest, stats)
        finally:
            await consumer.stop()
        for partition in partitions:
            store = self.partitions[partition]
            store.counters = {
                key: decode_counter(value)
                for key, value in latest[partition].items()
                if value is not None
            }
            stats.counters += len(store.counters)
        stats.seconds = time.perf_counter() - started
        self.last_recovery = stats
        log.info(
            "recovered %d partitions: %d counters (%d from the local stores), %d changelog "
            "records read, %d stores wiped, in %.2fs",
            stats.partitions,
            stats.counters,
            stats.local_counters,
            stats.records,
            stats.wiped,
            stats.seconds,
        )
        return stats

    def _topic_of(self) -> dict[str, str]:
        """changelog topic -> its name in the recorded offsets"""
        return {self.counters_topic: "counters", self.seen_topic: "seen"}

    async def _open_stores(self, partitions: set[int]) -> set[int]:
        """Open each partition's RocksDB; the partitions whose files could not be opened
        (wiped: the changelogs rebuild them)."""
        unreadable: set[int] = set()
        for partition in partitions:
            path = self.root / self.counters_topic / str(partition)
            store = self.partitions[partition] = PartitionState(path=path)
            try:
                store.db = await self._open(path)
            except _StoreLocked:
                raise
            except Exception as exc:  # corrupt or foreign files: the changelogs rebuild it
                log.warning("partition %d: cannot open %s (%s): wiped", partition, path, exc)
                await self._wipe(store)
                unreadable.add(partition)
        return unreadable

    async def _seek_recorded(
        self,
        consumer: AIOKafkaConsumer,
        partitions: set[int],
        unreadable: set[int],
        starts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
        stats: RecoveryStats,
    ) -> set[TopicPartition]:
        """Seek each changelog partition to the offset its store recorded, or wipe a store
        the changelogs no longer match and seek to their start; the changelog partitions
        with records left to read."""
        topic_of = self._topic_of()
        pending: set[TopicPartition] = set()
        for partition in partitions:
            store = self.partitions[partition]
            assert store.db is not None
            recorded = self._read_meta(store.db)
            mine = [TopicPartition(t, partition) for t in topic_of]
            if partition in unreadable:
                stats.wiped += 1
                recorded = {topic_of[tp.topic]: starts[tp] for tp in mine}
            elif recorded is None or any(
                not starts[tp] <= recorded[topic_of[tp.topic]] <= ends[tp] for tp in mine
            ):
                log.warning(
                    "partition %d: local store %s (offsets %s) does not match the "
                    "changelogs (start %s, end %s): wiped, restoring from the start",
                    partition,
                    store.path,
                    recorded,
                    [starts[tp] for tp in mine],
                    [ends[tp] for tp in mine],
                )
                await self._wipe(store)
                stats.wiped += 1
                recorded = {topic_of[tp.topic]: starts[tp] for tp in mine}
            store.offsets = recorded
            for tp in mine:
                consumer.seek(tp, recorded[topic_of[tp.topic]])
                if recorded[topic_of[tp.topic]] < ends[tp]:
                    pending.add(tp)
        return pending

    def _local_counters(
        self, partitions: set[int], stats: RecoveryStats
    ) -> dict[int, dict[str, bytes | None]]:
        """partition -> counter key -> the changelog value its local store holds"""
        latest: dict[int, dict[str, bytes | None]] = {}
        for partition in partitions:
            db = self.partitions[partition].db
            assert db is not None
            values = latest[partition] = {}
            for key, value in _scan(db, _COUNTER):
                values[key.decode()] = value
            stats.local_counters += len(values)
        return latest

    async def _apply_tail(
        self,
        consumer: AIOKafkaConsumer,
        pending: set[TopicPartition],
        ends: dict[TopicPartition, int],
        latest: dict[int, dict[str, bytes | None]],
        stats: RecoveryStats,
    ) -> None:
        """Read the changelogs from the recorded offsets to their ends, each fetched chunk
        written into the local stores with the offsets it reaches (over ``latest``)."""
        topic_of = self._topic_of()
        while pending:
            batches = await consumer.getmany(timeout_ms=500, max_records=50_000)
            by_partition: dict[int, WriteBatch] = {}
            for tp, messages in batches.items():
                if not messages:
                    continue
                stats.records += len(messages)
                batch = by_partition.get(tp.partition)
                if batch is None:
                    batch = by_partition[tp.partition] = WriteBatch(raw_mode=True)
                if tp.topic == self.counters_topic:
                    _apply_counters(messages, batch, latest[tp.partition])
                else:
                    stats.seen += _apply_seen(messages, batch)
                self.partitions[tp.partition].offsets[topic_of[tp.topic]] = messages[-1].offset + 1
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
                    # past the last record: nothing between it and the end is readable
                    self.partitions[tp.partition].offsets[topic_of[tp.topic]] = ends[tp]
                    if tp.partition not in by_partition:
                        by_partition[tp.partition] = WriteBatch(raw_mode=True)
            # each applied chunk is a prefix of both changelogs: store it with its offsets
            for partition, batch in by_partition.items():
                store = self.partitions[partition]
                batch.put(_META, self._meta(store.offsets))
                assert store.db is not None
                store.db.write(batch)


def _apply_counters(
    messages: list[Any], batch: WriteBatch, latest: dict[str, bytes | None]
) -> None:
    """Counter changelog records into a partition's WriteBatch and its latest values."""
    for m in messages:
        if m.key is None:
            continue
        latest[m.key.decode()] = m.value
        if m.value is None:
            batch.delete(_COUNTER + m.key)
        else:
            batch.put(_COUNTER + m.key, m.value)


def _apply_seen(messages: list[Any], batch: WriteBatch) -> int:
    """Seen changelog records into a partition's WriteBatch; how many were applied."""
    applied = 0
    for m in messages:
        if m.key is None:
            continue
        applied += 1
        if m.value is None:
            batch.delete(_SEEN + m.key)
        else:
            batch.put(_SEEN + m.key, m.value)
    return applied

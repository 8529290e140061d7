"""The counting stage: usage.raw in large batches, counters, verdicts, outputs.

Why not a Faust agent: Faust's stream path costs more a message than the whole
fold of an event, even for an empty agent (an Event, a conductor dispatch, a queue
hop and an ack per record), which caps a worker far below its target before any
work (bench/records/history_aggregator.md). This stage reads usage.raw with aiokafka's ``getmany`` (thousands of
records a call), folds each batch with :class:`~aggregator.counting.process.BatchProcessor`
and writes whole record batches with ``create_batch``/``send_batch``, so what is
paid per event is the decode, the fold and one append per output record. It runs
inside the Faust worker (started by a service in ``agents.py``) beside the web
pages and the sink stage (``sink_stage.py``).

Delivery: at-least-once with offset-fenced, deduplicated state (docs/design.md
invariant 1; Faust's exactly_once mode is avoided on purpose). A checkpoint, every
``commit_seconds`` and before partitions are given up, runs in this order
(docs/design.md invariant 2):

  1. send every verdict the coalescer still holds (a committed record never has its
     verdict waiting in memory), write each counter changed since the last cut to its
     changelog (its state now: once per checkpoint however often it changed, or
     earlier once ``MAX_CHANGED_COUNTERS`` wait), then **cut**: the open record batches are sealed
     (``Outgoing.seal`` in output_batches.py: later records go into batches of the next epoch), the
     store's pending entries are sealed (``CountingStore.seal``) and the source
     offsets past the last folded record of each partition are taken;
  2. hand every record batch of the cut's epoch and before to the producer: priced
     events, verdicts, alerts, dead letters and both changelogs (counters with their
     fences, event-id dedupe) of every batch folded before the cut;
  3. check each delivery: one failure aborts the checkpoint and stops the worker,
     nothing is committed, the records are re-delivered to the next owner;
  4. commit the cut's source offsets;
  5. write the sealed entries into each partition's local RocksDB with the changelog
     offsets the acknowledged batches reach (``CountingStore.persist``, one WriteBatch
     a partition), so a restart reads only the changelogs' tail. Never before step 3:
     the local store is a prefix of the changelogs, never ahead of them.

Step 1 runs in the loop (a few ms: the changed counters' encoding); steps 2-5 wait for the
broker, so they run as a task beside the fold of the next batches (at most one
checkpoint in flight; the next cut waits for it). Sealing is what keeps that exact:
an epoch's batches hold only records folded before the cut and, per output
partition, are handed over before any later batch (aiokafka sends one batch per
partition at a time), so the offsets its deliveries reach cover exactly the sealed
entries. On revoke and at stop the whole checkpoint is waited for.

A crash anywhere re-delivers records from the last commit; the changelog may
already hold some of their effects, which the counters' fences and the dedupe
entries (same partition, same offset = re-delivery) make harmless.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.partitioner import DefaultPartitioner

from aggregator.config import AggregatorConfig
from aggregator.counting.backfill import (
    MARKER_PREFIX,
    PRUNED_MARKER,
    Backfills,
    marker_entries,
    seek_rereads,
)
from aggregator.counting.changelogs import ensure_changelogs
from aggregator.counting.errors import CountingError
from aggregator.counting.output_batches import Outgoing
from aggregator.counting.process import BatchProcessor
from aggregator.counting.pruning import find_prunable
from aggregator.counting.state import CountingStore, SealedState
from aggregator.counting.verdicts import VerdictCoalescer
from aggregator.metrics import Metrics
from aggregator.rebalance import StageRebalance
from schemas.periods import to_micros
from schemas.topics import STORE_ROW_HEADER, Topics

log = logging.getLogger(__name__)

#: bytes per record batch the stage builds (below the broker's 1 MiB message limit)
RECORD_BATCH_BYTES = 512 * 1024
#: filled batches the loop may run ahead of the producer before it waits for it
MAX_BACKLOG = 256
#: changed counters held unwritten before a fold writes them (else the checkpoint's cut
#: does): bounds the work a cut does in the loop
MAX_CHANGED_COUNTERS = 20_000
#: counters a sweep for pruning looks at per loop turn (pruning.py)
PRUNE_SLICE = 2000
#: how often a loop without records looks whether an overdue checkpoint may be cut
CHECKPOINT_POLL_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class _Cut:
    """What one checkpoint covers: the output epoch, the source offsets, the store's entries."""

    epoch: int
    offsets: dict[TopicPartition, int]
    state: SealedState


class CountingStage:
    """Owns a usage.raw consumer (group ``config.counting_group``), a producer and the state."""

    def __init__(
        self,
        config: AggregatorConfig,
        topics: Topics,
        processor: BatchProcessor,
        metrics: Metrics,
        reference_ready: asyncio.Event,
    ) -> None:
        self.config = config
        self.topics = topics
        self.processor = processor
        self.metrics = metrics
        self.reference_ready = reference_ready
        self.store = CountingStore(
            config.data_dir / "counting", config.counter_changelog, config.seen_changelog
        )
        self.verdicts = VerdictCoalescer(config.batch_seconds)
        #: budgets counted again from their period's start, per partition (backfill.py)
        self.backfills = Backfills(processor.max_future_skew_us)
        #: usage.raw partitions this worker owns and has recovered
        self.owned: set[int] = set()
        self.rebalancing = True
        self._lock = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._verdict_producer: AIOKafkaProducer | None = None
        self._outgoing: Outgoing | None = None
        #: source partition -> next offset to commit (since the last checkpoint)
        self._positions: dict[int, int] = {}
        #: source partition -> next offset to fold (for the lag gauge)
        self._folded_to: dict[int, int] = {}
        self._last_checkpoint = time.monotonic()
        self._last_prune = time.monotonic()
        #: the budget ids of the last sweep: one gone since has its markers rewritten
        self._budget_ids: set[str] | None = None
        #: (partition, counter keys) a sweep still has to look at
        self._prune_queue: list[tuple[int, list[str]]] = []
        self._partitions: dict[str, list[int]] = {}
        self._verdict_partition: dict[bytes, int] = {}
        self._partitioner = DefaultPartitioner()
        self._task: asyncio.Task[None] | None = None
        self._loop_probe: asyncio.Task[None] | None = None
        self.on_crash: Callable[[BaseException], Awaitable[None]] | None = None
        self._crash_task: asyncio.Future[None] | None = None
        #: a checkpoint failed: this stage never commits again (the worker is stopping)
        self._failed: CountingError | None = None
        #: the checkpoint whose steps 2-5 run beside the fold (at most one at a time)
        self._in_flight: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self.reference_ready.is_set() and bool(self.owned) and not self.rebalancing

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await ensure_changelogs(self.config, self.topics)
        self.metrics.watch_gc()
        self._producer = self._new_producer()
        await self._producer.start()
        # aiokafka has one produce request in flight per broker connection: verdicts get a
        # connection of their own, so an enforcer's input never waits behind a request of
        # changelog and priced batches (it cut the verdicts' p99 under load)
        self._verdict_producer = self._new_producer()
        await self._verdict_producer.start()
        self._outgoing = Outgoing(
            self._producer,
            self.topics.budget_verdicts,
            self.metrics.record_verdict_send_ms,
            own_producer={self.topics.budget_verdicts: self._verdict_producer},
        )
        for topic in (
            self.topics.usage_priced,
            self.topics.budget_verdicts,
            self.topics.budget_alerts,
            self.topics.usage_dlq,
            self.config.counter_changelog,
            self.config.seen_changelog,
        ):
            self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.config.bootstrap,
            group_id=self.config.counting_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=16 * 1024 * 1024,
            session_timeout_ms=int(self.config.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.config.session_timeout_s * 250),
            **self.config.kafka_security.client_kwargs(),
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name="counting-stage")
        self._loop_probe = asyncio.create_task(self.metrics.watch_loop(), name="loop-probe")
        self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        for task in (self._task, self._loop_probe):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._settled()
        try:
            if self._consumer is not None and self.owned and self._failed is None:
                async with self._lock:
                    await self._checkpoint()
        except Exception:  # stopping anyway: what was not committed is re-delivered
            log.exception("last checkpoint failed")
        self.store.close()
        self.metrics.unwatch_gc()
        if self._consumer is not None:
            await self._consumer.stop()
        for producer in (self._producer, self._verdict_producer):
            if producer is not None:
                await producer.stop()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.config.bootstrap,
            acks="all",
            # a retry after a leader moved (a broker lost) must not write a batch twice
            enable_idempotence=True,
            linger_ms=0,
            max_batch_size=RECORD_BATCH_BYTES,
            max_request_size=4 * RECORD_BATCH_BYTES,
            **self.config.kafka_security.client_kwargs(),
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("counting stage stopped: %r", exc)
            # whatever the loop was doing is unfinished: nothing more is committed
            if self._failed is None:
                self._failed = CountingError(f"the counting loop failed: {exc!r}")
            if self.on_crash is not None:
                self._crash_task = asyncio.ensure_future(self.on_crash(exc))

    def lag(self) -> dict[str, int]:
        """usage.raw records of the owned partitions not folded yet (as of the last fetch)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        behind = 0
        for partition in self.owned:
            end = consumer.highwater(TopicPartition(self.topics.usage_raw, partition))
            if end is not None:
                behind += max(0, end - self._folded_to.get(partition, end))
        return {self.topics.usage_raw: behind}

    # --- rebalancing -------------------------------------------------------------------
    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            self.rebalancing = True
            try:
                await self._settled()
                if self.owned:
                    # the partitions may go to another worker: everything folded so far is
                    # made durable and committed before it may read them
                    await self._checkpoint()
            finally:
                # another worker of this host may open them next; kept ones are reopened
                self.store.close()

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            wanted = {tp.partition for tp in assigned if tp.topic == self.topics.usage_raw}
            gone = self.owned - wanted
            self.store.drop(gone)
            for partition in gone:
                self._positions.pop(partition, None)
                self._folded_to.pop(partition, None)
            new = wanted - self.owned
            # a partition kept across the rebalance had no other writer: its state is current
            await self.store.reopen(wanted & self.owned)
            await self.store.recover(
                self.config.bootstrap, new, security=self.config.kafka_security
            )
            self.owned = wanted
            if gone or new:
                self.verdicts.forget()
            # a full collection walks every object of the process (Faust, aiokafka, the
            # reference data, the recovered counters): long pauses with the loop stopped, the
            # verdict latency's p99. What exists now lives as long as the worker: collect
            # once, then keep it out of later collections (unreachable objects are still
            # freed by reference counting)
            self.metrics.unwatch_gc()  # this one is part of the rebalance, not of the fold
            gc.collect()
            gc.freeze()
            self.metrics.watch_gc()
            self.rebalancing = False

    # --- the loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        await self.reference_ready.wait()  # budgets and prices whole before the first batch
        consumer.subscribe([self.topics.usage_raw], listener=StageRebalance(self))
        interval = self.config.commit_seconds
        while True:
            if self._failed is not None:
                raise self._failed  # a checkpoint failed: stop, nothing more is committed
            if not self.rebalancing and self.backfills.due(
                self.processor.reference.version, self.owned
            ):
                async with self._lock:
                    await self._plan_backfills()
            timeout = self._last_checkpoint + interval - time.monotonic()
            if self._in_flight is not None and not self._in_flight.done():
                # the next cut waits for the checkpoint in flight: look again in a while
                timeout = max(timeout, CHECKPOINT_POLL_SECONDS)
            held = self.verdicts.next_due()
            if held is not None:
                timeout = min(timeout, held - time.monotonic())
            batches = await consumer.getmany(
                timeout_ms=max(0, math.ceil(timeout * 1000)), max_records=self.config.batch_size
            )
            async with self._lock:
                if batches:
                    self._fold(batches)
                    if self._outgoing is not None and self._outgoing.backlog() > MAX_BACKLOG:
                        await self._outgoing.hand_over()  # the broker is slower than the fold
                now = time.monotonic()
                if self.store.pending_seen >= self.config.max_pending_event_ids:
                    # the event ids held in memory stay bounded: persist them now
                    await self._checkpoint()
                elif now - self._last_checkpoint >= interval and (
                    self._in_flight is None or self._in_flight.done()
                ):
                    await self._settled()  # done: collects its outcome
                    if self._failed is None:
                        self._start_checkpoint()
                else:
                    # also while a cut is due but the previous checkpoint still waits for
                    # the broker: a held verdict falls due all the same (and, not sent, it
                    # would make the next getmany's timeout 0: a loop that never yields)
                    due = self.verdicts.due(now)
                    if due:
                        self._send_verdicts(due)
                if not self.rebalancing:
                    if (
                        not self._prune_queue
                        and now - self._last_prune >= self.config.prune_seconds
                    ):
                        self._start_sweep()
                        self._last_prune = now
                    if self._prune_queue:
                        self._prune_some(to_micros(datetime.now(UTC)))
            # getmany returns buffered records without suspending: under a backlog this
            # loop would hold the event loop for good, and the pumps handing batches over,
            # the sink stage and the web pages would only run when the backlog check waits
            await asyncio.sleep(0)

    async def _plan_backfills(self) -> None:
        """Budgets new to an owned partition are counted from their period's start: the
        partition is read again from there (backfill.py)."""
        reference = self.processor.reference
        plans = self.backfills.plan(
            reference.version,
            list(reference.budgets.values()),
            self.owned,
            self.store.seen,
            to_micros(datetime.now(UTC)),
        )
        if not plans:
            return
        assert self._consumer is not None
        try:
            sought = await seek_rereads(
                self._consumer,
                self.topics.usage_raw,
                plans,
                self.backfills,
                self._folded_to,
                self._write_markers,
            )
        except KafkaError as exc:  # the broker away: the fold goes on, the plan is made again
            log.warning("budgets not yet counted from their period's start: %r", exc)
            self.backfills.replan()
            return
        for partition in sought:
            self._positions[partition] = self._folded_to[partition]
        if sought:
            log.info("counting budgets from their period's start: %s", self.backfills.loading())

    def _start_sweep(self) -> None:
        """A sweep for counters to prune begins: every counter of the owned partitions is
        queued, looked at ``PRUNE_SLICE`` a loop turn (``_prune_some``); the markers of
        budgets removed since the last sweep say so at once (a budget defined again is
        counted from its period's start)."""
        budgets = self.processor.reference.budgets
        gone = set() if self._budget_ids is None else self._budget_ids - budgets.keys()
        self._budget_ids = set(budgets)
        for partition in sorted(self.owned):
            store = self.store.partitions.get(partition)
            if store is None:
                continue
            self._prune_queue.append((partition, list(store.counters)))
            self._mark_pruned(partition, gone)

    def _prune_some(self, now_us: int) -> None:
        """Prune up to ``PRUNE_SLICE`` queued counters that count nothing any more
        (pruning.py): gone from the state, a tombstone on their changelog and on the
        verdict topic. A slice keeps the loop's pause short however many counters there are."""
        outgoing = self._outgoing
        assert outgoing is not None
        partition, keys = self._prune_queue[-1]
        store = self.store.partitions.get(partition)
        some = keys[-PRUNE_SLICE:]
        del keys[-PRUNE_SLICE:]
        if not keys:
            self._prune_queue.pop()
        if store is None or partition not in self.owned:
            return
        counters = store.counters
        found = find_prunable(
            {k: counters[k] for k in some if k in counters},
            self.processor.reference.budgets,
            now_us,
            int(self.config.session_idle_seconds * 1_000_000),
        )
        for key in found.keys:
            self.store.prune_counter(partition, key)
            self.verdicts.drop(key)
            key_bytes = key.encode()
            outgoing.add(self.config.counter_changelog, partition, key_bytes, None)
            outgoing.add(
                self.topics.budget_verdicts, self._verdict_partition_of(key_bytes), key_bytes, None
            )
        self._mark_pruned(partition, found.budgets_gone)
        if found.keys:
            self.metrics.record_pruned(len(found.removed_budget), len(found.idle_session))
            outgoing.release()
            log.info("pruned %d counters that count nothing any more", len(found.keys))

    def _mark_pruned(self, partition: int, budget_ids: set[str]) -> None:
        """The markers of removed budgets say they are gone (backfill.PRUNED_MARKER)."""
        markers = {
            budget_id: PRUNED_MARKER
            for budget_id in budget_ids
            if self.store.seen(partition, MARKER_PREFIX + budget_id) not in (None, PRUNED_MARKER)
        }
        if markers:
            self._write_markers(partition, markers)

    def _write_markers(self, partition: int, markers: dict[str, str]) -> None:
        assert self._outgoing is not None
        for key, value in marker_entries(markers):
            self.store.put_seen(partition, key, value)
            self._outgoing.add(self.config.seen_changelog, partition, key.encode(), value.encode())

    def _fold(self, batches: dict[TopicPartition, list[Any]]) -> None:
        records = [
            m for tp, messages in batches.items() if tp.partition in self.owned for m in messages
        ]
        if not records:
            return
        if self.backfills.active:
            rereads = self.backfills.rereads
            again = [m for m in records if rereads(m.partition, m.offset)]
            if again:
                counts_again = self.backfills.counts_again
                kept = [m for m in again if counts_again(m.partition, m.value)]
                # written when first read (or re-delivered after a crash, which stops the
                # re-read): a re-read counts, it writes no priced record or letter again
                if kept:
                    self._fold_records(kept, first_read=False)
                for message in again:
                    self._positions[message.partition] = message.offset + 1
                self._folded_to.update(self._positions)
                records = [m for m in records if not rereads(m.partition, m.offset)]
            if records:
                self._fold_records(records)
            assert self._outgoing is not None
            finished = self.backfills.finished(self._folded_to, self._outgoing.epoch)
            for partition, markers in finished:
                self._write_markers(partition, markers)
            if finished:  # what the re-read counted goes out now, not a batch later
                self._send_verdicts(self.verdicts.due(time.monotonic(), force=True))
            return
        self._fold_records(records)

    def _fold_records(self, records: list[Any], first_read: bool = True) -> None:
        started = time.perf_counter()
        # queueing before the fold: the oldest record's Kafka timestamp (ms) against now
        self.metrics.record_age_ms(time.time() * 1000 - min(m.timestamp for m in records))
        out = self.processor.process(records, self.store.counter, self.store.seen)
        folded = time.perf_counter()
        outgoing = self._outgoing
        assert outgoing is not None
        add = outgoing.add
        touch = self.store.touch_counter
        for (partition, key), state in out.counter_states.items():
            touch(partition, key, state)
        if self.store.changed_counters >= MAX_CHANGED_COUNTERS:
            self._write_changed_counters()
        put_seen = self.store.put_seen
        seen_topic = self.config.seen_changelog
        for (partition, event_id), position in out.seen_writes.items():
            put_seen(partition, event_id, position)
            add(seen_topic, partition, event_id.encode(), position.encode())
        written = time.perf_counter()
        priced_topic = self.topics.usage_priced
        for partition, org, priced, store_row in out.priced if first_read else ():
            add(
                priced_topic,
                partition,
                org,
                priced,
                [(STORE_ROW_HEADER, store_row)],
            )
        now = time.monotonic()
        offer = self.verdicts.offer
        send_now = [(k, c) for k, c in out.verdict_changes.items() if offer(k, c, now)]
        self._add_verdicts(send_now)
        # with a ClickHouse store the alerts go out from its exact record (aggregator/alerts/publisher.py);
        # without one the fold's own (newest periods only, at least once) are all there is
        if self.config.clickhouse_dsn is None and out.unpriced_alerts_folded:
            self.metrics.unpriced_alerts_folded.inc(out.unpriced_alerts_folded)
        for counter, alert in out.alerts if self.config.clickhouse_dsn is None else ():
            add(
                self.topics.budget_alerts,
                self._partition_of(self.topics.budget_alerts, counter),
                counter,
                alert,
            )
        for raw_key, letter in out.dead_letters if first_read else ():
            add(
                self.topics.usage_dlq,
                self._partition_of(self.topics.usage_dlq, raw_key),
                raw_key,
                letter,
            )
        outgoing.release()
        for message in records:
            self._positions[message.partition] = message.offset + 1
        self._folded_to.update(self._positions)
        sent = time.perf_counter()
        self.metrics.record_batch(out.stats, len(send_now), sent - started)
        self.metrics.record_phases(
            fold=folded - started, state=written - folded, sends=sent - written
        )
        if out.unpriced_models:
            self.metrics.record_unpriced_models(out.unpriced_models)

    def _write_changed_counters(self) -> None:
        """Each counter changed since the last write: its state now, to its changelog."""
        assert self._outgoing is not None
        add = self._outgoing.add
        topic = self.config.counter_changelog
        for partition, key, value in self.store.write_changed():
            add(topic, partition, key.encode(), value)

    def _add_verdicts(self, verdicts: list[tuple[str, Any]]) -> None:
        if not verdicts:
            return
        outgoing = self._outgoing
        assert outgoing is not None
        topic = self.topics.budget_verdicts
        emitted_us = to_micros(self._emitted_at())
        for key, change in verdicts:
            key_bytes = key.encode()
            outgoing.add(
                topic,
                self._verdict_partition_of(key_bytes),
                key_bytes,
                change.encode_at(key, emitted_us),
            )

    def _send_verdicts(self, verdicts: list[tuple[str, Any]]) -> None:
        self._add_verdicts(verdicts)
        outgoing = self._outgoing
        assert outgoing is not None
        outgoing.release()
        self.metrics.record_verdicts(len(verdicts))

    async def _checkpoint(self) -> None:
        """A whole checkpoint, waited for (on revoke, at stop, when memory must be freed)."""
        await self._settled()
        if self._failed is not None:
            raise self._failed  # the records after the last commit must be re-delivered
        started = time.perf_counter()
        await self._complete(self._cut(), started)
        self.metrics.record_checkpoint_stall((time.perf_counter() - started) * 1000)

    def _start_checkpoint(self) -> None:
        """Cut now, in the loop; the rest runs beside the fold (steps 2-5 of the docstring)."""
        started = time.perf_counter()
        cut = self._cut()
        self.metrics.record_checkpoint_stall((time.perf_counter() - started) * 1000)
        self._in_flight = asyncio.create_task(self._complete(cut, started), name="checkpoint")

    async def _settled(self) -> None:
        """Wait for the checkpoint in flight, if any (its failure is kept in ``_failed``)."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome, BaseException) and self._failed is None:
                # failed past step 3 (commit, local store): nothing later may be committed
                log.error("checkpoint failed: %r", outcome)
                self._failed = CountingError(f"a checkpoint failed: {outcome!r}")

    def _cut(self) -> _Cut:
        """Step 1, and the cut: what was folded so far is this checkpoint, later records
        are the next one's (new record batches, new pending store entries)."""
        # 1. held verdicts go out now (into this checkpoint's batches), and the changed
        # counters' states to their changelog
        self._send_verdicts(self.verdicts.due(time.monotonic(), force=True))
        self._write_changed_counters()
        assert self._outgoing is not None
        cut = _Cut(
            epoch=self._outgoing.seal(),
            offsets={
                TopicPartition(self.topics.usage_raw, partition): offset
                for partition, offset in self._positions.items()
                if partition in self.owned
            },
            state=self.store.seal(),
        )
        self._positions = {}
        self._last_checkpoint = time.monotonic()
        return cut

    async def _complete(self, cut: _Cut, started: float) -> None:
        """Steps 2-5 for the records before ``cut``; the loop may fold later ones meanwhile."""
        consumer = self._consumer
        assert consumer is not None and self._outgoing is not None
        try:
            # 2. every output and changelog record before the cut reaches the broker
            deliveries = await self._outgoing.settle(cut.epoch)
            if deliveries:
                await asyncio.wait([d for d, _ in deliveries])
            # 3. a failed delivery stops here: nothing is committed, now or ever by this stage
            failed = [d for d, _ in deliveries if d.cancelled() or d.exception() is not None]
            if failed:
                raise CountingError(
                    f"{len(failed)} output batches were not delivered: {failed[0]!r}"
                )
        except Exception as exc:
            self._failed = exc if isinstance(exc, CountingError) else CountingError(repr(exc))
            raise self._failed from exc
        # 4. the source offsets
        if cut.offsets:
            try:
                await consumer.commit(cut.offsets)
            except (CommitFailedError, KafkaError) as exc:
                # a rebalance took the partitions: their records are re-delivered, fenced
                log.warning("offset commit failed (%s); the records will be re-delivered", exc)
        # 5. the acknowledged changelog records into the local stores, with their offsets
        reached: dict[tuple[str, int], int] = {}
        for delivery, count in deliveries:
            meta = delivery.result()
            where = (meta.topic, meta.partition)
            reached[where] = max(reached.get(where, 0), meta.offset + count)
        self.store.persist(reached, cut.state)
        self.backfills.settled(cut.epoch)
        self.metrics.record_checkpoint((time.perf_counter() - started) * 1000)

    # --- partitions of the outputs -------------------------------------------------------
    def _verdict_partition_of(self, key: bytes) -> int:
        partition = self._verdict_partition.get(key)
        if partition is None:
            if len(self._verdict_partition) > 500_000:
                self._verdict_partition.clear()
            partition = self._verdict_partition[key] = self._partition_of(
                self.topics.budget_verdicts, key
            )
        return partition

    def _partition_of(self, topic: str, key: bytes | None) -> int:
        """The partition Kafka's default partitioner picks (murmur2 of the key), so a
        compacted topic keeps one value per key whichever client wrote it."""
        partitions = self._partitions[topic]
        if key is None:
            return partitions[0]
        return int(self._partitioner(key, partitions, partitions))

    @staticmethod
    def _emitted_at() -> datetime:
        return datetime.now(UTC)

"""Follows budget.policies, pricing and budget.verdicts into an EnforcerState.

Start-up (numbered as it runs in :meth:`Follower.start` / :meth:`Follower._run`):

1. Assign every partition of the three topics by hand (no consumer group: each
   enforcer reads everything) and seek to the beginning: the topics are
   compacted, so reading them whole rebuilds the whole state.
2. Record the end offsets seen at start. The state is *ready* once the
   position of every partition has reached them; until then checks are
   decided by ``fail_mode``.
3. Then follow the topics live, forever. An optional topic (``budget.raises``) that did
   not exist at start is asked for every ``OPTIONAL_TOPIC_CHECK_S`` (5 s) and followed
   from its beginning once it is created, so raises published into it are honoured
   without a restart.

Generations (docs/replay.md): before step 1 the follower reads the compacted
control topic (``Topics.generations``, when it exists) and follows the
verdicts of the generation it names. It keeps following the control topic; on
a switch it loads the new generation's verdict topic to its end offsets *in
the background* (:class:`VerdictLoader`, its own consumer) while checks keep
using the old verdicts, then swaps in one synchronous step between two polls
(no ``await``: no check runs in the middle): every loaded verdict goes through
``EnforcerState.apply_verdict``, whose rule (a lower seq or an older period is
ignored) keeps per counter the newer of the two. So a check never sees a
half-loaded generation, and a counter never goes backwards within a period:
if the new generation is behind the old one on some counter, the old verdict
stays until the new one passes it. Then the follow loop reads the new verdict
topic from where the loader stopped and no longer reads the old one.

Freshness: the verdict stream is *fresh as of T* when this process has consumed
everything the broker held at T on every verdict partition (a highwater
snapshot taken from fetch responses that arrived after the previous mark).
If fetch responses stop (broker unreachable, partition leaderless), no new
mark is made and the stream goes stale after ``grace``.

A record that cannot be decoded or used (bad header, unknown fingerprint,
invalid policy, missing key) is counted in
``spendbus_enforcer_undecodable_total{topic,reason}`` and skipped: a poison
message never stops the enforcer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from enforcer.config import EnforcerConfig
from enforcer.errors import TopicsMissing
from enforcer.holds import Holds
from enforcer.metrics import EnforcerMetrics
from enforcer.state import EnforcerState
from runtime.topic_reader import read_until, start_at_beginning
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, JOB_APPROVAL, PRICE_TABLE, VERDICT, Codec
from schemas.errors import ContractError
from schemas.generations import GenerationSwitch
from schemas.records import Verdict
from schemas.topics import CONTROL_KEY, Topics

log = logging.getLogger("spendbus.enforcer.follower")

#: how long a getmany waits when there is nothing to read
POLL_TIMEOUT_MS = 200
MAX_RECORDS = 10_000
#: how often (clock seconds) expired holds are swept
SWEEP_INTERVAL_S = 1.0
TOPIC_WAIT_S = 10.0
#: how often (monotonic seconds) a follower missing an optional topic asks the broker for it
OPTIONAL_TOPIC_CHECK_S = 5.0


class VerdictLoader:
    """Reads one generation's verdict topic from the beginning to the end offsets seen at
    start, into memory, in the background; the follower swaps it in when done."""

    def __init__(self, config: EnforcerConfig, topics: Topics) -> None:
        self.config = config
        self.topics = topics
        self.generation = topics.generation
        #: counter key -> last record (None = tombstone), in offset order
        self.records: dict[str, Verdict | None] = {}
        self.undecodable = 0
        #: where reading stopped: the follower continues from here
        self.positions: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self.task = asyncio.create_task(
            self._load(), name=f"spendbus-enforcer-load-{self.generation}"
        )

    @property
    def done(self) -> bool:
        return self.task.done() and not self.task.cancelled() and self.task.exception() is None

    async def _load(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.config.bootstrap,
            client_id=f"{self.config.client_id}-load",
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            **self.config.kafka_security.client_kwargs(),
        )
        await consumer.start()
        self._consumer = consumer
        try:
            topic = self.topics.budget_verdicts
            while True:  # the new generation's topics are created before the switch; wait if not
                cluster = await consumer._client.fetch_all_metadata()
                partitions = cluster.partitions_for_topic(topic)
                if partitions:
                    break
                log.warning("generation %r: waiting for topic %s", self.generation, topic)
                await asyncio.sleep(1.0)
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            ends = await start_at_beginning(consumer, tps)
            # a stall (TopicReadStalled) fails this load: the follower logs it and loads again
            async for _, messages in read_until(consumer, ends):
                for m in messages:
                    if m.key is None:
                        self.undecodable += 1
                        continue
                    try:
                        value = None if m.value is None else VERDICT.decode(m.value)
                    except ContractError:
                        self.undecodable += 1
                        continue
                    self.records[m.key.decode("utf-8", "replace")] = value
            self.positions = {tp: await consumer.position(tp) for tp in tps}
        finally:
            self._consumer = None
            await consumer.stop()

    async def cancel(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


class Follower:
    def __init__(
        self,
        config: EnforcerConfig,
        state: EnforcerState,
        holds: Holds,
        metrics: EnforcerMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.state = state
        self.holds = holds
        self.metrics = metrics
        self.clock = clock
        self.topics = Topics(config.topic_prefix)
        #: the generation whose verdicts are followed ('' = the default one)
        self.generation = ""
        #: switches completed since start
        self.switches = 0
        self._control_tp: TopicPartition | None = None
        self._loader: VerdictLoader | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._start_end: dict[TopicPartition, int] = {}
        self._verdict_tps: list[TopicPartition] = []
        self._snapshot: tuple[dict[TopicPartition, int], int, dict[TopicPartition, int]] | None = (
            None
        )
        self._marked_polls: dict[TopicPartition, int] = {}
        self._ready_event = asyncio.Event()
        self._handlers: dict[str, tuple[Codec[Mapping[str, object]], Callable[[str, Any], Any]]] = {
            self.topics.budget_policies: (BUDGET_POLICY, state.apply_policy),
            self.topics.pricing: (PRICE_TABLE, state.apply_price),
            self.topics.budget_verdicts: (VERDICT, state.apply_verdict),
            self.topics.budget_raises: (BUDGET_RAISE, state.apply_raise),
        }
        if config.policy_file is not None:  # only a policy's approvals are read
            self._handlers[self.topics.budget_approvals] = (JOB_APPROVAL, state.apply_approval)
        self._key_field = {
            self.topics.budget_policies: "budget_id",
            self.topics.pricing: "version",
            self.topics.budget_verdicts: "counter_key",
            self.topics.budget_raises: "raise_id",
            self.topics.budget_approvals: "job_key",
        }
        #: followed when they exist (a stack created before them has none: no raises)
        self._optional = {self.topics.budget_raises, self.topics.budget_approvals} & set(
            self._handlers
        )
        #: optional topics that did not exist at start: asked for every
        #: OPTIONAL_TOPIC_CHECK_S and followed from their beginning once created
        self.missing: set[str] = set()
        #: the exception that ended the follow loop, if any
        self.failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Steps 1 and 2; the follow loop runs in a background task."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.config.bootstrap,
            client_id=self.config.client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            **self.config.kafka_security.client_kwargs(),
        )
        await consumer.start()
        try:
            control_end = await self._read_generation(consumer)
            tps = await self._partitions(consumer)
            # Step 1: every partition, from the beginning
            consumer.assign(tps + ([self._control_tp] if self._control_tp else []))
            await consumer.seek_to_beginning(*tps)
            if self._control_tp is not None:
                consumer.seek(self._control_tp, control_end)
            # Step 2: the end offsets that define "ready"
            self._start_end = await consumer.end_offsets(tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._verdict_tps = [tp for tp in tps if tp.topic == self.topics.budget_verdicts]
        # Step 3: follow
        self._task = asyncio.create_task(self._run(), name="spendbus-enforcer-follower")

    async def _read_generation(self, consumer: AIOKafkaConsumer) -> int:
        """Read the control topic to its end (when it exists): which generation to follow.
        Returns the offset to go on from."""
        cluster = await consumer._client.fetch_all_metadata()
        if not cluster.partitions_for_topic(self.topics.generations):
            return 0  # a stack from before generations: the default one
        tp = TopicPartition(self.topics.generations, 0)
        self._control_tp = tp
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end: int = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + TOPIC_WAIT_S
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise TopicsMissing(
                    f"cannot read {tp.topic} on {self.config.bootstrap} to its end offset {end}"
                )
            for messages in (await consumer.getmany(tp, timeout_ms=POLL_TIMEOUT_MS)).values():
                for m in messages:
                    switch = self._decode_switch(m)
                    if switch is not None:
                        self._use_generation(switch.generation)
        return end

    def _decode_switch(self, message: Any) -> GenerationSwitch | None:
        if message.key != CONTROL_KEY or message.value is None:
            return None
        try:
            return GenerationSwitch.decode(message.value)
        except (ContractError, ValueError) as exc:
            self.metrics.undecodable[(self.topics.generations, "unusable")] += 1
            log.warning("skipped a generation switch at offset %s: %s", message.offset, exc)
            return None

    def _use_generation(self, generation: str) -> None:
        """Point the verdict handlers at ``generation``'s topic (before it is assigned)."""
        old = self.topics.budget_verdicts
        self.generation = generation
        self.topics = Topics(self.config.topic_prefix, generation)
        self._handlers.pop(old, None)
        self._key_field.pop(old, None)
        self._handlers[self.topics.budget_verdicts] = (VERDICT, self.state.apply_verdict)
        self._key_field[self.topics.budget_verdicts] = "counter_key"

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Every partition of the three topics, waiting a little for topics being created."""
        wanted = list(self._handlers)
        deadline = time.monotonic() + TOPIC_WAIT_S
        while True:
            # the consumer's own cluster view only knows assigned topics: ask for all
            cluster = await consumer._client.fetch_all_metadata()
            partitions = {t: cluster.partitions_for_topic(t) for t in wanted}
            missing = [t for t, ps in partitions.items() if not ps and t not in self._optional]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise TopicsMissing(
                    f"topics {', '.join(missing)} do not exist on {self.config.bootstrap}; "
                    "create them first (spendbus up creates every topic)"
                )
            await asyncio.sleep(0.5)
        self.missing = {t for t in self._optional if not partitions.get(t)}
        return [TopicPartition(t, p) for t in wanted for p in sorted(partitions[t] or ())]

    async def _pick_up_topics(self, consumer: AIOKafkaConsumer) -> None:
        """Follow the optional topics created since the start, from their beginning (a
        raise published into a topic made after this enforcer started is honoured)."""
        cluster = await consumer._client.fetch_all_metadata()
        new = [
            TopicPartition(t, p)
            for t in sorted(self.missing)
            for p in sorted(cluster.partitions_for_topic(t) or ())
        ]
        if not new:
            return
        current = list(consumer.assignment())
        positions = {tp: await consumer.position(tp) for tp in current}
        consumer.assign(current + new)  # assign() forgets positions: put them back
        for tp, position in positions.items():
            consumer.seek(tp, position)
        await consumer.seek_to_beginning(*new)
        self.missing -= {tp.topic for tp in new}
        log.info(
            "following %s, created after this enforcer started", ", ".join({tp.topic for tp in new})
        )

    async def stop(self) -> None:
        loader, self._loader = self._loader, None
        if loader is not None:
            await loader.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        next_sweep = 0.0
        next_topic_check = time.monotonic() + OPTIONAL_TOPIC_CHECK_S
        try:
            while True:
                if self.missing and time.monotonic() >= next_topic_check:
                    await self._pick_up_topics(consumer)
                    next_topic_check = time.monotonic() + OPTIONAL_TOPIC_CHECK_S
                batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS)
                for tp, messages in batch.items():
                    if tp == self._control_tp:
                        self._follow_switches(messages)
                    else:
                        self._apply(tp.topic, messages)
                if self._loader is not None and self._loader.task.done():
                    await self._swap(consumer)
                if not self.state.ready:
                    await self._check_ready(consumer)
                if self.state.ready:
                    await self._check_fresh(consumer)
                now = self.clock()
                if now >= next_sweep:
                    self.holds.expire(int(now * 1_000_000))
                    next_sweep = now + SWEEP_INTERVAL_S
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # pragma: no cover - a broken client: surface it on /healthz
            self.failure = exc
            log.exception("enforcer follower stopped")
            raise

    def _follow_switches(self, messages: list[Any]) -> None:
        for message in messages:
            switch = self._decode_switch(message)
            if switch is None:
                continue
            wanted = switch.generation
            loading = self._loader.generation if self._loader is not None else None
            if wanted == loading or (loading is None and wanted == self.generation):
                continue
            if self._loader is not None:  # superseded before it finished
                self._loader.task.cancel()  # its own finally closes its consumer
                self._loader = None
            if wanted != self.generation:
                log.info("generation switch to %r: loading its verdicts", wanted)
                self._loader = VerdictLoader(self.config, Topics(self.config.topic_prefix, wanted))

    async def _swap(self, consumer: AIOKafkaConsumer) -> None:
        """Make the loaded generation current; the part checks can observe is synchronous."""
        loader, self._loader = self._loader, None
        assert loader is not None
        if not loader.done:  # failed: try again from scratch
            log.warning(
                "loading generation %r failed: %r", loader.generation, loader.task.exception()
            )
            self._loader = VerdictLoader(self.config, loader.topics)
            return
        old_tps = set(self._verdict_tps)
        kept = [tp for tp in consumer.assignment() if tp not in old_tps]
        positions = {tp: await consumer.position(tp) for tp in kept}
        # --- from here to the end: no await, so no check sees a half-swapped state ---
        self._use_generation(loader.generation)
        for key, record in loader.records.items():
            if record is None:
                continue  # a swap never drops a counter (it keeps its last verdict)
            try:
                self.state.apply_verdict(key, record)
            except Exception as exc:  # a record the state cannot use: count it, go on
                self.metrics.undecodable[(loader.topics.budget_verdicts, "unusable")] += 1
                log.warning("skipped verdict %r of generation %r: %s", key, loader.generation, exc)
        self.metrics.records[loader.topics.budget_verdicts] += len(loader.records)
        new_tps = sorted(loader.positions)
        consumer.assign(kept + new_tps)
        for tp, position in positions.items():
            consumer.seek(tp, position)
        for tp, position in loader.positions.items():
            consumer.seek(tp, position)
        for tp in old_tps:
            self._start_end.pop(tp, None)
        self._start_end.update(loader.positions)
        self._verdict_tps = new_tps
        self._snapshot = None
        self._marked_polls = {}
        self.switches += 1
        log.info(
            "now following generation %r: %d verdicts loaded",
            loader.generation,
            len(loader.records),
        )

    def _apply(self, topic: str, messages: list[Any]) -> None:
        codec, apply = self._handlers[topic]
        metrics = self.metrics
        metrics.records[topic] += len(messages)
        is_verdicts = topic == self.topics.budget_verdicts
        for message in messages:
            try:
                value = message.value
                record = None if value is None else codec.decode(value)
                if message.key is not None:
                    key = message.key.decode("utf-8")
                elif record is not None:
                    key = record[self._key_field[topic]]
                else:
                    raise ContractError("tombstone without a key", reason="no_key")
                apply(key, record)
            except ContractError as exc:
                metrics.undecodable[(topic, exc.reason)] += 1
                log.warning("skipped %s@%s/%s: %s", topic, message.partition, message.offset, exc)
            except Exception as exc:  # a readable record the state cannot use
                metrics.undecodable[(topic, "unusable")] += 1
                log.warning(
                    "skipped %s@%s/%s: %s: %s",
                    topic,
                    message.partition,
                    message.offset,
                    type(exc).__name__,
                    exc,
                )
        if is_verdicts and self.state.ready and self.state.last_emitted_at_us is not None:
            metrics.verdict_lag_s = max(0.0, self.clock() - self.state.last_emitted_at_us / 1e6)

    async def _check_ready(self, consumer: AIOKafkaConsumer) -> None:
        for tp, end in self._start_end.items():
            if await consumer.position(tp) < end:
                return
        self.state.ready = True
        self.state.fresh_at_us = int(self.clock() * 1_000_000)
        self._marked_polls = {
            tp: consumer.last_poll_timestamp(tp) or -1 for tp in self._verdict_tps
        }
        self._ready_event.set()
        log.info(
            "enforcer ready: %d budgets, %d price versions, %d counters",
            len(self.state.budgets),
            len(self.state.prices),
            len(self.state.verdicts),
        )

    async def _check_fresh(self, consumer: AIOKafkaConsumer) -> None:
        tps = self._verdict_tps
        if self._snapshot is None:
            polls = {tp: consumer.last_poll_timestamp(tp) or -1 for tp in tps}
            if any(polls[tp] <= self._marked_polls.get(tp, -1) for tp in tps):
                return  # no new fetch response on some partition since the last mark
            highwater = {tp: consumer.highwater(tp) for tp in tps}
            if any(h is None for h in highwater.values()):
                return
            # when (on our clock) the oldest of these fetch responses arrived
            age_s = max(0.0, time.time() - min(polls.values(), default=0) / 1000)
            taken_at = int((self.clock() - age_s) * 1_000_000)
            self._snapshot = (highwater, taken_at, polls)
        highwater, taken_at, polls = self._snapshot
        for tp in tps:
            if await consumer.position(tp) < highwater[tp]:
                return
        self._snapshot = None
        self._marked_polls = polls
        if self.state.fresh_at_us is None or taken_at > self.state.fresh_at_us:
            self.state.fresh_at_us = taken_at

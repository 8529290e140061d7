"""Follows budget.policies, pricing and budget.verdicts into an EnforcerState.

Start-up (numbered as it runs in :meth:`Follower.start` / :meth:`Follower._run`):

1. Assign every partition of the three topics by hand (no consumer group: each
   enforcer reads everything) and seek to the beginning: the topics are
   compacted, so reading them whole rebuilds the whole state.
2. Record the end offsets seen at start. The state is *ready* once the
   position of every partition has reached them; until then checks are
   decided by ``fail_mode``.
3. Then follow the topics live, forever.

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
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from enforcer.config import EnforcerConfig
from enforcer.errors import TopicsMissing
from enforcer.holds import Holds
from enforcer.metrics import EnforcerMetrics
from enforcer.state import EnforcerState
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, VERDICT, Codec
from schemas.errors import ContractError
from schemas.topics import Topics

log = logging.getLogger("spendbus.enforcer.follower")

#: how long a getmany waits when there is nothing to read
POLL_TIMEOUT_MS = 200
MAX_RECORDS = 10_000
#: how often (clock seconds) expired holds are swept
SWEEP_INTERVAL_S = 1.0
TOPIC_WAIT_S = 10.0


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
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._start_end: dict[TopicPartition, int] = {}
        self._verdict_tps: list[TopicPartition] = []
        self._snapshot: tuple[dict[TopicPartition, int], int, dict[TopicPartition, int]] | None = (
            None
        )
        self._marked_polls: dict[TopicPartition, int] = {}
        self._ready_event = asyncio.Event()
        self._handlers: dict[str, tuple[Codec, Callable[[str, Any], Any]]] = {
            self.topics.budget_policies: (BUDGET_POLICY, state.apply_policy),
            self.topics.pricing: (PRICE_TABLE, state.apply_price),
            self.topics.budget_verdicts: (VERDICT, state.apply_verdict),
        }
        self._key_field = {
            self.topics.budget_policies: "budget_id",
            self.topics.pricing: "version",
            self.topics.budget_verdicts: "counter_key",
        }
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
        )
        await consumer.start()
        try:
            tps = await self._partitions(consumer)
            # Step 1: every partition, from the beginning
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            # Step 2: the end offsets that define "ready"
            self._start_end = await consumer.end_offsets(tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._verdict_tps = [tp for tp in tps if tp.topic == self.topics.budget_verdicts]
        # Step 3: follow
        self._task = asyncio.create_task(self._run(), name="spendbus-enforcer-follower")

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Every partition of the three topics, waiting a little for topics being created."""
        wanted = list(self._handlers)
        deadline = time.monotonic() + TOPIC_WAIT_S
        while True:
            # the consumer's own cluster view only knows assigned topics: ask for all
            cluster = await consumer._client.fetch_all_metadata()
            partitions = {t: cluster.partitions_for_topic(t) for t in wanted}
            missing = [t for t, ps in partitions.items() if not ps]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise TopicsMissing(
                    f"topics {', '.join(missing)} do not exist on {self.config.bootstrap}; "
                    "create them first (spendbus up creates every topic)"
                )
            await asyncio.sleep(0.5)
        return [TopicPartition(t, p) for t in wanted for p in sorted(partitions[t] or ())]

    async def stop(self) -> None:
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
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS)
                for tp, messages in batch.items():
                    self._apply(tp.topic, messages)
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

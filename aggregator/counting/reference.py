"""Reference data every worker needs whole: the budgets, the price versions and the
temporary raises (budget.raises, when the stack has that topic).

The topics are compacted and small; each worker reads them from the start
into memory (no Faust table: they are not partitioned by org) and follows
them live. Processing of usage waits until they are caught up to the end
offsets seen at start, so no event is priced against a half-loaded book.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import TopicReadStalled, read_until, start_at_beginning
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, PRICE_TABLE
from schemas.errors import ConfigError, ContractError
from schemas.pricing import PriceBook, PriceTable
from schemas.raises import RaiseBook
from schemas.topics import Topics

log = logging.getLogger(__name__)


@dataclass
class Reference:
    """Budgets by id and the price book, as of the last message read."""

    budgets: dict[str, Budget] = field(default_factory=dict)
    prices: PriceBook = field(default_factory=PriceBook)
    raises: RaiseBook = field(default_factory=RaiseBook)
    #: bumped on every change, so callers can cache derived lookups
    version: int = 0
    rejected: int = 0

    def apply_policy(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            self.rejected += 1
            return
        budget_id = key.decode("utf-8", "replace")
        if value is None:  # tombstone: the budget was deleted
            self.budgets.pop(budget_id, None)
        else:
            try:
                self.budgets[budget_id] = Budget.from_record(BUDGET_POLICY.decode(value))
            except ContractError as exc:
                self.rejected += 1
                log.warning("skipping unreadable budget %r: %s", budget_id, exc)
                return
        self.version += 1

    def apply_raise(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            self.rejected += 1
            return
        raise_id = key.decode("utf-8", "replace")
        try:
            self.raises.apply(raise_id, None if value is None else BUDGET_RAISE.decode(value))
        except ContractError as exc:
            self.rejected += 1
            log.warning("skipping unreadable raise %r: %s", raise_id, exc)
            return
        self.version += 1

    def apply_price_table(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.prices.remove(key.decode("utf-8", "replace"))
                self.version += 1
            return
        try:
            self.prices.add(PriceTable.from_record(PRICE_TABLE.decode(value)))
        except ContractError as exc:
            self.rejected += 1
            log.warning("skipping unreadable price table: %s", exc)
            return
        self.version += 1


class ReferenceFollower:
    """Reads budget.policies and pricing from the beginning, then follows them."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        reference: Reference,
        *,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.topics = topics
        self.reference = reference
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        #: why loading has not finished, while a read to the ends makes no progress
        self.stalled: TopicReadStalled | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        self._consumer = consumer
        partitions = await topic_partitions(
            self.bootstrap, self.topics.budget_policies, self.topics.pricing, security=self.security
        )
        try:
            partitions += await topic_partitions(
                self.bootstrap, self.topics.budget_raises, security=self.security
            )
        except ConfigError as exc:  # a stack created before raises existed
            log.warning("temporary raises not followed: %s", exc)
        ends = await start_at_beginning(consumer, partitions)
        self._task = asyncio.create_task(self._run(consumer, ends))
        self._task.add_done_callback(self._report_end)

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once loaded; after ``timeout_s`` raise the stall that holds it up, if one
        does, else TimeoutError."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout=timeout_s)
        except TimeoutError:
            if self.stalled is not None:
                raise self.stalled from None
            raise

    @staticmethod
    def _report_end(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("reference follower stopped: %r", task.exception())

    async def _run(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> None:
        while True:
            try:
                async for tp, messages in read_until(consumer, ends, max_records=1000):
                    self._apply(tp, messages)
                break
            except TopicReadStalled as exc:  # a worker waits for its reference: say why, go on
                self.stalled = exc
                log.error("reference data not loaded yet: %s", exc)
        self.stalled = None
        log.info(
            "reference data loaded: %d budgets, %d price versions",
            len(self.reference.budgets),
            len(self.reference.prices),
        )
        self.ready.set()
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for tp, messages in batches.items():
                self._apply(tp, messages)

    def _apply(self, tp: TopicPartition, messages: list[ConsumerRecord[Any, Any]]) -> None:
        for message in messages:
            try:
                if tp.topic == self.topics.budget_policies:
                    self.reference.apply_policy(message.key, message.value)
                elif tp.topic == self.topics.budget_raises:
                    self.reference.apply_raise(message.key, message.value)
                else:
                    self.reference.apply_price_table(message.key, message.value)
            except Exception:  # a record the book cannot use must not stop the worker
                self.reference.rejected += 1
                log.exception("skipping %s@%d/%d", tp.topic, tp.partition, message.offset)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()

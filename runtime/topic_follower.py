"""Topics read from their start, then followed live: each record handed to one function,
in offset order per partition. ``start`` returns once the records the broker held at start
are applied; a broker away while following is waited out (the client reconnects).

Its users keep their own state: ``CompactedView`` (runtime/compacted.py: the latest value
of each key) and the admin API's dead letters (admin/dead_letters.py: counts by reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import read_until, start_at_beginning

log = logging.getLogger("spendbus.topic_follower")

#: (topic, partition, offset, key, value) of one record
Apply = Callable[[str, int, int, bytes | None, bytes | None], None]


class TopicFollower:
    """``topics`` from their start into ``apply``, then followed until :meth:`stop`."""

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        apply: Apply,
        *,
        security: KafkaSecurity = PLAINTEXT,
        name: str = "topic follower",
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.apply = apply
        self.security = security
        #: how the logs name it
        self.name = name
        #: the started consumer (its positions say what was applied); None when stopped
        self.consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        partitions = await topic_partitions(self.bootstrap, *self.topics, security=self.security)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            ends = await start_at_beginning(consumer, partitions)
            async for tp, records in read_until(consumer, ends):
                for record in records:
                    self.apply(tp.topic, tp.partition, record.offset, record.key, record.value)
        except BaseException:
            await consumer.stop()
            raise
        self.consumer = consumer
        self._task = asyncio.create_task(self._follow(consumer))

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                fetched = await consumer.getmany(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker away: the client reconnects; keep serving
                log.warning("%s: fetch failed (%s); retrying", self.name, type(exc).__name__)
                await asyncio.sleep(1.0)
                continue
            for tp, records in fetched.items():
                for record in records:
                    self.apply(tp.topic, tp.partition, record.offset, record.key, record.value)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None

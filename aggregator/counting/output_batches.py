"""The counting stage's output: record batches per (topic, partition), sealed in epochs.

The loop fills batches; one pump task per partition hands them to the producer in
order, so a checkpoint's epoch sits below every later one in each output partition
(docs/design.md invariant 2; the checkpoint itself is in ``counting.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from aggregator.counting.errors import CountingError


@dataclass(slots=True)
class _Batch:
    """A record batch being filled, the checkpoint interval (epoch) its records belong to,
    and when it was started (timed topics only)."""

    records: Any
    epoch: int
    born: float | None


class Outgoing:
    """Record batches per (topic, partition), filled by the loop and handed over in the background.

    aiokafka keeps one batch per partition in its queue: ``send_batch`` waits until the
    previous one left. Awaiting that in the loop would stall folding for a broker round
    trip per batch, so one pump task per partition hands batches over in order while
    the loop goes on filling the next one (which then carries everything folded
    meanwhile: batches grow with load instead of queueing).

    Checkpoints cut the stream into **epochs**: ``seal()`` closes every open batch, so
    records added afterwards go into new batches of the next epoch, and ``settle(epoch)``
    waits until every batch of that epoch and before was handed over and returns their
    deliveries, while later batches keep flowing. Per partition the pump hands batches
    over in order and aiokafka sends one at a time, so an epoch's records sit below every
    later one in each output partition. A topic may have a producer of its own
    (``own_producer``): each partition still goes through exactly one producer, so that
    order holds, and every producer's batches belong to the same epochs.
    """

    def __init__(
        self,
        producer: AIOKafkaProducer,
        timed_topic: str | None = None,
        on_timed: Callable[[float], None] | None = None,
        own_producer: dict[str, AIOKafkaProducer] | None = None,
    ) -> None:
        self.producer = producer
        #: topics sent through a producer (a connection) of their own
        self.own_producer = own_producer or {}
        #: the records of the current epoch go into batches of this number
        self.epoch = 0
        #: batches not handed over yet, oldest first
        self.waiting: dict[tuple[str, int], list[_Batch]] = {}
        self.pumps: dict[tuple[str, int], asyncio.Task[None]] = {}
        #: epoch -> its batches not handed over yet
        self._unsent: dict[int, int] = {}
        #: epoch -> one future per handed-over batch (done when the broker has it), record count
        self._deliveries: dict[int, list[tuple[asyncio.Future[Any], int]]] = {}
        #: set whenever a pump handed a batch over or failed
        self._progress = asyncio.Event()
        self.failure: BaseException | None = None
        #: batches of this topic report (first record added -> acknowledged) in ms
        self.timed_topic = timed_topic
        self.on_timed = on_timed

    def add(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Append a record (``value`` None: a tombstone) to the partition's open batch."""
        where = (topic, partition)
        batches = self.waiting.get(where)
        if batches is None:
            batches = self.waiting[where] = []
        if (
            not batches
            or batches[-1].epoch != self.epoch  # sealed by a checkpoint
            or batches[-1].records.append(key=key, value=value, timestamp=None, headers=headers)
            is None
        ):
            batch = self._new(topic)
            batches.append(batch)
            if batch.records.append(key=key, value=value, timestamp=None, headers=headers) is None:
                size = 0 if value is None else len(value)
                raise CountingError(f"a record of {size} bytes does not fit a record batch")

    def _new(self, topic: str) -> _Batch:
        self._unsent[self.epoch] = self._unsent.get(self.epoch, 0) + 1
        born = time.monotonic() if topic == self.timed_topic else None
        producer = self.own_producer.get(topic, self.producer)
        return _Batch(producer.create_batch(), self.epoch, born)

    def seal(self) -> int:
        """Close the current epoch: its batches take no more records. Returns its number."""
        sealed = self.epoch
        self.epoch += 1
        self.release()
        return sealed

    def backlog(self) -> int:
        """Batches filled and not handed over yet."""
        return sum(len(batches) for batches in self.waiting.values())

    def release(self) -> None:
        """Start handing over what is waiting (no waiting here)."""
        for where, batches in self.waiting.items():
            if batches and where not in self.pumps:
                self.pumps[where] = asyncio.create_task(self._pump(where))

    async def _pump(self, where: tuple[str, int]) -> None:
        topic, partition = where
        producer = self.own_producer.get(topic, self.producer)
        try:
            while batches := self.waiting.pop(where, None):
                for batch in batches:
                    count = batch.records.record_count()
                    delivery = await producer.send_batch(batch.records, topic, partition=partition)
                    if batch.born is not None and self.on_timed is not None:
                        delivery.add_done_callback(_timer(self.on_timed, batch.born))
                    self._deliveries.setdefault(batch.epoch, []).append((delivery, count))
                    self._unsent[batch.epoch] -= 1
                    self._progress.set()
        except BaseException as exc:
            self.failure = exc
            self._progress.set()
            raise
        finally:
            del self.pumps[where]

    async def hand_over(self) -> None:
        """Hand over everything (the deliveries are kept for ``settle``)."""
        self.release()
        while self.pumps:
            await asyncio.gather(*self.pumps.values())  # a failed hand-over raises here

    async def settle(self, epoch: int) -> list[tuple[asyncio.Future[Any], int]]:
        """Wait until every batch of ``epoch`` and before was handed over; their deliveries
        (future, record count). Later batches are not waited for."""
        while True:
            if self.failure is not None:
                raise CountingError(f"an output batch was not handed over: {self.failure!r}")
            if not any(n for e, n in self._unsent.items() if e <= epoch):
                break
            self._progress.clear()
            self.release()
            await self._progress.wait()
        deliveries: list[tuple[asyncio.Future[Any], int]] = []
        for e in [e for e in self._deliveries if e <= epoch]:
            deliveries += self._deliveries.pop(e)
        for e in [e for e in self._unsent if e <= epoch]:
            del self._unsent[e]
        return deliveries


def _timer(report: Callable[[float], None], born: float) -> Callable[[Any], None]:
    return lambda _: report((time.monotonic() - born) * 1000)

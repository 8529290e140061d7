"""The dead letters (``usage.dlq``: what the aggregator or the HTTP ingest could not read
or price) counted by org and reason, followed live from the first request that asks.

A letter's org is the ``org_id`` of the usage event it holds, when that value still
decodes as one (a letter of an unknown schema version, a wrong key, an event-time bound);
a letter whose bytes do not read (bad magic, malformed Avro) carries no org anyone can
trust (its Kafka key is whatever the producer sent), so only a platform-admin sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import read_until, start_at_beginning
from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.errors import ContractError
from schemas.ids import canonical_id

log = logging.getLogger("spendbus.admin.dead_letters")

#: the reason of a record on the topic that is no DeadLetter itself (as `spendbus dlq` names it)
UNREADABLE_LETTER = "unreadable_letter"


@dataclass
class ReasonTally:
    count: int = 0
    last_failed_at: datetime | None = None
    #: the newest letter's detail (it names the field at fault)
    last_detail: str = ""
    stages: set[str] = field(default_factory=set)

    def add(self, letter: dict[str, Any]) -> None:
        self.count += 1
        failed_at = letter.get("failed_at")
        if isinstance(failed_at, datetime) and (
            self.last_failed_at is None or failed_at >= self.last_failed_at
        ):
            self.last_failed_at = failed_at
            self.last_detail = str(letter.get("detail", ""))
        if letter.get("stage"):
            self.stages.add(str(letter["stage"]))


def letter_org(letter: dict[str, Any]) -> str | None:
    """The org of the event a letter holds; None when its value is no usage event."""
    value = letter.get("value")
    if not isinstance(value, bytes):
        return None
    try:
        org = str(USAGE_EVENT.decode(value)["org_id"])
    except (ContractError, KeyError):
        return None
    return canonical_id(org, "org_id") or None  # the form tokens and counters name it by


@dataclass
class DeadLetterTally:
    """(org or None, reason) -> its tally, over every letter read so far."""

    tallies: dict[tuple[str | None, str], ReasonTally] = field(default_factory=dict)

    def add(self, value: bytes | None) -> None:
        letter: dict[str, Any]
        try:
            letter = dict(DEAD_LETTER.decode(value or b""))
        except ContractError as exc:
            letter = {"reason": UNREADABLE_LETTER, "detail": str(exc)}
        key = (letter_org(letter), str(letter["reason"]))
        self.tallies.setdefault(key, ReasonTally()).add(letter)

    def shown(self, org_id: str | None) -> list[dict[str, Any]]:
        """Per reason, the letters of ``org_id``'s events (None: every letter)."""
        merged: dict[str, ReasonTally] = {}
        for (org, reason), tally in self.tallies.items():
            if org_id is not None and org != org_id:
                continue
            into = merged.setdefault(reason, ReasonTally())
            into.count += tally.count
            into.stages |= tally.stages
            if tally.last_failed_at is not None and (
                into.last_failed_at is None or tally.last_failed_at >= into.last_failed_at
            ):
                into.last_failed_at = tally.last_failed_at
                into.last_detail = tally.last_detail
        return [
            {
                "reason": reason,
                "count": t.count,
                "stages": sorted(t.stages),
                "last_failed_at": None
                if t.last_failed_at is None
                else t.last_failed_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                "last_detail": t.last_detail,
            }
            for reason, t in sorted(merged.items(), key=lambda kv: (-kv[1].count, kv[0]))
        ]


class DeadLetterFollower:
    """The dead-letter topic read from its start, then followed; started by the first
    :meth:`tally` (a server whose dead letters nobody asks for opens no consumer)."""

    def __init__(self, bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security
        self._tally = DeadLetterTally()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def tally(self) -> DeadLetterTally:
        async with self._lock:
            if self._consumer is None:
                await self._start()
        return self._tally

    async def _start(self) -> None:
        partitions = await topic_partitions(self.bootstrap, self.topic, security=self.security)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            ends = await start_at_beginning(consumer, partitions)
            async for _, records in read_until(consumer, ends):
                for record in records:
                    self._tally.add(record.value)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow(consumer))

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                fetched = await consumer.getmany(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker away: the client reconnects; keep serving
                log.warning("dead letters: fetch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(1.0)
                continue
            for records in fetched.values():
                for record in records:
                    self._tally.add(record.value)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

"""The dead letters (``usage.dlq``: what the aggregator or the HTTP ingest could not read
or price) counted by org and reason, followed live from the first request that asks.

A letter's org is the ``org_id`` of the usage event it holds, when that value still
decodes as one (a letter of an unknown schema version, a wrong key, an event-time bound);
a letter whose bytes do not read (bad magic, malformed Avro) carries no org anyone can
trust (its Kafka key is whatever the producer sent), so only a platform-admin sees it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.topic_follower import TopicFollower
from schemas.codec import DEAD_LETTER, USAGE_EVENT
from schemas.errors import ContractError
from schemas.ids import canonical_id

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
        self._follower = TopicFollower(
            bootstrap, [topic], self._add, security=security, name="dead letters"
        )
        self._lock = asyncio.Lock()

    async def tally(self) -> DeadLetterTally:
        async with self._lock:
            if self._follower.consumer is None:
                try:
                    await self._follower.start()
                except BaseException:
                    # a read cut short starts again from the topic's start: nothing twice
                    self._tally = DeadLetterTally()
                    raise
        return self._tally

    def _add(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        self._tally.add(value)

    async def stop(self) -> None:
        await self._follower.stop()

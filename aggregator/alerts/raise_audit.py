"""The raises' audit table: every raise the reference follower read, into ClickHouse
``budget_raises`` (ddl/009), so analysts see who raised what, why and until when.

The compacted topic budget.raises is the truth; the table is its copy. A worker that owns
a store compares what the reference holds with the rows the table has (raise id and
revocation) and inserts what is missing or changed, after its reference has loaded and
again whenever it changes. A row written twice (a crash after the insert) is the same
row: ReplacingMergeTree keeps one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from aggregator.counting.reference import Reference
from schemas.periods import from_micros
from schemas.raises import BudgetRaise

log = logging.getLogger(__name__)

COLUMNS: Final = (
    "raise_id",
    "budget_id",
    "scope_values",
    "mode",
    "raise_nanos",
    "raise_tokens",
    "raise_requests",
    "starts_at",
    "until",
    "revoked_at",
    "reason",
    "created_by",
    "recorded_at",
)
#: how often the reference is compared with the table (when it changed)
POLL_SECONDS: Final = 1.0

Read = Callable[[str], Awaitable[list[Sequence[Any]]]]
Insert = Callable[[str, Sequence[str], list[list[Any]]], Awaitable[None]]


def _row(r: BudgetRaise, now: datetime) -> list[Any]:
    return [
        r.raise_id,
        r.budget_id,
        list(r.scope_values),
        r.mode,
        r.raise_nanos,
        r.raise_tokens,
        r.raise_requests,
        from_micros(r.starts_at_us),
        from_micros(r.until_us),
        None if r.revoked_at_us is None else from_micros(r.revoked_at_us),
        r.reason,
        r.created_by,
        now,
    ]


class RaiseAudit:
    def __init__(self, reference: Reference, read: Read, insert: Insert) -> None:
        self.reference = reference
        self.read = read
        self.insert = insert
        #: raise id -> its revocation as the table has it (None: not revoked)
        self._stored: dict[str, datetime | None] | None = None
        self._version = -1

    async def sync(self) -> int:
        """Insert the raises the table lacks or has unrevoked; how many rows were written."""
        if self._stored is None:
            rows = await self.read("SELECT raise_id, revoked_at FROM budget_raises FINAL")
            self._stored = {
                str(raise_id): None if revoked is None else _utc(revoked)
                for raise_id, revoked in rows
            }
        stored = self._stored
        now = datetime.now(UTC)
        fresh = [
            r
            for r in self.reference.raises.by_id.values()
            if r.raise_id not in stored
            or stored[r.raise_id]
            != (None if r.revoked_at_us is None else from_micros(r.revoked_at_us))
        ]
        if fresh:
            await self.insert("budget_raises", COLUMNS, [_row(r, now) for r in fresh])
            for r in fresh:
                stored[r.raise_id] = (
                    None if r.revoked_at_us is None else from_micros(r.revoked_at_us)
                )
            log.info("audit: %d raise row(s) written to budget_raises", len(fresh))
        return len(fresh)

    async def run(self, ready: asyncio.Event) -> None:
        """Sync after the reference has loaded, then whenever it changes."""
        await ready.wait()
        while True:
            version = self.reference.version
            if version != self._version:
                await self.sync()
                self._version = version
            await asyncio.sleep(POLL_SECONDS)


def _utc(value: Any) -> datetime:
    """A DateTime64 as the client returns it (naive UTC, or with its zone)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)

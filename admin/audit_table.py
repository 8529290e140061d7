"""The audit trail in ClickHouse: the ``admin_audit`` table this room creates and keeps
equal to the ``admin.audit`` topic, for analysts' SQL beside the spend.

The topic is the record; the table follows it: at start the entries the table lacks are
inserted (the view holds the whole topic), then each new entry as it comes. A failed
insert is retried (every 5 s) and never fails the request that made the entry. Entries
are keyed by audit id in a ReplacingMergeTree, so one inserted twice (a retry whose
first try did land) counts once after a merge and in every ``FINAL`` read.

The statements run through an :class:`AuditSink` the CLI hands in (a client on a
ClickHouse server); the embedded store belongs to the worker process, so with it the
trail stays on the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from admin.reports import quoted

log = logging.getLogger("spendbus.admin.audit")

DDL: Final = """
CREATE TABLE IF NOT EXISTS admin_audit
(
    audit_id     String,
    at           DateTime64(6, 'UTC'),
    token_id     String,
    role         LowCardinality(String),
    remote       String,
    action       LowCardinality(String),
    resource     LowCardinality(String),
    resource_id  String,
    org_id       Nullable(String),
    before       Nullable(String),
    after        Nullable(String)
)
ENGINE = ReplacingMergeTree
ORDER BY audit_id
"""
#: entries inserted per statement, and seconds between tries after a failure
BATCH: Final = 500
RETRY_S: Final = 5.0


@dataclass(frozen=True)
class AuditSink:
    """How statements reach the store: ``execute`` (DDL, INSERT) and ``select`` (rows)."""

    execute: Callable[[str], None]
    select: Callable[[str], Sequence[Sequence[Any]]]


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if not isinstance(value, str):
        value = json.dumps(value, default=str, sort_keys=True)
    return quoted(value)


def insert_sql(entries: Sequence[dict[str, Any]]) -> str:
    rows = ", ".join(
        "("
        + ", ".join(
            [
                _literal(e["audit_id"]),
                f"parseDateTime64BestEffort({_literal(e['at'])}, 6, 'UTC')",
                *(
                    _literal(e[name])
                    for name in (
                        "token_id",
                        "role",
                        "remote",
                        "action",
                        "resource",
                        "resource_id",
                        "org_id",
                        "before",
                        "after",
                    )
                ),
            ]
        )
        + ")"
        for e in entries
    )
    return (
        "INSERT INTO admin_audit (audit_id, at, token_id, role, remote, action, resource, "
        f"resource_id, org_id, before, after) VALUES {rows}"
    )


class AuditTable:
    """Keeps ``admin_audit`` equal to the topic: :meth:`start` with the entries the view
    holds, :meth:`add` for each new one."""

    def __init__(self, sink: AuditSink) -> None:
        self.sink = sink
        self.pending: dict[str, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, entry: dict[str, Any]) -> None:
        self.pending[entry["audit_id"]] = entry
        self._wake.set()

    async def start(self, entries: Sequence[dict[str, Any]]) -> None:
        for entry in entries:
            self.pending[entry["audit_id"]] = entry
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        created = False
        while True:
            try:
                if not created:
                    stored = await asyncio.to_thread(self._create)
                    for audit_id in stored:
                        self.pending.pop(audit_id, None)
                    created = True
                while self.pending:  # taken and dropped on the loop: add() runs there too
                    batch = list(self.pending.values())[:BATCH]
                    await asyncio.to_thread(self.sink.execute, insert_sql(batch))
                    for entry in batch:
                        self.pending.pop(entry["audit_id"], None)
            except Exception as exc:  # the store away: the topic holds the entries meanwhile
                log.warning("audit table: %s; retrying in %g s", type(exc).__name__, RETRY_S)
                await asyncio.sleep(RETRY_S)
                continue
            self._wake.clear()
            if not self.pending:
                await self._wake.wait()

    def _create(self) -> set[str]:
        """The table, created if missing; the audit ids it already holds."""
        self.sink.execute(DDL)
        return {str(row[0]) for row in self.sink.select("SELECT audit_id FROM admin_audit")}

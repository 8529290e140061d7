"""The admin API's audit trail into ClickHouse: the topic admin.audit followed from its
start into the ``admin_audit`` table (ddl/012), by every worker that owns a store, so the
trail is in SQL on the embedded store too (the admin server cannot open that one).

The topic is the record (append-only, kept forever); the table is its copy. At each start
the audit ids the table holds are read, then the whole topic: an entry the table lacks is
inserted, in batches as they are read, and the follower stays on the topic for new ones.
An entry inserted twice (a crash after an insert; two workers on one server store) is one
row after a merge (ReplacingMergeTree by audit id). A record that is no entry is logged
and skipped: it cannot stop the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer

from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import start_at_beginning
from schemas.admin_audit import AUDIT_COLUMNS, audit_row, decode_entry
from schemas.errors import ContractError

log = logging.getLogger(__name__)

TABLE: Final = "admin_audit"
#: entries read (and inserted) at most per batch
BATCH: Final = 1000

Read = Callable[[str], Awaitable[list[Sequence[Any]]]]
Insert = Callable[[str, Sequence[str], list[list[Any]]], Awaitable[None]]


class AdminAuditCopy:
    """Follows ``topic`` (admin.audit) into ``admin_audit`` through the worker's store
    (``read``, ``insert``: a :class:`~aggregator.sink.writer.StoreAccess`'s)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        read: Read,
        insert: Insert,
        *,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.read = read
        self.insert = insert
        self.security = security
        #: entries inserted since the process started (the worker's figure)
        self.inserted = 0

    async def run(self) -> None:
        """Catch the table up with the topic, then follow it (until cancelled)."""
        stored = {str(row[0]) for row in await self.read(f"SELECT audit_id FROM {TABLE}")}
        partitions = await topic_partitions(self.bootstrap, self.topic, security=self.security)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            await start_at_beginning(consumer, partitions)
            while True:
                fetched = await consumer.getmany(timeout_ms=1000, max_records=BATCH)
                rows = [
                    audit_row(entry)
                    for records in fetched.values()
                    for entry in self._entries(records)
                    if entry["audit_id"] not in stored
                ]
                if rows:
                    await self.insert(TABLE, AUDIT_COLUMNS, rows)
                    stored.update(str(row[0]) for row in rows)
                    self.inserted += len(rows)
                    log.info("audit: %d admin change(s) written to %s", len(rows), TABLE)
        finally:
            await consumer.stop()

    def _entries(self, records: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for record in records:
            if record.value is None:
                continue
            try:
                out.append(decode_entry(record.value))
            except ContractError as exc:  # not the admin API's: nothing to copy
                log.warning("%s at offset %d skipped: %s", self.topic, record.offset, exc)
        return out

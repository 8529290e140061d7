"""The sink's side of ClickHouse: open the store once, write a batch until it is stored,
and the worker's own reads (the alert publisher, the raises' audit) and analyst queries
(``/sql``, vetted by ``aggregator/sink/guard.py``) on the same store.

Whoever owns the store holds one: the sink process (``aggregator/sink/process.py``), or
the worker itself when its sink runs in its own process (``sink_process`` off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from clickhouse_connect.driver.client import Client

from aggregator.metrics import Metrics
from aggregator.sink.clickhouse import ClickHouseSink
from aggregator.sink.engine_link import EngineLink
from aggregator.sink.errors import SinkError, SinkUnavailable
from aggregator.sink.guard import KILL_GRACE_SECONDS, READ_ONLY_SESSION, QueryGuard
from aggregator.sink.store import apply_schema, chdb_path, open_client
from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess

log = logging.getLogger(__name__)


class StoreAccess(Protocol):
    """What the worker's alert publisher, raises' audit and ``/sql`` need of the store:
    a :class:`ClickHouseWriter` in this process, or ``aggregator.sink.link.SinkLink`` to
    the sink process that owns it."""

    async def open(self) -> object: ...

    async def read(self, sql: str) -> list[Sequence[Any]]: ...

    async def insert_until_done(
        self, table: str, columns: Sequence[str], rows: list[list[Any]]
    ) -> None: ...

    async def query(self, sql: Any) -> tuple[list[str], list[tuple[Any, ...]]]: ...


class ClickHouseWriter:
    """The sink stage's side of ClickHouse: open once, write a batch until it is stored.

    A batch is committed to Kafka only after its ``write_*_until_done`` returned, so
    while ClickHouse is away the sink stage waits (and Kafka keeps the rows);
    the counting stage, verdicts and alerts do not depend on it.
    """

    def __init__(
        self,
        dsn: str,
        metrics: Metrics,
        access: ClickHouseAccess = DEFAULT_ACCESS,
        spool_dir: str | None = None,
        *,
        engine_process: bool = False,
    ) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.access = access
        #: where the Avro container files the engine reads are written (0600, removed after)
        self.spool_dir = spool_dir
        self.sink: ClickHouseSink | None = None
        # analyst queries: a second client on the same store, readonly=1 and bounded
        self.guard: QueryGuard | None = None
        self._opening = asyncio.Lock()
        # one call into the sink's client at a time (the sink is not thread-safe)
        self._using = asyncio.Lock()
        # one analyst query at a time (the guard is not thread-safe either)
        self._querying = asyncio.Lock()
        path = chdb_path(dsn) if engine_process else None
        #: an embedded store's engine in a process of its own, walled in and killable
        #: (aggregator/sink/engine_host.py); None: a server, or the engine in this process
        self.engine: EngineLink | None = (
            EngineLink(dsn, path, spool_dir, kill_grace=KILL_GRACE_SECONDS)
            if path is not None
            else None
        )

    def _client(self, **settings: Any) -> Client:
        if self.engine is not None:
            # the part of Client's interface the sink and the guard use (EngineClient)
            return cast(Client, self.engine.client(**settings))
        return open_client(self.dsn, access=self.access, **settings)

    async def open(self) -> ClickHouseSink:
        async with self._opening:
            while self.sink is None:
                try:
                    self.sink = await asyncio.to_thread(self._open)
                except SinkUnavailable as exc:
                    self.metrics.sink_failures.inc()
                    log.warning("ClickHouse unavailable (%s); retrying in 2s", exc)
                    await asyncio.sleep(2)
            return self.sink

    def _open(self) -> ClickHouseSink:
        client = self._client()
        apply_schema(client)
        # an engine process reads the sink's container files as the engine in this one would
        avro = True if self.engine is not None else None
        return ClickHouseSink(client, spool_dir=self.spool_dir, avro_inserts=avro)

    async def write_messages_until_done(self, messages: Sequence[Any]) -> None:
        """Store usage.priced records (``ClickHouseSink.write_messages``), retrying until done."""
        sink = await self.open()
        inserted = await self._until_done(sink.write_messages, messages)
        self.metrics.sink_rows.inc(inserted)
        self.metrics.sink_skipped.inc(len(messages) - inserted)

    async def write_verdict_messages_until_done(self, messages: Sequence[Any]) -> None:
        """Store budget.verdicts records in budget_state, retrying until done."""
        sink = await self.open()
        await self._until_done(sink.write_verdict_messages, messages)

    async def _until_done(self, write: Callable[[Any], int], batch: Any) -> int:
        backoff = 0.5
        while True:
            try:
                async with self._using:
                    return await asyncio.to_thread(write, batch)
            except SinkError as exc:  # unavailable or rejected: never ack, retry the same batch
                self.metrics.sink_failures.inc()
                log.warning("ClickHouse insert failed (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def insert_until_done(
        self, table: str, columns: Sequence[str], rows: list[list[Any]]
    ) -> None:
        """Insert the worker's own ``rows`` into ``table`` (the raises' audit), retrying."""
        sink = await self.open()

        def insert(batch: list[list[Any]]) -> int:
            sink.client.insert(table, batch, column_names=list(columns))
            return len(batch)

        await self._until_done(insert, rows)

    async def read(self, sql: str) -> list[Sequence[Any]]:
        """Rows of ``sql``, the worker's own query (the alert publisher's), on the sink's
        client: never an analyst's text (those go through :meth:`query`)."""
        sink = await self.open()
        async with self._using:
            result = await asyncio.to_thread(sink.client.query, sql)
        return list(result.result_rows)

    async def query(self, sql: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Vet ``sql`` and run it read-only (QueryRefused when the guard refuses it)."""
        await self.open()  # the schema first: the guard's client only reads
        # beside the sink's writes when the engine has a process of its own (it answers
        # each call on a thread, and is killed if a query outlives its limit); after them
        # when the engine is this process's
        beside: contextlib.AbstractAsyncContextManager[Any] = (
            self._using if self.engine is None else contextlib.nullcontext()
        )
        async with self._querying, beside:
            if self.guard is None:
                self.guard = QueryGuard(lambda: self._client(**READ_ONLY_SESSION))
            return await asyncio.to_thread(self.guard.run, sql)

    def close(self) -> None:
        """End the engine's process, if the store has one."""
        if self.engine is not None:
            self.engine.close()

"""The Faust agents: glue between topics, tables and the pure batch processor.

Three agents:

* ``count`` reads usage.raw in batches (``take_events``), hands them to
  :class:`~aggregator.process.BatchProcessor`, then writes the counter and
  dedupe tables (each value to the changelog partition of the record that
  changed it) and sends priced events, verdicts, alerts and dead letters.
  Faust acks the batch after the body returns and, under at-least-once,
  flushes every one of these sends before it commits the source offsets.
* ``sink`` reads usage.priced in batches and writes them to ClickHouse
  (``aggregator/sink``), retrying while ClickHouse is away; only a batch
  that was inserted is acked. Counters and verdicts never wait for it.
* ``verdict-sink`` does the same for budget.verdicts into ``budget_state``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from functools import partial
from typing import Any, cast

import faust
from faust.streams import _current_event
from faust.types import EventT, StreamT, TableT

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.process import BatchProcessor, RawRecord
from aggregator.reference import Reference, ReferenceFollower
from aggregator.sink import (
    ClickHouseSink,
    SinkError,
    SinkUnavailable,
    apply_schema,
    open_client,
    run_query,
)
from schemas.codec import PRICED_USAGE, VERDICT

log = logging.getLogger(__name__)


class ClickHouseWriter:
    """The sink agents' side of ClickHouse: open once, write a batch until it is stored.

    A batch is acknowledged to Kafka only after ``write_until_done`` returns, so
    while ClickHouse is away the sink agents wait (and Kafka keeps the rows);
    the counting agent, verdicts and alerts do not depend on it.
    """

    def __init__(self, dsn: str, metrics: Metrics) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.sink: ClickHouseSink | None = None
        self._opening = asyncio.Lock()
        # one call into the client at a time: the embedded engine is one session per process
        self._using = asyncio.Lock()

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
        client = open_client(self.dsn)
        apply_schema(client)
        return ClickHouseSink(client)

    async def write_until_done(
        self, records: list[dict[str, Any]], *, verdicts: bool = False
    ) -> None:
        sink = await self.open()
        write = sink.write_verdicts if verdicts else sink.write
        backoff = 0.5
        while True:
            try:
                async with self._using:
                    inserted = await asyncio.to_thread(write, records)
            except SinkError as exc:  # unavailable or rejected: never ack, retry the same batch
                self.metrics.sink_failures.inc()
                log.warning("ClickHouse insert failed (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if not verdicts:
                self.metrics.sink_rows.inc(inserted)
                self.metrics.sink_skipped.inc(len(records) - inserted)
            return

    async def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        sink = await self.open()
        async with self._using:
            return await asyncio.to_thread(run_query, sink.client, sql)


def _act_as(event: EventT) -> None:
    """Make ``event`` the current event of this task, for Faust's table reads and writes.

    Faust keeps a table's values per partition and picks the partition (for a
    read, a write and its changelog record) from the current event, a context
    variable. A batch holds events of several partitions, so each access names
    its own. Only the context variable is set, never the stream's
    ``current_event`` attribute: the stream's background reader uses that one
    to pair each buffered value with its event, and changing it under the
    reader would swap a new record for an old one.
    """
    _current_event.set(weakref.ref(event))


def _read_as(by_partition: dict[int, EventT], table: TableT, partition: int, key: str) -> Any:
    """Read ``table[key]`` as stored for ``partition``."""
    _act_as(by_partition[partition])
    return table.get(key)


def install(app: faust.App, config: AggregatorConfig) -> None:
    topics = config.topics  # per generation (docs/replay.md)
    reference = Reference()
    follower = ReferenceFollower(config.bootstrap, topics, reference)
    processor = BatchProcessor(reference, source_topic=topics.usage_raw)
    metrics = Metrics()
    app.spendbus_metrics = metrics  # type: ignore[attr-defined]

    def raw_topic(name: str, partitions: int | None = None) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=partitions,
        )

    usage_raw = raw_topic(topics.usage_raw, config.partitions)
    usage_priced = raw_topic(topics.usage_priced, config.partitions)
    verdicts = raw_topic(topics.budget_verdicts, config.partitions)

    # Table names carry the topic prefix so parallel stacks on one cluster never share state.
    counters = app.Table(
        f"{config.topic_prefix}counters", default=None, partitions=config.partitions
    )
    seen = app.Table(
        f"{config.topic_prefix}seen-events", default=None, partitions=config.partitions
    )

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def drop_cached_counters(sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        processor.forget()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def drop_cached_counters_again(sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        processor.forget()

    @app.task
    async def load_reference() -> None:
        await follower.start()

    @app.agent(usage_raw, name="count")
    async def count(stream: StreamT) -> None:
        await follower.ready.wait()
        batches = cast(faust.Stream, stream).take_events(
            config.batch_size, within=config.batch_seconds
        )
        async for events in batches:
            started = time.perf_counter()
            records = [
                RawRecord(e.message.partition, e.message.offset, e.message.key, e.message.value)
                for e in events
            ]
            # table values live per partition: every access names its partition (_act_as)
            by_partition: dict[int, EventT] = {e.message.partition: e for e in events}
            out = processor.process(
                records,
                partial(_read_as, by_partition, counters),
                partial(_read_as, by_partition, seen),
            )
            folded = time.perf_counter()
            for (partition, counter), state in out.counter_writes.items():
                _act_as(by_partition[partition])
                counters[counter] = state
            for (partition, event_id), position in out.seen_writes.items():
                _act_as(by_partition[partition])
                seen[event_id] = position
            written = time.perf_counter()
            # Straight to Faust's producer (the Topic layer adds nothing to bytes in, bytes
            # out): it is the producer Faust flushes before it commits the source offsets.
            send = app.producer.send
            for partition, org, priced in out.priced:
                await send(topics.usage_priced, org, priced, partition, None, None)
            for counter, verdict in out.verdicts.items():
                await send(topics.budget_verdicts, counter.encode(), verdict, None, None, None)
            for counter_bytes, alert in out.alerts:
                await send(topics.budget_alerts, counter_bytes, alert, None, None, None)
            for raw_key, letter in out.dead_letters:
                await send(topics.usage_dlq, raw_key, letter, None, None, None)
            sent = time.perf_counter()
            metrics.record_batch(out.stats, len(out.verdicts), sent - started)
            metrics.record_phases(
                fold=folded - started, tables=written - folded, sends=sent - written
            )
            if out.unpriced_models:
                metrics.unpriced_models.update(out.unpriced_models)

    if config.clickhouse_dsn:
        writer = ClickHouseWriter(config.clickhouse_dsn, metrics)

        @app.agent(usage_priced, name="sink")
        async def write_clickhouse(stream: StreamT) -> None:
            await writer.open()
            async for values in stream.take(
                config.sink_batch_size, within=config.sink_batch_seconds
            ):
                await writer.write_until_done([PRICED_USAGE.decode(v) for v in values])

        @app.agent(verdicts, name="verdict-sink")
        async def write_budget_state(stream: StreamT) -> None:
            await writer.open()
            async for values in stream.take(
                config.sink_batch_size, within=config.sink_batch_seconds
            ):
                await writer.write_until_done([VERDICT.decode(v) for v in values], verdicts=True)

        @app.on_partitions_revoked.connect  # type: ignore[arg-type]
        async def forget_revoked(sender: Any, revoked: set[Any], **kwargs: Any) -> None:
            # another worker may write these partitions now: re-read their fences later
            gone = {tp.partition for tp in revoked if tp.topic == topics.usage_priced}
            if gone and writer.sink is not None:
                writer.sink.forget(gone)

        @app.page("/sql")
        class SqlView(faust.web.View):
            """Analyst queries while the worker owns the embedded store (one process per path)."""

            async def post(self, request: faust.web.Request) -> faust.web.Response:
                body = await request.json()
                try:
                    columns, rows = await writer.query(body["sql"])
                except Exception as exc:  # the analyst's SQL error goes back to the analyst
                    return self.json({"error": str(exc)}, status=400)
                return self.json(
                    {"columns": columns, "rows": json.loads(json.dumps(rows, default=str))}
                )

    @app.page("/stats")
    async def stats(web: Any, request: Any) -> Any:
        return web.json(
            {
                **metrics.snapshot(),
                "reference_ready": follower.ready.is_set(),
                "budgets": len(reference.budgets),
                # serving = budgets and prices loaded and this worker owns (recovered) partitions
                "assigned_partitions": len(assigned := app.assignor.assigned_actives()),
                "serving": follower.ready.is_set() and bool(assigned) and not app.rebalancing,
            }
        )

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(metrics.exposition(), content_type="text/plain; version=0.0.4")

    app.spendbus_stop_follower = follower.stop  # type: ignore[attr-defined]

"""The Faust agents: glue between topics, tables and the pure batch processor.

Two agents:

* ``count`` reads usage.raw in batches (``take_events``), hands them to
  :class:`~aggregator.process.BatchProcessor`, then writes the counter and
  dedupe tables (each value to the changelog partition of the record that
  changed it) and sends priced events, verdicts, alerts and dead letters.
  Faust acks the batch after the body returns and, under at-least-once,
  flushes every one of these sends before it commits the source offsets.
* ``sink`` reads usage.priced in batches and writes them to ClickHouse
  (``aggregator/sink``), retrying while ClickHouse is away; only a batch
  that was inserted is acked. Counters and verdicts never wait for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import faust
from faust.types import EventT, StreamT

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.process import BatchProcessor, RawRecord
from aggregator.reference import Reference, ReferenceFollower
from schemas.codec import PRICED_USAGE
from schemas.topics import Topics

log = logging.getLogger(__name__)


def install(app: faust.App, config: AggregatorConfig) -> None:
    topics = Topics(config.topic_prefix)
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
    alerts = raw_topic(topics.budget_alerts)
    dlq = raw_topic(topics.usage_dlq)

    # Table names carry the topic prefix so parallel stacks on one cluster never share state.
    counters = app.Table(
        f"{config.topic_prefix}counters", default=None, partitions=config.partitions
    )
    seen = app.Table(
        f"{config.topic_prefix}seen-events", default=None, partitions=config.partitions
    )

    @app.task
    async def load_reference() -> None:
        await follower.start()

    @app.agent(usage_raw, name="count")
    async def count(stream: StreamT) -> None:
        await follower.ready.wait()
        async for events in stream.take_events(config.batch_size, within=config.batch_seconds):
            started = time.perf_counter()
            records = [
                RawRecord(e.message.partition, e.message.offset, e.message.key, e.message.value)
                for e in events
            ]
            out = processor.process(records, counters, seen)
            # A table write goes to the changelog partition of the "current event":
            # point it at an event of the right source partition before each write.
            by_partition: dict[int, EventT] = {e.message.partition: e for e in events}
            for (partition, key), value in out.counter_writes.items():
                stream._set_current_event(by_partition[partition])
                counters[key] = value
            for (partition, key), value in out.seen_writes.items():
                stream._set_current_event(by_partition[partition])
                seen[key] = value
            for key, value in out.priced:
                await usage_priced.send(key=key, value=value)
            for counter, value in out.verdicts.items():
                await verdicts.send(key=counter.encode(), value=value)
            for key, value in out.alerts:
                await alerts.send(key=key, value=value)
            for key, value in out.dead_letters:
                await dlq.send(key=key, value=value)
            metrics.record_batch(out.stats, len(out.verdicts), time.perf_counter() - started)
            if out.unpriced_models:
                metrics.unpriced_models.update(out.unpriced_models)

    if config.clickhouse_dsn:
        from aggregator.sink.clickhouse import ClickHouseSink

        sink = ClickHouseSink(config.clickhouse_dsn)
        app.spendbus_sink = sink  # type: ignore[attr-defined]

        @app.agent(usage_priced, name="sink")
        async def write_clickhouse(stream: StreamT) -> None:
            await asyncio.to_thread(sink.open)
            async for values in stream.take(
                config.sink_batch_size, within=config.sink_batch_seconds
            ):
                records = [PRICED_USAGE.decode(v) for v in values]
                await sink.write_until_done(records, metrics)

        @app.page("/sql")
        async def sql(web: Any, request: Any) -> Any:
            """Analyst queries while the worker owns the embedded store (one process per path)."""
            body = await request.json()
            try:
                columns, rows = await asyncio.to_thread(sink.query, body["sql"])
            except Exception as exc:  # the analyst's SQL error goes back to the analyst
                return web.json({"error": str(exc)}, status=400)
            return web.json({"columns": columns, "rows": json.loads(json.dumps(rows, default=str))})

    @app.page("/stats")
    async def stats(web: Any, request: Any) -> Any:
        return web.json(
            {
                **metrics.snapshot(),
                "reference_ready": follower.ready.is_set(),
                "budgets": len(reference.budgets),
            }
        )

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(metrics.exposition(), content_type="text/plain; version=0.0.4")

    app.spendbus_stop_follower = follower.stop  # type: ignore[attr-defined]

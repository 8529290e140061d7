"""The Faust side of the aggregator: the counting stage's service, two sink agents, pages.

* the counting stage (``counting.py``) reads usage.raw in large batches with its
  own aiokafka consumer (group ``config.counting_group``), folds them with
  :class:`~aggregator.process.BatchProcessor`, keeps counters and dedupe in its
  changelogged store and sends priced events, verdicts, alerts and dead letters
  in record batches. It is not a Faust agent: Faust's per-message stream path
  alone costs more than the whole fold (aggregator/README.md, Performance). A
  mode service starts and stops it with the worker.
* ``sink`` reads usage.priced in batches and writes them to ClickHouse
  (``aggregator/sink``), retrying while ClickHouse is away; only a batch
  that was inserted is acked. Counters and verdicts never wait for it.
* ``verdict-sink`` does the same for budget.verdicts into ``budget_state``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import faust
import mode
from faust.types import StreamT

from aggregator.config import AggregatorConfig
from aggregator.counting import CountingStage
from aggregator.metrics import Metrics
from aggregator.process import BatchProcessor
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
    the counting stage, verdicts and alerts do not depend on it.
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


def install(app: faust.App, config: AggregatorConfig) -> None:
    topics = config.topics  # per generation (docs/replay.md)
    reference = Reference()
    follower = ReferenceFollower(
        config.bootstrap, topics, reference, security=config.kafka_security
    )
    processor = BatchProcessor(
        reference,
        source_topic=topics.usage_raw,
        max_future_skew_seconds=config.max_future_skew_seconds,
    )
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

    usage_priced = raw_topic(topics.usage_priced, config.partitions)
    verdicts = raw_topic(topics.budget_verdicts, config.partitions)
    stage = CountingStage(config, topics, processor, metrics, follower.ready)
    metrics.watch_lag(config.counting_group, stage.lag)

    @app.task
    async def load_reference() -> None:
        await follower.start()

    @app.service
    class Counting(mode.Service):
        """Starts the counting stage with the worker and stops it (last checkpoint) with it."""

        async def on_start(self) -> None:
            stage.on_crash = self._crash_worker
            await stage.start()

        async def on_stop(self) -> None:
            await stage.stop()
            await follower.stop()

        async def _crash_worker(self, exc: BaseException) -> None:
            # nothing past the last checkpoint was committed: the next owner re-reads it
            log.critical("counting stage failed, stopping the worker: %r", exc)
            asyncio.get_running_loop().call_later(10, os._exit, 70)
            await app.crash(exc)

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
                "assigned_partitions": len(stage.owned),
                "serving": stage.serving,
            }
        )

    @app.page("/metrics")
    async def prometheus(web: Any, request: Any) -> Any:
        return web.bytes(metrics.exposition(), content_type="text/plain; version=0.0.4")

    app.spendbus_counting = stage  # type: ignore[attr-defined]

"""The Faust side of the aggregator: the counting and sink stages' services, pages.

* the counting stage (``counting.py``) reads usage.raw in large batches with its
  own aiokafka consumer (group ``config.counting_group``), folds them with
  :class:`~aggregator.counting.process.BatchProcessor`, keeps counters and dedupe in its
  changelogged store and sends priced events, verdicts, alerts and dead letters
  in record batches. It is not a Faust agent: Faust's per-message stream path
  alone costs more than the whole fold (docs/design.md, "Why it is built this way";
  measured in bench/records/history_aggregator.md). A
  mode service starts and stops it with the worker.
* the sink stage (``sink_stage.py``), for the same reason not a Faust agent either, reads
  usage.priced and budget.verdicts in large batches (group ``config.sink_app_id``) and
  writes them to ClickHouse through a ``ClickHouseWriter`` (``clickhouse_writer.py``),
  retrying while ClickHouse is away; only a stored batch is committed. Counters and
  verdicts never wait for it. It runs on this worker's loop, as the counting stage does,
  or with ``sink_process`` on in a sink process of its own, which owns the store
  (``sink_link.py`` starts and restarts it, ``sink_process.py`` is it), so the alert
  publisher, the raises' audit and ``/sql`` reach the store through it.
* ``publish_alerts`` sends each alert of ClickHouse's ``alerts`` view once to the shared
  alert topic (``aggregator/alerts/publisher.py``); a worker without a store sends the fold's alerts.

Pages: ``/sql`` (bearer token always; the query vetted and run read-only by
``aggregator/sink/guard.py``), ``/stats`` and ``/metrics`` (open on loopback, the token
off it). Tokens are compared in constant time; none is ever logged.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import faust
import mode
from aiokafka.errors import KafkaError

from aggregator.alerts.publisher import AlertPublisher, generation_is_current
from aggregator.alerts.raise_audit import RaiseAudit
from aggregator.config import AggregatorConfig
from aggregator.counting.process import BatchProcessor
from aggregator.counting.reference import Reference, ReferenceFollower
from aggregator.counting.stage import CountingStage
from aggregator.metrics import Metrics
from aggregator.sink import SinkError, SinkUnavailable
from aggregator.sink.admin_audit import AdminAuditCopy
from aggregator.sink.errors import QueryRefused
from aggregator.sink.link import SinkLink
from aggregator.sink.stage import SinkStage
from aggregator.sink.writer import ClickHouseWriter, StoreAccess
from runtime.half_close import AnswerAfterHalfClose
from runtime.net import is_loopback
from schemas.errors import SpendbusError

log = logging.getLogger(__name__)


def bearer_check(token: str | None) -> Callable[[Any], bool]:
    """``allowed(request) -> bool``: does the request carry ``Authorization: Bearer <token>``?

    Constant-time; with no token nothing is allowed.
    """
    expected = f"Bearer {token}".encode() if token else None

    def allowed(request: Any) -> bool:
        if expected is None:
            return False
        given = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(given, expected)

    return allowed


def _unauthorized(web: faust.web.View, detail: str, status: int = 401) -> faust.web.Response:
    return web.json(
        {"error": detail, "refused": "unauthorized"},
        status=status,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _sink_in_this_process(
    app: faust.App, config: AggregatorConfig, metrics: Metrics
) -> ClickHouseWriter:
    """The sink stage on this worker's own event loop (``sink_process`` off): the store is
    this process's, reached through the writer the stage writes with."""
    assert config.clickhouse_dsn is not None
    spool = config.data_dir / "sink"
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    writer = ClickHouseWriter(
        config.clickhouse_dsn,
        metrics,
        config.clickhouse_access,
        spool_dir=str(spool),
        engine_process=config.engine_process,
    )
    sink_stage = SinkStage(config, config.topics, writer, metrics)
    metrics.watch_lag(config.sink_app_id, sink_stage.lag)
    app.spendbus_sink = sink_stage  # type: ignore[attr-defined]  # faust.App declares no such field

    @app.service
    class Sink(mode.Service):
        """Starts the sink stage with the worker and stops it with it."""

        async def on_start(self) -> None:
            sink_stage.on_crash = self._crash_worker
            await sink_stage.start()

        async def on_stop(self) -> None:
            await sink_stage.stop()

        async def _crash_worker(self, exc: BaseException) -> None:
            # nothing past the last commit was acknowledged: the next owner re-reads it
            log.critical("sink stage failed, stopping the worker: %r", exc)
            asyncio.get_running_loop().call_later(10, os._exit, 70)
            await app.crash(exc)

    return writer


def install(app: faust.App, config: AggregatorConfig) -> None:
    topics = config.topics  # per generation (docs/replay.md)
    reference = Reference()
    follower = ReferenceFollower(
        config.bootstrap, topics, reference, security=config.kafka_security
    )
    metrics = Metrics()
    app.spendbus_metrics = metrics  # type: ignore[attr-defined]  # faust.App declares no such field
    stage = _counting(app, config, reference, follower, metrics)

    token = config.web_token.get_secret_value() if config.web_token is not None else None
    authorized = bearer_check(token)
    # on loopback only this machine can reach /stats and /metrics; elsewhere every page
    # needs the token (Prometheus sends it: authorization.credentials_file)
    pages_open = is_loopback(config.web_host)

    # the sink process, when the sink runs in one (/stats shows its pid and starts)
    link: SinkLink | None = None
    if config.clickhouse_dsn:
        store: StoreAccess
        if config.sink_process:
            link = store = _sink_process(app, config, metrics)
        else:
            store = _sink_in_this_process(app, config, metrics)
        _store_tasks(app, config, store, reference, follower, metrics)
        _sql_page(app, config, store, token, authorized)

    @app.page("/stats")
    async def stats(web: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        if not pages_open and not authorized(request):
            return _unauthorized(web, "a valid bearer token is required off loopback")
        return web.json(
            {
                **metrics.snapshot(),
                "reference_ready": follower.ready.is_set(),
                "budgets": len(reference.budgets),
                # budget id -> counting fingerprint: counted from its period's start, and
                # budget id -> the partitions still being read again for it
                "budgets_counting": stage.backfills.counting(),
                "budgets_loading": stage.backfills.loading(),
                # serving = budgets and prices loaded and this worker owns (recovered) partitions
                "assigned_partitions": len(stage.owned),
                "serving": stage.serving,
                **(
                    {"sink_process": {"pid": link.pid, "starts": link.starts}}
                    if link is not None
                    else {}
                ),
            }
        )

    @app.page("/metrics")
    async def prometheus(web: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        if not pages_open and not authorized(request):
            return _unauthorized(web, "a valid bearer token is required off loopback")
        return web.bytes(metrics.exposition(), content_type="text/plain; version=0.0.4")

    # the pages' connections log no request bytes: a malformed request is counted, and
    # logged once per interval without its head (runtime/http_log.py); and a client that
    # half-closed after its request still gets the answer (runtime/half_close.py)
    # Faust's aiohttp driver keeps its AppRunner (not yet set up) there
    app.web._runner.__class__ = AnswerAfterHalfClose  # type: ignore[attr-defined]  # on the aiohttp driver only

    app.spendbus_counting = stage  # type: ignore[attr-defined]  # faust.App declares no such field


def _counting(
    app: faust.App,
    config: AggregatorConfig,
    reference: Reference,
    follower: ReferenceFollower,
    metrics: Metrics,
) -> CountingStage:
    """The counting stage, its reference loaded by a task of the worker and its service
    started and stopped with the worker."""
    processor = BatchProcessor(
        reference,
        source_topic=config.topics.usage_raw,
        max_future_skew_seconds=config.max_future_skew_seconds,
    )
    stage = CountingStage(config, config.topics, processor, metrics, follower.ready)
    metrics.watch_lag(config.counting_group, stage.lag)

    # faust's App.task is @no_type_check: called, not a decorator, the tasks keep their types
    async def load_reference() -> None:
        await follower.start()

    app.task(load_reference)

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

    return stage


def _sink_process(app: faust.App, config: AggregatorConfig, metrics: Metrics) -> SinkLink:
    """The sink stage and the store in an OS process of their own (sink/process.py):
    everything else reaches the store through the link, started and stopped with the
    worker (restarted if it dies)."""
    link = SinkLink(config, metrics)
    metrics.watch_lag(config.sink_app_id, link.lag)
    app.spendbus_sink_link = link  # type: ignore[attr-defined]  # faust.App declares no such field

    @app.service
    class SinkProcess(mode.Service):
        """Starts the sink process with the worker (restarted if it dies) and
        stops it with it."""

        async def on_start(self) -> None:
            await link.start()

        async def on_stop(self) -> None:
            await link.stop()

    return link


def _store_tasks(
    app: faust.App,
    config: AggregatorConfig,
    store: StoreAccess,
    reference: Reference,
    follower: ReferenceFollower,
    metrics: Metrics,
) -> None:
    """The worker's tasks that read the store: the alert publisher, the raises' audit and
    the admin API's audit trail, each started again while ClickHouse or Kafka is away."""
    # each alert once on the shared topic, from ClickHouse's record (aggregator/alerts/publisher.py)
    publisher = AlertPublisher(
        config.bootstrap,
        config.topics,
        store.read,
        security=config.kafka_security,
        is_current=lambda: generation_is_current(
            config.bootstrap, config.topics, security=config.kafka_security
        ),
        folded=metrics.unpriced_alerts_folded.inc,
        reference=reference,
        ready=follower.ready,
    )

    # every raise into budget_raises, the audit table (aggregator/alerts/raise_audit.py)
    audit = RaiseAudit(reference, store.read, store.insert_until_done)

    async def audit_raises() -> None:
        await store.open()
        while True:
            try:
                await audit.run(follower.ready)
            except SinkError as exc:  # ClickHouse away: again
                log.warning("raise audit: %s; starting again in 5s", exc)
                await asyncio.sleep(5)

    async def publish_alerts() -> None:
        await store.open()
        while True:
            try:
                await publisher.run()
            except (SinkError, KafkaError) as exc:  # ClickHouse or Kafka away: again
                log.warning("alert publisher: %s; starting again in 5s", exc)
                await asyncio.sleep(5)

    # the admin API's audit trail into admin_audit (aggregator/sink/admin_audit.py)
    admin_audit = AdminAuditCopy(
        config.bootstrap,
        config.topics.admin_audit,
        store.read,
        store.insert_until_done,
        security=config.kafka_security,
    )

    async def copy_admin_audit() -> None:
        await store.open()
        while True:
            try:
                await admin_audit.run()
            except (SpendbusError, KafkaError) as exc:  # ClickHouse, Kafka or the topic away
                log.warning("admin audit copy: %s; starting again in 5s", exc)
                await asyncio.sleep(5)

    app.task(audit_raises)
    app.task(publish_alerts)
    app.task(copy_admin_audit)


def _sql_page(
    app: faust.App,
    config: AggregatorConfig,
    store: StoreAccess,
    token: str | None,
    authorized: Callable[[Any], bool],
) -> None:
    @app.page("/sql")
    class SqlView(faust.web.View):
        """Analyst queries, read-only, while the worker owns the store (bearer token).

        401 without the token, 400 for a body that is not ``{"sql": "..."}`` or SQL the
        engine cannot parse or run, 403 for a query the guard or the engine's read-only
        mode refuses (``refused`` names why), 503 while ClickHouse is away.
        """

        async def post(self, request: faust.web.Request) -> faust.web.Response:
            if token is None:
                return _unauthorized(self, "this worker has no web token: /sql is off", status=403)
            if not authorized(request):
                return _unauthorized(self, "a valid bearer token is required")
            try:
                async with asyncio.timeout(config.web_body_timeout_s):
                    raw = await request.read()
            except TimeoutError:
                return self.json(
                    {
                        "error": "request body not received within "
                        f"{config.web_body_timeout_s:g} s of its headers"
                    },
                    status=408,
                )
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):  # nested too deeply too: a 400, not a 500
                return self.json(
                    {"error": 'the body must be JSON: {"sql": "SELECT ..."}'}, status=400
                )
            if not isinstance(body, dict) or not isinstance(body.get("sql"), str):
                return self.json({"error": 'expected {"sql": "SELECT ..."}'}, status=400)
            try:
                columns, rows = await store.query(body["sql"])
            except QueryRefused as exc:
                status = 400 if exc.reason in ("bad_request", "empty", "limit") else 403
                return self.json({"error": str(exc), "refused": exc.reason}, status=status)
            except SinkUnavailable as exc:
                return self.json({"error": str(exc)}, status=503)
            except SinkError as exc:  # the analyst's SQL error goes back to the analyst
                return self.json({"error": str(exc)}, status=400)
            return self.json(
                {"columns": columns, "rows": json.loads(json.dumps(rows, default=str))}
            )

"""The notifier: follow the shared alert topic, deliver each alert once to each webhook.

Start (each time, after a clean stop or a kill -9 alike):

1. read ``notify.deliveries`` whole (:mod:`notify.deliveries`): the (webhook, alert id)s
   finished, and where each webhook starts on the alert topic; a webhook seen for the
   first time gets a start record (the topic's beginning, or its end with
   ``start="latest"``);
2. bring the delivery log (ClickHouse ``alert_deliveries``, when one is given) up to the
   records: a crash between a record and its log row loses no row;
3. read the alert topic from its beginning and follow it. Each alert a webhook takes
   (its filters, its start) and has not finished goes into **that webhook's queue**; a
   repeated alert id, on the topic or in the queue, is dropped.

Each webhook has one task taking its queue in order (one alert in flight per webhook),
so a webhook that keeps failing delays only its own alerts. An alert is **recorded
after its 2xx** (or on giving up), the record acknowledged by the brokers (``acks=all``)
before the next alert of that webhook is sent; only then is the ClickHouse row written.

What exactly once means here: a (alert, webhook) recorded is never sent again. A kill -9
after the receiver's 2xx and before the record's acknowledgement (a window of one broker
round trip) sends that one alert again after the restart, with the same
``Idempotency-Key``: the receiver can drop the repeat. Run one notifier per set of
webhooks: two notifiers sharing a webhook id would both send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from notify.deliveries import (
    DELIVERED,
    FAILED,
    Delivery,
    DeliveryState,
    delivery_key,
    start_key,
    start_value,
)
from notify.metrics import NotifyMetrics
from notify.payload import body
from notify.sender import deliver
from notify.webhooks import Webhook, redact_url
from runtime.kafka import PLAINTEXT, KafkaSecurity, topic_partitions
from runtime.topic_reader import TopicReader
from schemas.codec import ALERT, BUDGET_POLICY
from schemas.errors import ContractError
from schemas.records import Alert
from schemas.topics import Topics

log = logging.getLogger(__name__)

#: writes delivery rows to the log (ClickHouse); may raise, the rows are then kept and retried
DeliveryLog = Callable[[Sequence[Delivery]], Awaitable[None]]
#: which (webhook, alert id)s the log already has
LoggedKeys = Callable[[], Awaitable[set[tuple[str, str]]]]
Start = Literal["earliest", "latest"]
#: a delivery record that the brokers refused is sent again after this many seconds
RECORD_RETRY_SECONDS: Final = 1.0
#: delivery rows the log could not take are offered again after this many seconds
LOG_RETRY_SECONDS: Final = 5.0
#: a stop waits this long for the delivery rows not yet in the log
FLUSH_TIMEOUT_SECONDS: Final = 10.0
#: the budget policies are read again at most this often when an alert names an unknown one
POLICY_REFRESH_SECONDS: Final = 10.0


async def read_topic(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) of ``topic`` up to the end offsets seen at start, in order per
    partition."""
    out: list[tuple[bytes | None, bytes | None]] = []
    async with TopicReader(bootstrap, topic, security=security) as reader:
        async for _, messages in reader:
            out.extend((m.key, m.value) for m in messages)
    return out


@dataclass(frozen=True)
class Job:
    alert: Alert
    scope: str | None
    offset: int


class Notifier:
    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        webhooks: Sequence[Webhook],
        *,
        security: KafkaSecurity = PLAINTEXT,
        start: Start = "earliest",
        delivery_log: DeliveryLog | None = None,
        logged_keys: LoggedKeys | None = None,
        metrics: NotifyMetrics | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.webhooks = list(webhooks)
        self.security = security
        self.start = start
        self.delivery_log = delivery_log
        self.logged_keys = logged_keys
        self.metrics = metrics or NotifyMetrics()
        self.state = DeliveryState()
        self.queues: dict[str, asyncio.Queue[Job]] = {w.id: asyncio.Queue() for w in webhooks}
        #: (webhook, alert id) queued or in flight: a repeat on the topic is not queued again
        self._pending: set[tuple[str, str]] = set()
        self._scopes: dict[str, str] = {}
        self._scopes_read_at = float("-inf")
        self._unlogged: list[Delivery] = []
        self._log_wakeup = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None

    def status(self) -> list[dict[str, Any]]:
        """Per webhook: id, redacted URL, queued, delivered and failed (from the records)."""
        out = []
        for w in self.webhooks:
            done = [d for (wid, _), d in self.state.finished.items() if wid == w.id]
            out.append(
                {
                    "webhook": w.id,
                    "url": redact_url(w.url),
                    "queued": self.queues[w.id].qsize(),
                    "delivered": sum(d.status == DELIVERED for d in done),
                    "failed": sum(d.status == FAILED for d in done),
                }
            )
        return out

    async def run(self) -> None:
        await self._read_state()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            **self.security.client_kwargs(),
        )
        await self._producer.start()
        tasks: list[asyncio.Task[None]] = []
        try:
            partitions = await topic_partitions(
                self.bootstrap, self.topics.shared_alerts, security=self.security
            )
            await self._register_new_webhooks(partitions)
            if self.delivery_log is not None:
                await self._catch_up_log()
                tasks.append(asyncio.create_task(self._write_log(), name="notify-log"))
            async with aiohttp.ClientSession() as session:
                tasks.extend(
                    asyncio.create_task(self._serve(session, w), name=f"notify-{w.id}")
                    for w in self.webhooks
                )
                for w in self.status():
                    log.info("webhook %s %s: %s", w["webhook"], w["url"], w)
                await self._follow(partitions)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._flush_log()
            await self._producer.stop()

    # --- start ----------------------------------------------------------------------------
    async def _read_state(self) -> None:
        for key, value in await read_topic(
            self.bootstrap, self.topics.notify_deliveries, security=self.security
        ):
            if key is None:
                continue
            try:
                self.state.add(key, value)
            except (ContractError, ValueError, KeyError) as exc:
                log.error(
                    "skipping an unreadable record of %s: %s", self.topics.notify_deliveries, exc
                )

    async def _register_new_webhooks(self, partitions: list[TopicPartition]) -> None:
        new = [w for w in self.webhooks if w.id not in self.state.starts]
        if not new:
            return
        offsets: dict[int, int] = {tp.partition: 0 for tp in partitions}
        if self.start == "latest":
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=None, **self.security.client_kwargs()
            )
            await consumer.start()
            try:
                ends = await consumer.end_offsets(partitions)
            finally:
                await consumer.stop()
            offsets = {tp.partition: ends[tp] for tp in partitions}
        for w in new:
            await self._send_record(start_key(w.id), start_value(w.id, redact_url(w.url), offsets))
            self.state.starts[w.id] = dict(offsets)
            log.info(
                "webhook %s is new: it starts at %s of %s",
                w.shown,
                offsets,
                self.topics.shared_alerts,
            )

    async def _catch_up_log(self) -> None:
        assert self.logged_keys is not None
        try:
            logged = await self.logged_keys()
        except Exception as exc:  # the log is a copy: the records stay the truth
            log.warning("delivery log unavailable at start (%s): rows wait", type(exc).__name__)
            logged = set()
        self._unlogged = [d for key, d in self.state.finished.items() if key not in logged]

    # --- the alert topic --------------------------------------------------------------------
    async def _follow(self, partitions: list[TopicPartition]) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            **self.security.client_kwargs(),
        )
        await consumer.start()
        try:
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            while True:
                batches = await consumer.getmany(timeout_ms=1000)
                for tp, messages in batches.items():
                    for message in messages:
                        await self._dispatch(tp.partition, message.offset, message.value)
        finally:
            await consumer.stop()

    async def _dispatch(self, partition: int, offset: int, value: bytes | None) -> None:
        if value is None:
            return
        try:
            alert = ALERT.decode(value)
        except ContractError as exc:
            self.metrics.unreadable.inc()
            log.error("alert at %d/%d cannot be read (%s): skipped", partition, offset, exc)
            return
        scope = await self._scope_of(alert.get("budget_id") or "")
        for w in self.webhooks:
            if offset < self.state.starts.get(w.id, {}).get(partition, 0):
                continue
            if not w.wants(alert, scope):
                continue
            key = (w.id, alert["alert_id"])
            if key in self._pending or self.state.is_finished(*key):
                self.metrics.skipped_repeats.labels(w.id).inc()
                continue
            self._pending.add(key)
            self.queues[w.id].put_nowait(Job(alert, scope, offset))
            self.metrics.queued.labels(w.id).set(self.queues[w.id].qsize())

    async def _scope_of(self, budget_id: str) -> str | None:
        """The scope of ``budget_id`` from budget.policies (read again, at most every
        POLICY_REFRESH_SECONDS, when an alert names a budget not seen yet)."""
        if not budget_id:
            return None
        loop = asyncio.get_running_loop()
        if (
            budget_id not in self._scopes
            and loop.time() - self._scopes_read_at > POLICY_REFRESH_SECONDS
        ):
            self._scopes_read_at = loop.time()
            scopes: dict[str, str] = {}
            for key, value in await read_topic(
                self.bootstrap, self.topics.budget_policies, security=self.security
            ):
                if key is None:
                    continue
                if value is None:
                    scopes.pop(key.decode(), None)
                    continue
                try:
                    scopes[key.decode()] = str(BUDGET_POLICY.decode(value)["scope"])
                except ContractError as exc:
                    log.warning("budget policy %r unreadable (%s)", key, exc)
            self._scopes = scopes
        return self._scopes.get(budget_id)

    # --- one webhook ------------------------------------------------------------------------
    async def _serve(self, session: aiohttp.ClientSession, webhook: Webhook) -> None:
        queue = self.queues[webhook.id]
        retried = self.metrics.retried.labels(webhook.id)
        while True:
            job = await queue.get()
            alert_id = job.alert["alert_id"]
            outcome = await deliver(
                session,
                webhook,
                alert_id,
                body(job.alert, job.scope),
                on_retry=lambda _attempt, _error: retried.inc(),
            )
            delivery = Delivery(
                webhook=webhook.id,
                webhook_url=redact_url(webhook.url),
                alert_id=alert_id,
                kind=job.alert["kind"],
                budget_id=job.alert.get("budget_id") or "",
                status=DELIVERED if outcome.delivered else FAILED,
                attempts=outcome.attempts,
                http_status=outcome.http_status,
                error=outcome.error,
                finished_at=datetime.now(UTC),
                alert_offset=job.offset,
            )
            # the record first: once acknowledged, no restart sends this alert here again
            await self._send_record(delivery_key(webhook.id, alert_id), delivery.encode())
            self.state.finished[(webhook.id, alert_id)] = delivery
            self._pending.discard((webhook.id, alert_id))
            (self.metrics.delivered if outcome.delivered else self.metrics.failed).labels(
                webhook.id
            ).inc()
            self.metrics.queued.labels(webhook.id).set(queue.qsize())
            log.info(
                "alert %s -> webhook %s: %s after %d attempt(s)",
                alert_id,
                webhook.shown,
                delivery.status,
                outcome.attempts,
            )
            if self.delivery_log is not None:
                self._unlogged.append(delivery)
                self._log_wakeup.set()

    async def _send_record(self, key: bytes, value: bytes) -> None:
        """Send a record to notify.deliveries until the brokers acknowledge it."""
        assert self._producer is not None
        while True:
            try:
                await self._producer.send_and_wait(self.topics.notify_deliveries, value, key=key)
                return
            except KafkaError as exc:
                log.warning("delivery record not acknowledged (%s): sending again", exc)
                await asyncio.sleep(RECORD_RETRY_SECONDS)

    async def _write_log(self) -> None:
        assert self.delivery_log is not None
        while True:
            if not self._unlogged:
                self._log_wakeup.clear()
                await self._log_wakeup.wait()
            rows, self._unlogged = self._unlogged, []
            try:
                await self.delivery_log(rows)
            except asyncio.CancelledError:  # a stop mid-insert: _flush_log offers them again
                self._unlogged = rows + self._unlogged
                raise
            except Exception as exc:  # the log is a copy: keep the rows, offer them again
                log.warning("delivery log refused %d row(s) (%s): retrying", len(rows), exc)
                self._unlogged = rows + self._unlogged
                await asyncio.sleep(LOG_RETRY_SECONDS)

    async def _flush_log(self) -> None:
        """On a stop, write the rows still waiting once, bounded: a query right after a
        clean stop sees every delivery; rows it cannot write wait for the next start."""
        if self.delivery_log is None or not self._unlogged:
            return
        rows, self._unlogged = self._unlogged, []
        try:
            await asyncio.wait_for(self.delivery_log(rows), FLUSH_TIMEOUT_SECONDS)
        except Exception as exc:  # the records stay the truth: the next start catches up
            log.warning("delivery log: %d row(s) left for the next start (%s)", len(rows), exc)

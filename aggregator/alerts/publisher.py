"""The alert publisher: each alert once on the shared alert topic, from ClickHouse's record.

Why not from the fold: a counter keeps its newest few periods in memory, so a late event
older than those crosses thresholds the fold never sees; a rolling window's sum at each
arrival depends on the arrival order; an unpriced model is noticed once per source
partition; a crash between an alert's send and its counter's changelog repeats it. The
``alerts`` view (``aggregator/sink/ddl/005_budget_history.sql``) has none of these
faults: it is computed from the priced events the sink stored once each, so it lists
each (counter, period, threshold) crossed and each unpriced model exactly once, however
the events arrived; the forecast alerts (``forecast_alerts.py``, once per (counter,
period) whose projection runs out before the period ends) come from the same rows, and
so does each (counter, period)'s ``exhausted`` alert (an enforcer refused a request for
its budget: a refused event names it in ``decision_budget_id``).
This publisher turns them into messages:

- **one writer**: every worker runs one, but only the member of the consumer group
  ``<app id>-alert-publisher`` that holds the shared topic's single partition sends;
- **what was sent** is the topic itself: on taking the partition the publisher reads it
  whole into a set of alert ids, and adds an id once its send is acknowledged, so a
  crash, a restart, a new owner or a replayed generation sends nothing twice;
- **every** ``poll_seconds`` it asks for the alerts of the (counter, period)s and models
  that received events since the previous poll (by ClickHouse's ``inserted_at``, with a
  margin; the first poll after taking the partition asks for all) and sends those not
  sent, keyed by counter key (``unpriced|<model>`` for a model);
- **a bounded number of models** (:data:`MAX_UNPRICED_MODEL_ALERTS`): the model names are
  the clients' own, so past that many unpriced models alerted one by one, every further
  one is folded into the one alert ``unpriced|*`` (model ``*``, sent once) and counted
  (``spendbus_aggregator_unpriced_alerts_folded_total``), never a message per name;
- **a replay generation** sends only once it is current and its predecessor retired, and
  a generation that is no longer current stops (docs/replay.md): the shared topic has one
  writer per stack.

An alert therefore goes out a sink batch plus a poll after its event was folded (about
two seconds at the defaults), carrying the counter's spend and state when it was found.

Cost: the first poll reads everything, later ones what changed; both grow with the
table (the filter on ``inserted_at`` reads that column whole), so a poll that took t
seconds waits ``BUSY_FACTOR`` * t before the next: alerts come later on a large store
rather than the sink starving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from aggregator.alerts.forecasts import forecast_alerts_found
from aggregator.counting.fold import (
    MAX_UNPRICED_MODEL_ALERTS,
    UNPRICED_OVERFLOW,
    exhausted_alert_id,
    threshold_alert_id,
    unpriced_alert,
)
from aggregator.counting.reference import Reference
from aggregator.replay.generations import alert_ids, read_switch
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.codec import ALERT
from schemas.topics import Topics

log = logging.getLogger(__name__)

#: runs one query on the generation's store, returns its rows
Reader = Callable[[str], Awaitable[Sequence[Sequence[Any]]]]
#: how far back (seconds) a poll looks past the previous one: an insert's inserted_at is
#: taken when it starts, so rows committed after the previous poll may carry an earlier one
MARGIN_SECONDS: Final = 120.0
#: a poll that took t seconds is followed by a pause of at least BUSY_FACTOR * t: the
#: queries scan usage_events and hold the store the sink writes with
BUSY_FACTOR: Final = 4.0
#: how often (seconds) the publisher checks that its generation is still the current one
SWITCH_CHECK_SECONDS: Final = 10.0

_THRESHOLDS: Final = """
SELECT counter_key, budget_id, period, thresholds_crossed, state, spent_nanos, spent_tokens,
       spent_requests, limit_nanos, limit_tokens, limit_requests, as_of
FROM budget_history
WHERE length(thresholds_crossed) > 0{recent}
"""
_RECENT_COUNTERS: Final = """
  AND (counter_key, period) IN (
    SELECT c.counter_key, c.period FROM usage_events ARRAY JOIN counts AS c
    WHERE inserted_at >= fromUnixTimestamp64Milli({since_ms}, 'UTC'))"""
#: the (counter, period) of each budget an enforcer refused a request for: its exhausted
#: alert (the fold's ``exhausted_alert``), as of the period's totals now
_EXHAUSTED: Final = """
SELECT counter_key, budget_id, period, state, spent_nanos, spent_tokens, spent_requests,
       limit_nanos, limit_tokens, limit_requests, as_of
FROM budget_history
WHERE (counter_key, period) IN (
    SELECT c.counter_key, c.period FROM usage_events ARRAY JOIN counts AS c
    WHERE outcome = 'refused' AND decision_budget_id = c.budget_id){recent}
"""
_OVERFLOW_ID: Final = f"unpriced|{UNPRICED_OVERFLOW}"
#: the oldest first, and no more than the bound can use (one more tells it was passed)
_UNPRICED: Final = f"""
SELECT model, min(occurred_at) AS first_seen FROM usage_events
WHERE unpriced{{recent}}
GROUP BY model
ORDER BY first_seen, model
LIMIT {MAX_UNPRICED_MODEL_ALERTS + 1}
"""
_RECENT_MODELS: Final = """
  AND model IN (SELECT model FROM usage_events
                WHERE unpriced AND inserted_at >= fromUnixTimestamp64Milli({since_ms}, 'UTC'))"""


def threshold_alert(row: Sequence[Any], threshold: float) -> dict[str, Any]:
    """The Alert of one crossed threshold of a ``budget_history`` row (:data:`_THRESHOLDS`)."""
    key, budget_id, period, _, state, nanos, tokens, requests, ln, lt, lr, as_of = row
    return {
        "alert_id": threshold_alert_id(key, period, threshold),
        "kind": "threshold",
        "counter_key": key,
        "budget_id": budget_id,
        "period": period,
        "threshold": float(threshold),
        "state": state,
        "spent_nanos": int(nanos),
        "spent_tokens": int(tokens),
        "spent_requests": int(requests),
        "limit_nanos": ln,
        "limit_tokens": lt,
        "limit_requests": lr,
        "model": None,
        "as_of": as_of,
        "exhausts_at": None,
    }


def exhausted_alert(row: Sequence[Any]) -> dict[str, Any]:
    """The ``exhausted`` Alert of a (counter, period) of :data:`_EXHAUSTED` (its columns
    are :data:`_THRESHOLDS`' but the thresholds crossed)."""
    key, budget_id, period, *rest = row
    alert = threshold_alert((key, budget_id, period, (), *rest), 1.0)
    alert["alert_id"] = exhausted_alert_id(key, period)
    alert["kind"] = "exhausted"
    return alert


async def alerts_found(
    read: Reader, since_ms: int | None, reference: Reference | None = None
) -> list[tuple[bytes, dict[str, Any]]]:
    """(message key, Alert) of every alert of what changed since ``since_ms`` (None: all);
    with the worker's ``reference`` (budgets and raises), its forecast alerts too."""
    recent = "" if since_ms is None else _RECENT_COUNTERS.format(since_ms=int(since_ms))
    out = [
        (str(row[0]).encode(), threshold_alert(row, t))
        for row in await read(_THRESHOLDS.format(recent=recent))
        for t in row[3]
    ]
    if reference is not None:
        out += await forecast_alerts_found(read, recent, reference.budgets, reference.raises)
    out += [
        (str(row[0]).encode(), exhausted_alert(row))
        for row in await read(_EXHAUSTED.format(recent=recent))
    ]
    recent = "" if since_ms is None else _RECENT_MODELS.format(since_ms=int(since_ms))
    for model, first_seen in await read(_UNPRICED.format(recent=recent)):
        out.append((f"unpriced|{model}".encode(), unpriced_alert(str(model), first_seen)))
    return out


class AlertPublisher:
    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        read: Reader,
        *,
        poll_seconds: float = 1.0,
        security: KafkaSecurity = PLAINTEXT,
        is_current: Callable[[], Awaitable[bool]] | None = None,
        folded: Callable[[int], object] | None = None,
        reference: Reference | None = None,
        ready: asyncio.Event | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.read = read
        self.poll_seconds = poll_seconds
        self.security = security
        #: does this generation write the shared topic now? (None: always, for tests)
        self.is_current = is_current
        #: budgets and raises, for forecast alerts (None: none are sent), and the event set
        #: once they are loaded (no poll before: its forecasts would miss the budgets)
        self.reference = reference
        self.ready = ready
        self.published = 0
        #: alert ids on the shared topic while this publisher holds it (None: not holding)
        self.sent: set[str] | None = None
        self._since_ms: int | None = None
        #: unpriced models alerted one by one on the shared topic (of ``sent``)
        self._unpriced_alerted = 0
        #: told how many unpriced models a poll folded into the overflow alert
        self._folded = folded
        self.unpriced_folded = 0

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=f"{self.topics.aggregator_app_id}-alert-publisher",
            enable_auto_commit=False,
            auto_offset_reset="latest",
            **self.security.client_kwargs(),
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            **self.security.client_kwargs(),
        )
        consumer.subscribe([self.topics.shared_alerts])
        await consumer.start()
        await producer.start()
        current, checked, wait = False, 0.0, self.poll_seconds
        try:
            while True:
                # polling keeps this member in the group (and sees the partition move)
                if await consumer.getmany(timeout_ms=int(wait * 1000)):
                    await self._commit_read(consumer)
                if time.monotonic() - checked >= SWITCH_CHECK_SECONDS:
                    current = self.is_current is None or await self.is_current()
                    checked = time.monotonic()
                if not current or not consumer.assignment():
                    self.sent = None  # read the topic again when it is ours again
                    continue
                if self.ready is not None and not self.ready.is_set():
                    continue
                started = time.monotonic()
                await self.publish_once(producer)
                # the queries share the store with the sink: at most a fifth of its time
                wait = max(self.poll_seconds, (time.monotonic() - started) * BUSY_FACTOR)
        finally:
            await consumer.stop()
            await producer.stop()

    @staticmethod
    async def _commit_read(consumer: AIOKafkaConsumer) -> None:
        """Commit what the membership poll read: the sent alerts are known from reading the
        topic whole, not from this group's offsets, but an uncommitted group shows every
        alert ever sent as lag that never drains (``spendbus status``)."""
        try:
            await consumer.commit()
        except KafkaError as exc:  # a rebalance in between: the next poll commits
            log.debug("alert publisher: commit of its read position skipped: %s", exc)

    async def publish_once(self, producer: AIOKafkaProducer) -> int:
        """One poll: send the alerts found and not sent; returns how many went out."""
        if self.sent is None:
            self.sent = set(
                await alert_ids(self.bootstrap, self.topics.shared_alerts, security=self.security)
            )
            self._since_ms = None
            self._unpriced_alerted = sum(
                1 for i in self.sent if i.startswith("unpriced|") and i != _OVERFLOW_ID
            )
        (started,) = (await self.read("SELECT toUnixTimestamp64Milli(now64(3))"))[0]
        found = await alerts_found(self.read, self._since_ms, self.reference)
        fresh = self._bounded(
            [(key, alert) for key, alert in found if alert["alert_id"] not in self.sent]
        )
        futures = [
            await producer.send(self.topics.shared_alerts, key=key, value=ALERT.encode(alert))
            for key, alert in fresh
        ]
        for future in futures:
            await future
        self.sent.update(alert["alert_id"] for _, alert in fresh)
        self._since_ms = int(started) - int(MARGIN_SECONDS * 1000)
        self.published += len(fresh)
        if fresh:
            log.info("published %d alerts to %s", len(fresh), self.topics.shared_alerts)
        return len(fresh)

    def _bounded(self, fresh: list[tuple[bytes, dict[str, Any]]]) -> list[tuple[bytes, Any]]:
        """``fresh`` with the unpriced models past the bound folded into one alert."""
        assert self.sent is not None
        out: list[tuple[bytes, Any]] = []
        folded: list[dict[str, Any]] = []
        for key, alert in fresh:
            if alert["kind"] != "unpriced_model" or alert["alert_id"] == _OVERFLOW_ID:
                out.append((key, alert))
            elif self._unpriced_alerted < MAX_UNPRICED_MODEL_ALERTS:
                self._unpriced_alerted += 1
                out.append((key, alert))
            else:
                folded.append(alert)
        if folded:
            self.unpriced_folded += len(folded)
            if self._folded is not None:
                self._folded(len(folded))
            if _OVERFLOW_ID not in self.sent:
                first_seen = min(a["as_of"] for a in folded)
                out.append((_OVERFLOW_ID.encode(), unpriced_alert(UNPRICED_OVERFLOW, first_seen)))
        return out


async def generation_is_current(
    bootstrap: str, topics: Topics, *, security: KafkaSecurity = PLAINTEXT
) -> bool:
    """Does ``topics``' generation write the shared alert topic now? The default one until
    a switch names another; a replay generation once it is current and its predecessor
    retired (no other writer left)."""
    switch = await read_switch(bootstrap, topics, security=security)
    if not topics.generation:
        return switch is None or switch.generation == ""
    return switch is not None and switch.generation == topics.generation and switch.previous_retired

"""One batch of usage.raw records in, everything the aggregator must write out.

Pure over its inputs (reference data, the counter and dedupe state handed in
through two small readers), so it is tested without Kafka; the counting stage
(``stage.py``) only moves bytes between topics, its state store and this class.

Per record, in order (``_BatchFold.fold_record``, each stage a method of it):
  1. decode and validate (``decode.py``, schemas.usage), then ``from_the_future``: the
     event time within its bound -> else a dead letter;
  2. ``first_delivery``: dedupe by event_id: an id first seen at another offset is a
     duplicate publish and is skipped (counted); the same offset is a re-delivery and
     goes on, the counter fences below make it harmless;
  3. ``price``: by the version in force at its occurred_at (an unpriced model alerted);
  4. ``plan``: the counters of every applicable budget and their periods
     (``applicable.py``);
  5. ``fold_counters``: add it to each (fold.apply; each counter skips an offset it
     already applied), first-time threshold alerts, the ``exhausted`` alert of the budget
     an enforcer refused the request for (once a period), and note each counter whose newest
     period changed (``verdict_changes``: the caller decides when its Verdict goes out,
     see ``verdicts.VerdictCoalescer``);
  6. ``encode_priced``: the priced event;
then ``finish``: after the batch, each changed counter's forecast alert, once per
period, when its projection falls before the period's end (schemas/forecast.py).
The dedupe entry is written in the same batch as the counters it protects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aggregator.counting.applicable import Applicable, ApplicableCache, EventCounts
from aggregator.counting.batch_output import BatchOutput, BatchStats, VerdictChange
from aggregator.counting.decode import read_usage_event
from aggregator.counting.fold import (
    COUNTED_OUTCOMES,
    MAX_UNPRICED_MODEL_ALERTS,
    UNPRICED_OVERFLOW,
    CounterState,
    alert_record,
    apply,
    exhausted_alert,
    forecast_alert,
    period_of,
    unpriced_alert,
)
from aggregator.counting.priced import CountCache, CountEntry, PricedWriter
from aggregator.counting.reference import Reference
from aggregator.counting.verdict_codec import period_bounds_us
from schemas.budgets import Budget
from schemas.codec import (
    ALERT,
    DEAD_LETTER,
    PRICED_USAGE,
    USAGE_EVENT,
)
from schemas.errors import ContractError
from schemas.ids import CanonicalIds, with_canonical_ids
from schemas.periods import FUTURE_EVENT, MAX_FUTURE_SKEW_SECONDS, from_micros, to_micros
from schemas.pricing import Price
from schemas.raises import BudgetRaise, raised_budget
from schemas.topics import STORE_ROW, WRONG_KEY, usage_raw_key
from schemas.usage import billed_tokens, validate_decoded_usage_event

#: reads one state value as stored for a source partition: (partition, key) -> value or None.
#: Counter readers may return a CounterState (a live object, updated in place) or its JSON.
StateReader = Callable[[int, str], Any]


class SourceRecord(Protocol):
    """What the processor reads of a usage.raw record (RawRecord, aiokafka's ConsumerRecord)."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int | None:
        """Kafka's record timestamp in milliseconds (None or negative: none)."""
        ...


@dataclass(frozen=True, slots=True)
class RawRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None


class BatchProcessor:
    def __init__(
        self,
        reference: Reference,
        *,
        source_topic: str,
        stage: str = "aggregator",
        max_future_skew_seconds: float = MAX_FUTURE_SKEW_SECONDS,
    ) -> None:
        self.reference = reference
        self.source_topic = source_topic
        self.stage = stage
        self.max_future_skew_us = int(max_future_skew_seconds * 1_000_000)
        self._budgets_version = -1
        self._applicable = ApplicableCache()
        self._counts = CountCache()
        self._canonical = CanonicalIds()
        #: (id of a budget of the reference, raise id) -> the budget as raised
        self._raised: dict[tuple[int, str], Budget] = {}
        #: unpriced models this process alerted one by one (the bound is per process: a
        #: restarted worker may alert up to the bound more, each model still once)
        self._unpriced_alerted = 0

    def forget(self) -> None:
        """Partitions moved. Nothing of a partition's state is cached here (readers own it)."""

    def _refresh_budgets(self) -> None:
        if self._budgets_version != self.reference.version:
            budgets = sorted(self.reference.budgets.values(), key=lambda b: b.budget_id)
            self._applicable.reset(budgets)
            self._counts.reset()
            self._raised.clear()
            self._budgets_version = self.reference.version

    def _raised_budget(self, budget: Budget, granted: BudgetRaise) -> Budget:
        cache_key = (id(budget), granted.raise_id)
        found = self._raised.get(cache_key)
        if found is None:
            found = self._raised[cache_key] = raised_budget(budget, granted)
        return found

    def process(
        self,
        records: Sequence[SourceRecord],
        counters: StateReader,
        seen: StateReader,
        now: datetime | None = None,
    ) -> BatchOutput:
        self._refresh_budgets()
        batch = _BatchFold(self, counters, seen, now or datetime.now(UTC))
        for record in records:
            batch.fold_record(record)
        return batch.finish()

    def _future(
        self, record: SourceRecord, occurred_us: int, received_us: int, now: datetime
    ) -> bytes:
        ahead = (occurred_us - received_us) / 1_000_000
        detail = (
            f"occurred_at {from_micros(occurred_us).isoformat()} is {ahead:,.0f} s ahead of "
            f"{from_micros(received_us).isoformat()}, when the record reached Kafka; at most "
            f"{self.max_future_skew_us / 1_000_000:g} s are allowed (max_future_skew_seconds)"
        )
        return self._dead_letter(record, ContractError(detail, reason=FUTURE_EVENT), now)

    def _event_counts(
        self,
        found: Applicable,
        occurred_us: int,
        occurred_at: datetime,
        counted: bool,
        charge: bool = False,
    ) -> EventCounts:
        periods: list[str] = []
        entries: list[CountEntry] = []
        for budget, key, scope_values, width in found:
            period = period_of(budget.window, occurred_us, occurred_at)
            periods.append(period)
            entries.append(
                self._counts.get(
                    budget,
                    key,
                    scope_values,
                    period,
                    occurred_us // width if width else 0,
                    1 if (counted or budget.count_denied) and not charge else 0,
                )
            )
        occurred = from_micros(occurred_us)
        return EventCounts(periods, entries, occurred.year * 100 + occurred.month)

    def _dead_letter(self, record: SourceRecord, exc: ContractError, now: datetime) -> bytes:
        return DEAD_LETTER.encode(
            {
                "reason": exc.reason,
                "detail": exc.detail,
                "stage": self.stage,
                "source_topic": self.source_topic,
                "source_partition": record.partition,
                "source_offset": record.offset,
                "key": record.key,
                "value": record.value,
                "failed_at": now,
            }
        )


class _BatchFold:
    """One batch on its way through the stages, each a method: decode and validate, the
    event-time bound, dedupe, price (and the unpriced alerts), plan (the counters and their
    periods), fold (into each counter), encode (the priced record); then, once per batch,
    the verdicts to send and the forecast alerts. Holds what the stages share while the
    batch lasts; the processor holds what outlives it."""

    def __init__(
        self, processor: BatchProcessor, counters: StateReader, seen: StateReader, now: datetime
    ) -> None:
        self.processor = processor
        self.counters = counters
        self.seen = seen
        self.out = BatchOutput(now=now)
        self.now = now
        self.now_us = to_micros(now)
        self.max_skew_us = processor.max_future_skew_us
        applicable = processor._applicable
        self.applicable = applicable
        self.event_counts = applicable.counts
        self.grain_us = applicable.grain_us
        self.prices = processor.reference.prices
        self.raises = processor.reference.raises
        self.raised = self.raises.by_budget
        self.priced_writer = PricedWriter(now)
        self.canonical = processor._canonical
        # each counter is read once per batch; its state object is updated in place
        self.states: dict[str, CounterState] = {}
        self.seen_in_batch: dict[str, str] = {}
        self.events = 0
        self.charged = 0
        self.duplicates = 0
        self.redelivered = 0
        self.dead_letters = 0
        self.unpriced = 0
        self.cost_nanos = 0

    def fold_record(self, record: SourceRecord) -> None:
        self.events += 1
        try:
            event, occurred_us = read_usage_event(record.value)
            validate_decoded_usage_event(event, occurred_us)
        except ContractError as exc:
            self.dead_letter(record, self.processor._dead_letter(record, exc, self.now))
            return
        if self.from_the_future(record, occurred_us):
            return
        # the usual record's key is its org id as written: one compare, no canonical form
        if record.key != event["org_id"].encode() and not self.keyed_by_its_org(record, event):
            return
        partition = record.partition
        offset = record.offset
        position = f"{partition}:{offset}"
        if not self.first_delivery(partition, event["event_id"], position):
            return
        price = self.price(event, partition, position)
        cost = price.cost_nanos
        self.charged += 1
        self.cost_nanos += cost
        found = self.applicable.lookup(event)
        counts = self.plan(event, found, occurred_us)
        self.fold_counters(event, found, counts, cost, partition, offset, occurred_us)
        self.out.priced.append(self.encode_priced(record, partition, offset, event, price, counts))

    def from_the_future(self, record: SourceRecord, occurred_us: int) -> bool:
        """Event time is trusted up to a bounded skew ahead of when the record reached
        Kafka (the earlier of its timestamp and this worker's clock, so a replay decides as
        the live fold did): an event from the future is dead-lettered, never counted."""
        received_us = self.now_us
        stamp = record.timestamp
        if stamp is not None and 0 <= stamp * 1000 < received_us:
            received_us = stamp * 1000
        if occurred_us > received_us + self.max_skew_us:
            letter = self.processor._future(record, occurred_us, received_us, self.now)
            self.dead_letter(record, letter)
            return True
        return False

    def keyed_by_its_org(self, record: SourceRecord, event: dict[str, Any]) -> bool:
        """The record's key is the event's canonical org id (schemas.topics.usage_raw_key);
        else it is dead-lettered, never counted: its partition holds other orgs' state."""
        org_id = event["org_id"]
        expected = usage_raw_key(org_id)
        if record.key == expected:
            return True
        detail = (
            f"usage.raw key {record.key!r} is not the event's org_id {expected!r} (UTF-8 of "
            "the canonical org id): keyed otherwise, an event lands beside other orgs' "
            "counters and dedupe; `spendbus dlq requeue --reason wrong_key` publishes it "
            "under its key"
        )
        letter = self.processor._dead_letter(
            record, ContractError(detail, reason=WRONG_KEY), self.now
        )
        self.dead_letter(record, letter)
        return False

    def dead_letter(self, record: SourceRecord, letter: bytes) -> None:
        self.out.dead_letters.append((record.key, letter))
        self.dead_letters += 1

    def first_delivery(self, partition: int, event_id: str, position: str) -> bool:
        """False for a duplicate publish (the id first came at another position); a
        re-delivery (same position) goes on, the counters' fences absorb it."""
        first = self.seen_in_batch.get(event_id) or self.seen(partition, event_id)
        if first is not None:
            if first != position:
                self.duplicates += 1
                return False
            self.redelivered += 1
        self.seen_in_batch[event_id] = position
        self.out.seen_writes[(partition, event_id)] = position
        return True

    def mark_seen(self, partition: int, seen_key: str, position: str) -> None:
        self.seen_in_batch[seen_key] = position
        self.out.seen_writes[(partition, seen_key)] = position

    def was_seen(self, partition: int, seen_key: str) -> bool:
        return seen_key in self.seen_in_batch or self.seen(partition, seen_key) is not None

    def price(self, event: dict[str, Any], partition: int, position: str) -> Price:
        price = self.prices.price_event(event)
        if price.unpriced:
            self.unpriced += 1
            self.alert_unpriced(event, partition, position)
        return price

    def alert_unpriced(self, event: dict[str, Any], partition: int, position: str) -> None:
        """One alert per model (per source partition: the marker lives in the partition's
        dedupe state, written in the same batch as the alert), for the first models this
        process alerts; every later one shares the one overflow alert (the names are the
        clients')."""
        model = event["model"]
        out = self.out
        out.unpriced_models.add(model)
        marker = f"\x00unpriced\x00{model}"
        if self.was_seen(partition, marker):
            return
        self.mark_seen(partition, marker, position)
        alerted = model
        processor = self.processor
        if processor._unpriced_alerted < MAX_UNPRICED_MODEL_ALERTS:
            processor._unpriced_alerted += 1
        else:
            out.unpriced_alerts_folded += 1
            alerted = UNPRICED_OVERFLOW
            overflow = f"\x00unpriced\x00{UNPRICED_OVERFLOW}"
            if self.was_seen(partition, overflow):
                return  # the overflow alert went out already
            self.mark_seen(partition, overflow, position)
        out.alerts.append(
            (
                f"unpriced|{alerted}".encode(),
                ALERT.encode(unpriced_alert(alerted, event["occurred_at"])),
            )
        )

    def plan(self, event: dict[str, Any], found: Applicable, occurred_us: int) -> EventCounts:
        """Every counter the event counts in travels with its priced record, so the sink
        stores the exact budget history once per event (infra/clickhouse); the periods and
        those bytes are the same for a whole grain of time."""
        counted = event["outcome"] in COUNTED_OUTCOMES
        # a further charge of another call (UsageEvent v3) is no request of its own
        charge = event.get("charge_of") is not None
        event_counts = self.event_counts
        where = (id(found), occurred_us // self.grain_us, counted, charge)
        counts = event_counts.get(where)
        if counts is None:
            counts = self.processor._event_counts(
                found, occurred_us, event["occurred_at"], counted, charge
            )
            if len(event_counts) >= 100_000:
                event_counts.clear()
            event_counts[where] = counts
        return counts

    def fold_counters(
        self,
        event: dict[str, Any],
        found: Applicable,
        counts: EventCounts,
        cost: int,
        partition: int,
        offset: int,
        occurred_us: int,
    ) -> None:
        """The event into each of its counters, and what that changes: verdicts, alerts."""
        tokens = billed_tokens(event)
        outcome = event["outcome"]
        counted = outcome in COUNTED_OUTCOMES
        charge = event.get("charge_of") is not None
        # the budget an enforcer refused this request for: its counter says so once a period
        refused_by = event.get("decision_budget_id") if outcome == "refused" else None
        periods = counts.periods
        raised = self.raised
        states = self.states
        verdict_changes = self.out.verdict_changes
        n = 0
        for budget, key, scope_values, _ in found:
            period = periods[n]
            n += 1
            if raised and budget.budget_id in raised:
                budget = self.raised_at(budget, scope_values, occurred_us)
            state = states.get(key)
            if state is None:
                state = self.read_counter(partition, key)
            change = apply(
                state,
                budget,
                event,
                cost,
                partition,
                offset,
                occurred_us,
                tokens,
                period,
                counted,
                charge,
            )
            # a fenced (re-delivered) record still re-sends the verdict: the crash
            # that caused the re-delivery may have come before the verdict left
            if change is None:
                if key not in verdict_changes:
                    verdict_changes[key] = VerdictChange(budget, scope_values, state)
                continue
            if change.current:
                held = verdict_changes.get(key)
                if held is None:
                    verdict_changes[key] = VerdictChange(budget, scope_values, state)
                elif held.budget is not budget:
                    # the limits of its last event (a raise may have begun or ended)
                    held.budget = budget
            for threshold in change.new_alerts:
                alert = alert_record(
                    budget, key, change.period, threshold, state.periods[change.period]
                )
                self.out.alerts.append((key.encode(), ALERT.encode(alert)))
            if refused_by is not None and refused_by == budget.budget_id:
                totals = state.periods.get(change.period)
                exhausted = (
                    None if totals is None else exhausted_alert(budget, key, change.period, totals)
                )
                if exhausted is not None:
                    self.out.alerts.append((key.encode(), ALERT.encode(exhausted)))

    def raised_at(self, budget: Budget, scope_values: tuple[str, ...], occurred_us: int) -> Budget:
        """The budget with the raise in force at the event's time, if any: its state labels
        and alerts measure the raised limits (by event time: a replay decides alike)."""
        granted = self.raises.active(budget.budget_id, scope_values, occurred_us)
        if granted is None:
            return budget
        return self.processor._raised_budget(budget, granted)

    def read_counter(self, partition: int, key: str) -> CounterState:
        """The counter's live state, read from the caller's store (once per batch: the
        fold then updates it in place)."""
        raw = self.counters(partition, key)
        if raw is None:
            state = CounterState()
        elif isinstance(raw, CounterState):
            state = raw
        else:
            state = CounterState.from_json(raw)
        self.states[key] = state
        self.out.counter_states[(partition, key)] = state
        return state

    def encode_priced(
        self,
        record: SourceRecord,
        partition: int,
        offset: int,
        event: dict[str, Any],
        price: Price,
        counts: EventCounts,
    ) -> tuple[int, bytes, bytes, bytes]:
        """The usage.priced record: (source partition, key, body, store-row header)."""
        # usage.priced carries the ids as counted (canonical), so the sink stores every
        # body as it is; the rare event with other ids is encoded again
        raw_value: Any = record.value
        if not self.canonical.event_is_canonical(event):
            event = with_canonical_ids(event)
            raw_value = USAGE_EVENT.encode(event)
        # the event's own bytes are reused when it was written with the current schema
        priced = self.priced_writer.write(
            raw_value,
            price.cost_nanos,
            price.price_version,
            price.matched,
            price.unpriced,
            partition,
            offset,
            counts.entries,
            counts.data,
        )
        if priced is None:
            priced = PRICED_USAGE.encode(
                {
                    "event": event,
                    "cost_nanos": price.cost_nanos,
                    "price_version": price.price_version,
                    "price_match": price.matched,
                    "unpriced": price.unpriced,
                    "source_partition": partition,
                    "source_offset": offset,
                    "priced_at": self.now,
                    "counts": [c.record for c in counts.entries],
                }
            )
        store_row = STORE_ROW.pack(partition, offset, counts.month)
        return (partition, event["org_id"].encode(), priced, store_row)

    def finish(self) -> BatchOutput:
        out = self.out
        out.stats = BatchStats(
            self.events,
            self.charged,
            self.duplicates,
            self.redelivered,
            self.dead_letters,
            self.unpriced,
            self.cost_nanos,
        )
        verdict_changes = out.verdict_changes
        # a counter without a current period never had an event applied: nothing to say
        for key in [k for k, c in verdict_changes.items() if not c.state.period]:
            del verdict_changes[key]
        self.forecast_alerts()
        return out

    def forecast_alerts(self) -> None:
        """A forecast alert once per (counter, period), from the batch's last state (marked
        in the counter, written with it); with a store the publisher's come from ClickHouse."""
        for key, held in self.out.verdict_changes.items():
            counter = held.state
            window = held.budget.window
            if window.kind == "total" or window.kind == "rolling":
                continue  # never ends: no forecast alert
            at_us = counter.periods[counter.period].as_of_us
            bounds = period_bounds_us(window, counter.period, at_us)
            forecast = forecast_alert(held.budget, key, counter, bounds)
            if forecast is not None:
                self.out.alerts.append((key.encode(), ALERT.encode(forecast)))

"""One batch of usage.raw records in, everything the aggregator must write out.

Pure over its inputs (reference data, the counter and dedupe state handed in
through two small mappings), so it is tested without Faust; the Faust agent
(``agents.py``) only moves bytes between topics, tables and this class.

Per record, in order:
  1. decode and validate (schemas.codec, schemas.usage) -> else a dead letter;
  2. dedupe by event_id: an id first seen at another offset is a duplicate
     publish and is skipped (counted); the same offset is a re-delivery and
     goes on, the counter fences below make it harmless;
  3. price it by the version in force at its occurred_at;
  4. add it to every counter of every applicable budget (fold.apply; each
     counter skips an offset it already applied);
  5. emit the priced event, the verdict of each counter whose newest period
     changed (once per batch: coalesced), and first-time threshold alerts.
The dedupe entry is written in the same batch as the counters it protects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aggregator.fold import CounterState, alert_record, apply, unpriced_alert, verdict_record
from aggregator.reference import Reference
from schemas.budgets import Budget, applicable
from schemas.codec import (
    ALERT,
    DEAD_LETTER,
    PRICED_USAGE,
    USAGE_EVENT,
    VERDICT,
    priced_usage_from_raw,
)
from schemas.errors import ContractError
from schemas.usage import validate_usage_event

#: reads one table value as stored for a source partition: (partition, key) -> value or None.
#: Faust keeps a table's values per partition, so a read must name the partition.
StateReader = Callable[[int, str], Any]


@dataclass(frozen=True, slots=True)
class RawRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class BatchStats:
    events: int = 0
    charged: int = 0
    duplicates: int = 0
    redelivered: int = 0
    dead_letters: int = 0
    unpriced: int = 0
    cost_nanos: int = 0


@dataclass
class BatchOutput:
    #: (partition, key, value) for usage.priced: the partition is the source partition, so
    #: one sink owner reads every priced record of one usage.raw partition in offset order
    priced: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    #: counter key -> Verdict bytes (last state of the batch only)
    verdicts: dict[str, bytes] = field(default_factory=dict)
    alerts: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_letters: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    #: (source partition, table key) -> new value, for the counters and dedupe tables
    counter_writes: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    seen_writes: dict[tuple[int, str], str] = field(default_factory=dict)
    #: models seen without a price (alerted once each by the caller)
    unpriced_models: set[str] = field(default_factory=set)
    stats: BatchStats = field(default_factory=BatchStats)


class BatchProcessor:
    def __init__(
        self,
        reference: Reference,
        *,
        source_topic: str,
        stage: str = "aggregator",
        cache_limit: int = 200_000,
    ) -> None:
        self.reference = reference
        self.source_topic = source_topic
        self.stage = stage
        self._budgets_version = -1
        self._budgets: list[Budget] = []
        # Counter states this worker wrote, as objects: it is the only writer of its
        # partitions, so they equal the table; reading and decoding the table again per
        # batch cost more than the fold. Cleared whenever partitions move (forget()).
        self._states: dict[str, CounterState] = {}
        self.cache_limit = cache_limit

    def forget(self) -> None:
        """Partitions moved: what another worker may have written must be read again."""
        self._states.clear()

    def _current_budgets(self) -> list[Budget]:
        if self._budgets_version != self.reference.version:
            self._budgets = sorted(self.reference.budgets.values(), key=lambda b: b.budget_id)
            self._budgets_version = self.reference.version
        return self._budgets

    def process(
        self,
        records: list[RawRecord],
        counters: StateReader,
        seen: StateReader,
        now: datetime | None = None,
    ) -> BatchOutput:
        now = now or datetime.now(UTC)
        out = BatchOutput()
        budgets = self._current_budgets()
        # counter states loaded once per batch, written back once per batch
        states: dict[str, tuple[int, CounterState]] = {}
        seen_in_batch: dict[str, str] = {}
        dirty_verdicts: dict[str, tuple[Budget, tuple[str, ...]]] = {}
        for record in records:
            out.stats.events += 1
            try:
                event = USAGE_EVENT.decode(record.value)  # type: ignore[arg-type]
                validate_usage_event(event)
            except ContractError as exc:
                out.dead_letters.append((record.key, self._dead_letter(record, exc, now)))
                out.stats.dead_letters += 1
                continue
            position = f"{record.partition}:{record.offset}"
            seen_key = event["event_id"]
            first = seen_in_batch.get(seen_key) or seen(record.partition, seen_key)
            if first is not None and first != position:
                out.stats.duplicates += 1
                continue
            if first == position:
                out.stats.redelivered += 1
            seen_in_batch[seen_key] = position
            out.seen_writes[(record.partition, seen_key)] = position

            price = self.reference.prices.price_event(event)
            if price.unpriced:
                out.stats.unpriced += 1
                model = event["model"]
                out.unpriced_models.add(model)
                # one alert per model (per source partition: the marker lives in the
                # partition's dedupe table, written in the same batch as the alert)
                marker = f"\x00unpriced\x00{model}"
                if marker not in seen_in_batch and seen(record.partition, marker) is None:
                    seen_in_batch[marker] = position
                    out.seen_writes[(record.partition, marker)] = position
                    out.alerts.append(
                        (f"unpriced|{model}".encode(), ALERT.encode(unpriced_alert(model, event)))
                    )
            out.stats.charged += 1
            out.stats.cost_nanos += price.cost_nanos
            for budget, key, scope_values in applicable(budgets, event):
                loaded = states.get(key)
                if loaded is None:
                    cached = self._states.get(key)
                    if cached is None:
                        raw = counters(record.partition, key)
                        cached = CounterState() if raw is None else CounterState.from_json(raw)
                        if len(self._states) >= self.cache_limit:
                            self._states.clear()
                        self._states[key] = cached
                    loaded = (record.partition, cached)
                    states[key] = loaded
                state = loaded[1]
                change = apply(
                    state, budget, event, price.cost_nanos, record.partition, record.offset
                )
                # a fenced (re-delivered) record still re-sends the verdict: the crash
                # that caused the re-delivery may have come before the verdict left
                if change is None or change.current:
                    dirty_verdicts[key] = (budget, scope_values)
                if change is not None:
                    for threshold in change.new_alerts:
                        alert = alert_record(
                            budget, key, change.period, threshold, state.periods[change.period]
                        )
                        out.alerts.append((key.encode(), ALERT.encode(alert)))
                states[key] = (record.partition, state)
            tail = {
                "cost_nanos": price.cost_nanos,
                "price_version": price.price_version,
                "price_match": price.matched,
                "unpriced": price.unpriced,
                "source_partition": record.partition,
                "source_offset": record.offset,
                "priced_at": now,
            }
            # the event's own bytes are reused when it was written with the current schema
            priced = priced_usage_from_raw(record.value, tail)  # type: ignore[arg-type]
            if priced is None:
                priced = PRICED_USAGE.encode({"event": event, **tail})
            out.priced.append((record.partition, event["org_id"].encode(), priced))
        for key, (partition, state) in states.items():
            out.counter_writes[(partition, key)] = state.to_json()
        for key, (budget, scope_values) in dirty_verdicts.items():
            state = states[key][1]
            if state.period:
                out.verdicts[key] = VERDICT.encode(
                    verdict_record(budget, key, scope_values, state, now)
                )
        return out

    def _dead_letter(self, record: RawRecord, exc: ContractError, now: datetime) -> bytes:
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

"""What the fold of one batch gives back (``BatchProcessor.process``): the records to
write, the counters' new states, the dedupe entries, the verdicts to consider and the
batch's figures. The stage, the replays and the metrics read these without the fold."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aggregator.counting.fold import CounterState
from aggregator.counting.verdict_codec import encode_verdict
from schemas.budgets import Budget
from schemas.periods import to_micros


@dataclass
class BatchStats:
    events: int = 0
    charged: int = 0
    duplicates: int = 0
    redelivered: int = 0
    dead_letters: int = 0
    unpriced: int = 0
    cost_nanos: int = 0


@dataclass(slots=True)  # not frozen: compiled, each frozen field is set the slow, generic way
class VerdictChange:
    """A counter whose newest period changed in this batch (or was re-delivered)."""

    budget: Budget
    scope_values: tuple[str, ...]
    state: CounterState

    def encode(self, key: str, now: datetime) -> bytes:
        return self.encode_at(key, to_micros(now))

    def encode_at(self, key: str, emitted_at_us: int) -> bytes:
        """The Verdict, ``emitted_at`` given in microseconds since the epoch."""
        return encode_verdict(self.budget, key, self.scope_values, self.state, emitted_at_us)


@dataclass
class BatchOutput:
    #: (partition, key, value, store-row header) for usage.priced: the partition is the
    #: source partition, so one sink owner reads every priced record of one usage.raw
    #: partition in offset order; the header (schemas.topics.STORE_ROW_HEADER) lets the sink
    #: fence and insert the body (its ids canonical) without decoding it
    priced: list[tuple[int, bytes, bytes, bytes]] = field(default_factory=list)
    #: counter key -> what its Verdict is made of (last state of the batch only)
    verdict_changes: dict[str, VerdictChange] = field(default_factory=dict)
    alerts: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead_letters: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    #: (source partition, counter key) -> the counter's state after the batch
    counter_states: dict[tuple[int, str], CounterState] = field(default_factory=dict)
    #: (source partition, event id or marker) -> position that first carried it
    seen_writes: dict[tuple[int, str], str] = field(default_factory=dict)
    #: models seen without a price (alerted once each by the caller)
    unpriced_models: set[str] = field(default_factory=set)
    #: models first seen past MAX_UNPRICED_MODEL_ALERTS: in the overflow alert, not their own
    unpriced_alerts_folded: int = 0
    stats: BatchStats = field(default_factory=BatchStats)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def counter_writes(self) -> dict[tuple[int, str], dict[str, Any]]:
        """The counters' new values as stored (JSON), for stores that keep JSON."""
        return {where: state.to_json() for where, state in self.counter_states.items()}

    @property
    def verdicts(self) -> dict[str, bytes]:
        """Every changed counter's Verdict, encoded now (callers that do not coalesce)."""
        return {key: c.encode(key, self.now) for key, c in self.verdict_changes.items()}

"""The aggregator's counters, exposed as Prometheus text on /metrics and JSON on /stats."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.http_log import expose_malformed_requests

#: the loop probe's sleep: 100 wake-ups a second, each cheap
LOOP_PROBE_SECONDS = 0.01
#: the most unpriced model names /stats lists: the names are the clients' (a new one per
#: request would grow the set without end); the rest are counted, not kept (issue 21)
MAX_UNPRICED_MODELS_LISTED = 100


class BatchFigures(Protocol):
    """What a folded batch reports (the counting shelf's ``BatchStats``): metrics stand
    below the shelves, so they name the figures, not the class."""

    events: int
    charged: int
    duplicates: int
    dead_letters: int
    unpriced: int
    cost_nanos: int


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    unpriced_models: set[str] = field(default_factory=set)
    totals: dict[str, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)

    _recent_ages: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    #: how long each recent checkpoint took (ms), from its cut to its local-store write
    _recent_checkpoints: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    #: checkpoints completed since the start (a fault test kills a broker right after one)
    checkpoints: int = 0
    #: how long the fold loop waited on each recent checkpoint (ms): the stall events see
    _recent_stalls: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    #: verdict record batches: first verdict added -> broker acknowledgement (ms)
    _recent_verdict_sends: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    #: the oldest generation's garbage collections (ms): they stop the loop whole
    _recent_full_gcs: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    _gc_started: float = 0.0
    #: how late the loop woke a timer (ms): the time anything waiting on the loop lost
    _recent_loop_lags: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    #: the sink stage's recent batches: records in each, and ms to store it (insert + commit)
    _recent_sink_batch_rows: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    _recent_sink_batch_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    sink_batches: int = 0

    def __post_init__(self) -> None:
        r = self.registry
        expose_malformed_requests(r)  # the worker pages' refused heads (runtime/http_log.py)
        self.events = Counter("spendbus_aggregator_events", "usage.raw records read", registry=r)
        self.charged = Counter(
            "spendbus_aggregator_charged_events", "events priced and counted", registry=r
        )
        self.duplicates = Counter(
            "spendbus_aggregator_duplicate_events", "event ids published twice, skipped", registry=r
        )
        self.dead_letters = Counter(
            "spendbus_aggregator_dead_letters", "records sent to usage.dlq", registry=r
        )
        self.unpriced = Counter(
            "spendbus_aggregator_unpriced_events", "events of unpriced models", registry=r
        )
        self.verdicts = Counter("spendbus_aggregator_verdicts", "verdicts sent", registry=r)
        self.cost = Counter("spendbus_aggregator_cost_nanos", "nano-dollars charged", registry=r)
        self.pruned = Counter(
            "spendbus_aggregator_pruned_counters",
            "counters pruned: of a removed budget, or a session idle past its time",
            ["reason"],
            registry=r,
        )
        self.unpriced_alerts_folded = Counter(
            "spendbus_aggregator_unpriced_alerts_folded",
            "unpriced models past the alerts' bound (a poll's, or the fold's without a store), alerted only as unpriced|*",
            registry=r,
        )
        self.unpriced_models_unlisted = Counter(
            "spendbus_aggregator_unpriced_models_unlisted",
            f"batches' distinct unpriced model names past the {MAX_UNPRICED_MODELS_LISTED} "
            "/stats lists (counted, not kept)",
            registry=r,
        )
        self.batch_seconds = Histogram(
            "spendbus_aggregator_batch_seconds", "time to fold one batch", registry=r
        )
        self.loop_lag = Histogram(
            "spendbus_aggregator_loop_lag_seconds",
            "how late the worker's event loop woke a timer (time the loop was held)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.record_age = Histogram(
            "spendbus_aggregator_record_age_seconds",
            "age of a batch's oldest usage.raw record (its Kafka timestamp) when folded",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.sink_rows = Counter("spendbus_sink_rows", "rows inserted into ClickHouse", registry=r)
        self.sink_skipped = Counter(
            "spendbus_sink_skipped_rows", "re-delivered rows already in ClickHouse", registry=r
        )
        self.sink_failures = Counter(
            "spendbus_sink_failures", "failed ClickHouse inserts (retried)", registry=r
        )
        #: consumer group -> a reader of its lag (topic -> records not yet consumed)
        self.lag_readers: dict[str, Callable[[], Mapping[str, int]]] = {}
        r.register(_ConsumerLag(self.lag_readers))

    def watch_lag(self, group: str, read: Callable[[], Mapping[str, int]]) -> None:
        """Expose ``read()`` as spendbus_aggregator_consumer_lag{group, topic}, read at scrape
        time (a stage that owns a consumer knows its positions and the high watermarks)."""
        self.lag_readers[group] = read

    def record_batch(self, stats: BatchFigures, verdicts: int, seconds: float) -> None:
        self.events.inc(stats.events)
        self.charged.inc(stats.charged)
        self.duplicates.inc(stats.duplicates)
        self.dead_letters.inc(stats.dead_letters)
        self.unpriced.inc(stats.unpriced)
        self.verdicts.inc(verdicts)
        self.cost.inc(stats.cost_nanos)
        self.batch_seconds.observe(seconds)
        for name in (
            "events",
            "charged",
            "duplicates",
            "redelivered",
            "dead_letters",
            "unpriced",
            "cost_nanos",
        ):
            self.totals[name] = self.totals.get(name, 0) + getattr(stats, name)
        self.totals["verdicts"] = self.totals.get("verdicts", 0) + verdicts

    def record_unpriced_models(self, models: set[str]) -> None:
        """A batch's unpriced model names: listed on /stats up to the bound, else counted."""
        listed = self.unpriced_models
        unlisted = 0
        for model in models:
            if model in listed:
                continue
            if len(listed) < MAX_UNPRICED_MODELS_LISTED:
                listed.add(model)
            else:
                unlisted += 1
        if unlisted:
            self.unpriced_models_unlisted.inc(unlisted)
            self.totals["unpriced_models_unlisted"] = (
                self.totals.get("unpriced_models_unlisted", 0) + unlisted
            )

    def record_pruned(self, removed_budget: int, idle_session: int) -> None:
        """Counters one partition's sweep pruned, by reason (also in /stats' totals)."""
        for reason, count in (("removed_budget", removed_budget), ("idle_session", idle_session)):
            if count:
                self.pruned.labels(reason).inc(count)
                name = f"pruned_{reason}"
                self.totals[name] = self.totals.get(name, 0) + count

    def record_verdicts(self, verdicts: int) -> None:
        """Verdicts sent apart from a batch (held by the coalescer until due)."""
        self.verdicts.inc(verdicts)
        self.totals["verdicts"] = self.totals.get("verdicts", 0) + verdicts

    def record_age_ms(self, age_ms: float) -> None:
        """How old a batch's oldest record was when folded (queueing before the fold)."""
        self.record_age.observe(age_ms / 1000)
        self._recent_ages.append(age_ms)

    def record_checkpoint(self, total_ms: float) -> None:
        """One checkpoint: from its cut to its local-store write."""
        self._recent_checkpoints.append(total_ms)
        self.checkpoints += 1

    def record_checkpoint_stall(self, ms: float) -> None:
        """How long the fold loop waited on a checkpoint (its cut, or all of it when waited)."""
        self._recent_stalls.append(ms)

    def record_sink_batch(self, records: int, ms: float) -> None:
        """One sink batch stored and committed: its records and how long that took."""
        self.sink_batches += 1
        self._recent_sink_batch_rows.append(records)
        self._recent_sink_batch_ms.append(ms)

    def sink_figures(self, seen_batches: int) -> dict[str, Any]:
        """The sink's counters and the batches after the first ``seen_batches`` (at most
        the recent ones kept): what a sink process reports to its worker."""
        new = min(max(0, self.sink_batches - seen_batches), len(self._recent_sink_batch_ms))
        recent = list(zip(self._recent_sink_batch_rows, self._recent_sink_batch_ms, strict=True))
        return {
            "rows": int(self.sink_rows._value.get()),
            "skipped": int(self.sink_skipped._value.get()),
            "failures": int(self.sink_failures._value.get()),
            "batches": self.sink_batches,
            "recent": recent[len(recent) - new :],
        }

    def absorb_sink_figures(self, now: dict[str, Any], before: dict[str, Any] | None) -> None:
        """Add what a sink process's figures ``now`` hold beyond ``before``, its previous
        report (None for a process's first: a restarted one counts from zero)."""
        base = before or {"rows": 0, "skipped": 0, "failures": 0}
        self.sink_rows.inc(max(0, now["rows"] - base["rows"]))
        self.sink_skipped.inc(max(0, now["skipped"] - base["skipped"]))
        self.sink_failures.inc(max(0, now["failures"] - base["failures"]))
        for records, ms in now["recent"]:
            self.record_sink_batch(records, ms)

    def record_verdict_send_ms(self, ms: float) -> None:
        """One verdict record batch: its first verdict added -> the broker acknowledged it."""
        self._recent_verdict_sends.append(ms)

    def watch_gc(self) -> None:
        """Time every collection of the oldest generation (``gc.callbacks``)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._recent_full_gcs.append((time.perf_counter() - self._gc_started) * 1000)

    def record_phases(self, **seconds: float) -> None:
        """Where a batch's time goes (fold, table writes, sends): cumulative, for /stats."""
        for phase, value in seconds.items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + value

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.totals,
            "phase_seconds": {k: round(v, 3) for k, v in self.phase_seconds.items()},
            "sink_rows": int(self.sink_rows._value.get()),
            "sink_skipped": int(self.sink_skipped._value.get()),
            "sink_failures": int(self.sink_failures._value.get()),
            "sink_batches": self.sink_batches,
            "sink_batch_records": _percentiles(self._recent_sink_batch_rows),
            "sink_batch_ms": _percentiles(self._recent_sink_batch_ms),
            "unpriced_models": sorted(self.unpriced_models),
            "record_age_ms": _percentiles(self._recent_ages),
            "checkpoints": self.checkpoints,
            "checkpoint_ms": _percentiles(self._recent_checkpoints),
            "checkpoint_stall_ms": _percentiles(self._recent_stalls),
            "verdict_send_ms": _percentiles(self._recent_verdict_sends),
            "full_gc_ms": _percentiles(self._recent_full_gcs),
            "full_gcs": len(self._recent_full_gcs),
            "loop_lag_ms": _percentiles(self._recent_loop_lags),
        }

    async def watch_loop(self, interval: float = LOOP_PROBE_SECONDS) -> None:
        """Sleep ``interval`` over and over and record how late each wake-up came: a fold,
        a store write or a collection holding the loop shows here (until cancelled)."""
        clock = time.monotonic
        while True:
            asked = clock()
            await asyncio.sleep(interval)
            late = clock() - asked - interval
            self.loop_lag.observe(late)
            self._recent_loop_lags.append(late * 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ConsumerLag(Collector):
    def __init__(self, readers: dict[str, Callable[[], Mapping[str, int]]]) -> None:
        self.readers = readers

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "spendbus_aggregator_consumer_lag",
            "records of a source topic not yet consumed by this worker's group",
            labels=["group", "topic"],
        )
        for group, read in sorted(self.readers.items()):
            for topic, records in sorted(read().items()):
                lag.add_metric([group, topic], records)
        yield lag


def _percentiles(values: deque[float]) -> dict[str, float] | None:
    """p50/p99/max of the recent batches (None before the first)."""
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": round(at(0.5), 1), "p99": round(at(0.99), 1), "max": round(ordered[-1], 1)}

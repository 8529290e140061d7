"""Recompute every counter from the ledger and compare with what the pipeline shows.

The fold is deterministic (windows and prices by event time), so reading
usage.raw from the start through the same :class:`BatchProcessor` must give
the counters that the live verdicts show. ``verify`` does that in memory,
without touching the running generation, and lists every difference: the
check an SRE runs after an incident, and the first half of a replay.

Two comparisons, each counted in the report:

- **every counter's newest period** with its live verdict (``verdicts_compared``);
- **every (counter, period) the ledger has**, from the counts of the priced records
  the recomputation writes (rolling windows: their newest 48 buckets), with ClickHouse's
  ``budget_history`` when a query function is given (``periods_compared``).

A rolling window's buckets are compared too (Verdict v3: the readers drop them by their
own clocks, so they must be the right ones): the verdict's with the recomputed counter's,
and the priced records' newest 48 with ClickHouse's ``budget_counts`` summed per bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggregator.counting.batch_output import BatchStats
from aggregator.counting.fold import CounterState
from aggregator.counting.process import BatchProcessor, RawRecord
from aggregator.counting.pruning import find_prunable
from aggregator.counting.reference import Reference, ReferenceFollower
from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.topic_reader import TopicReader
from schemas.budgets import SESSION_IDLE_SECONDS
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.errors import ContractError
from schemas.periods import ROLLING_BUCKETS, to_micros
from schemas.records import Verdict
from schemas.rolling import BUCKET_FIELDS, rolling_window_of, verdict_buckets
from schemas.topics import Topics

#: called with (records read so far, records to read)
Progress = Callable[[int, int], None]


#: runs one SQL query on the generation's ClickHouse store, returns its rows
HistoryQuery = Callable[[str], Sequence[Sequence[Any]]]
HISTORY_QUERY: Final = (
    "SELECT counter_key, period, spent_nanos, spent_tokens, spent_requests, events "
    "FROM budget_history"
)
#: every rolling window's spend per bucket, as the store holds it
ROLLING_BUCKETS_QUERY: Final = (
    "SELECT counter_key, period, bucket, sum(cost_nanos), sum(billed_tokens), sum(requests) "
    "FROM budget_counts WHERE startsWith(period, 'r:') GROUP BY counter_key, period, bucket"
)


@dataclass(frozen=True)
class Difference:
    counter_key: str
    field: str
    recomputed: Any
    live: Any
    #: the period compared ('' for a comparison with the live verdict)
    period: str = ""


@dataclass
class VerifyReport:
    records: int = 0
    counters: int = 0
    stats: BatchStats = field(default_factory=BatchStats)
    differences: list[Difference] = field(default_factory=list)
    #: counters whose newest period was compared with their live verdict
    verdicts_compared: int = 0
    #: (counter, period) pairs compared with ClickHouse's budget_history (None: not asked)
    periods_compared: int | None = None
    #: (counter key, period) -> (nanos, tokens, requests, events), from the priced counts
    history: dict[tuple[str, str], tuple[int, int, int, int]] = field(default_factory=dict)
    #: (counter key, rolling period) -> its newest 48 buckets with spend: bucket ->
    #: (nanos, tokens, requests), from the priced counts
    rolling: dict[tuple[str, str], dict[int, tuple[int, int, int]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.differences


async def _read_to_end(
    bootstrap: str,
    topic_list: list[str],
    batch: Callable[[list[Any]], None],
    progress: Progress | None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Read ``topic_list`` from the beginning to the end offsets seen at start, in batches."""
    read = 0
    async with TopicReader(bootstrap, *topic_list, security=security, max_records=5000) as reader:
        total = sum(reader.ends.values())
        async for _, messages in reader:
            batch(messages)
            read += len(messages)
            if progress is not None:
                progress(read, total)
    return read


async def recompute(
    bootstrap: str,
    topics: Topics,
    progress: Progress | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> tuple[dict[str, CounterState], VerifyReport, Reference]:
    """Fold all of usage.raw in memory: the counters as a fresh generation would hold them."""
    reference = Reference()
    follower = ReferenceFollower(bootstrap, topics, reference, security=security)
    await follower.start()
    try:
        await follower.wait_ready(60)
    finally:
        await follower.stop()
    processor = BatchProcessor(reference, source_topic=topics.usage_raw, stage="verify")
    counters: dict[str, Any] = {}
    seen: dict[str, Any] = {}
    report = VerifyReport()
    #: (counter key, period) -> bucket -> [nanos, tokens, requests, events]
    buckets: dict[tuple[str, str], dict[int, list[int]]] = {}

    def fold(messages: list[Any]) -> None:
        records = [RawRecord(m.partition, m.offset, m.key, m.value, m.timestamp) for m in messages]
        out = processor.process(
            records, lambda _, key: counters.get(key), lambda _, key: seen.get(key)
        )
        for (_, counter), state in out.counter_writes.items():
            counters[counter] = state
        for (_, event_id), position in out.seen_writes.items():
            seen[event_id] = position
        for name in ("events", "charged", "duplicates", "dead_letters", "unpriced", "cost_nanos"):
            setattr(report.stats, name, getattr(report.stats, name) + getattr(out.stats, name))
        # read once from the start: each event is priced once (a duplicate publish never)
        for _, _, value, _ in out.priced:
            priced = PRICED_USAGE.decode(value)
            event = priced["event"]
            tokens = (
                event["input_tokens"]
                + event["cache_read_tokens"]
                + event["cache_write_tokens"]
                + event["output_tokens"]
            )
            for count in priced["counts"]:
                slot = buckets.setdefault((count["counter_key"], count["period"]), {})
                sums = slot.setdefault(count["bucket"], [0, 0, 0, 0])
                sums[0] += priced["cost_nanos"]
                sums[1] += tokens
                sums[2] += count["requests"]
                sums[3] += 1

    report.records = await _read_to_end(
        bootstrap, [topics.usage_raw], fold, progress, security=security
    )
    states = {key: CounterState.from_json(value) for key, value in counters.items()}
    report.counters = len(states)
    report.history = {where: _period_totals(slot) for where, slot in buckets.items()}
    report.rolling = {
        where: _live_buckets(slot) for where, slot in buckets.items() if where[1].startswith("r:")
    }
    return states, report, reference


def _live_buckets(slot: Mapping[int, Sequence[int]]) -> dict[int, tuple[int, int, int]]:
    """A rolling window's newest 48 buckets that hold spend: (nanos, tokens, requests)."""
    newest = max(slot)
    return {
        bucket: (sums[0], sums[1], sums[2])
        for bucket, sums in slot.items()
        if bucket > newest - ROLLING_BUCKETS and (sums[0] or sums[1] or sums[2])
    }


def _period_totals(slot: dict[int, list[int]]) -> tuple[int, int, int, int]:
    """A period's totals from its buckets: all of them for a calendar period (one bucket),
    the newest 48 for a rolling window (what the counter holds); events: all."""
    newest = max(slot)
    live = [sums for bucket, sums in slot.items() if bucket > newest - ROLLING_BUCKETS]
    return (
        sum(s[0] for s in live),
        sum(s[1] for s in live),
        sum(s[2] for s in live),
        sum(s[3] for s in slot.values()),
    )


async def verify_counters(
    bootstrap: str,
    topics: Topics,
    progress: Progress | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
    history_query: HistoryQuery | None = None,
    session_idle_seconds: float = SESSION_IDLE_SECONDS,
) -> VerifyReport:
    """Recompute, then compare each counter's newest period with its live verdict and,
    given ``history_query``, every (counter, period) with ClickHouse's budget_history.
    A session counter idle past ``session_idle_seconds`` may have no verdict: the
    counting stage prunes it (aggregator/counting/pruning.py)."""
    states, report, reference = await recompute(bootstrap, topics, progress, security=security)
    idle = set(
        find_prunable(
            states,
            reference.budgets,
            to_micros(datetime.now(UTC)),
            int(session_idle_seconds * 1_000_000),
        ).idle_session
    )
    live: dict[str, Verdict] = {}

    def keep(messages: list[Any]) -> None:
        for m in messages:
            if m.key is None:
                continue
            if m.value is None:
                live.pop(m.key.decode(), None)
                continue
            try:
                live[m.key.decode()] = VERDICT.decode(m.value)
            except ContractError:
                continue

    await _read_to_end(bootstrap, [topics.budget_verdicts], keep, None, security=security)
    for key, state in sorted(states.items()):
        verdict = live.get(key)
        if verdict is None and key in idle:
            continue  # pruned, or about to be
        if verdict is None:
            report.differences.append(Difference(key, "verdict", "present", "missing"))
            continue
        totals = state.periods[state.period]
        report.verdicts_compared += 1
        for name, mine, theirs in (
            ("period", state.period, verdict["period"]),
            ("spent_nanos", totals.nanos, verdict["spent_nanos"]),
            ("spent_tokens", totals.tokens, verdict["spent_tokens"]),
            ("spent_requests", totals.requests, verdict["spent_requests"]),
        ):
            if mine != theirs:
                report.differences.append(Difference(key, name, mine, theirs))
        window = rolling_window_of(state.period)
        if window is not None:
            mine_buckets = verdict_buckets(window, totals.buckets, totals.as_of_us)
            theirs_buckets = tuple(list(verdict[name]) for name in BUCKET_FIELDS)
            if mine_buckets != theirs_buckets:
                report.differences.append(Difference(key, "buckets", mine_buckets, theirs_buckets))
    for key in sorted(set(live) - set(states)):
        report.differences.append(Difference(key, "verdict", "missing", "present"))
    if history_query is not None:
        compare_history(report, history_query(HISTORY_QUERY))
        compare_rolling_buckets(report, history_query(ROLLING_BUCKETS_QUERY))
    return report


def compare_rolling_buckets(report: VerifyReport, rows: Sequence[Sequence[Any]]) -> None:
    """Every recomputed rolling window's newest 48 buckets against the store's
    (:data:`ROLLING_BUCKETS_QUERY`), differences into ``report``."""
    stored: dict[tuple[str, str], dict[int, list[int]]] = {}
    for key, period, bucket, *sums in rows:
        stored.setdefault((str(key), str(period)), {})[int(bucket)] = [int(v) for v in sums]
    for where in sorted(set(report.rolling) | set(stored)):
        mine = report.rolling.get(where, {})
        theirs = _live_buckets(stored[where]) if where in stored else {}
        if mine != theirs:
            report.differences.append(Difference(where[0], "buckets", mine, theirs, where[1]))


def compare_history(report: VerifyReport, rows: Sequence[Sequence[Any]]) -> None:
    """Every recomputed (counter, period) against ``budget_history``'s rows
    (:data:`HISTORY_QUERY`), differences into ``report``."""
    stored = {
        (str(key), str(period)): tuple(int(v) for v in values) for key, period, *values in rows
    }
    report.periods_compared = 0
    for (key, period), mine in sorted(report.history.items()):
        theirs = stored.get((key, period))
        report.periods_compared += 1
        if theirs is None:
            report.differences.append(Difference(key, "history", "present", "missing", period))
            continue
        for name, a, b in zip(
            ("spent_nanos", "spent_tokens", "spent_requests", "events"), mine, theirs, strict=True
        ):
            if a != b:
                report.differences.append(Difference(key, name, a, b, period))
    for key, period in sorted(set(stored) - set(report.history)):
        report.differences.append(Difference(key, "history", "missing", "present", period))

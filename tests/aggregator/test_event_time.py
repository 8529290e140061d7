"""Event time the aggregator trusts (issue 17): an event from the future is dead-lettered,
never counted, and can never move a counter into a period that has not begun."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aggregator.counting.batch_output import BatchOutput
from aggregator.counting.fold import CounterState
from aggregator.counting.process import BatchProcessor, RawRecord
from schemas.codec import DEAD_LETTER, USAGE_EVENT, VERDICT
from schemas.ids import counter_key
from schemas.periods import FUTURE_EVENT, MAX_FUTURE_SKEW_SECONDS
from tests.aggregator.test_process import COST, Store, event, records, reference

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
SECRET = counter_key("per-secret", ("acme", "sk-a"))


def run(
    store: Store, processor: BatchProcessor, batch: list[RawRecord], now: datetime = NOW
) -> BatchOutput:
    out = processor.process(batch, store.read_counter, store.read_seen, now=now)
    for (_, key), value in out.counter_writes.items():
        store.counters[key] = value
    for (_, key), position in out.seen_writes.items():
        store.seen[key] = position
    return out


def counter(store: Store) -> CounterState:
    return CounterState.from_json(store.counters[SECRET])


def test_an_event_from_the_future_is_dead_lettered_and_leaves_the_period() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    december = [event(i, occurred_at=NOW - timedelta(hours=1, seconds=i)) for i in range(3)]
    run(store, processor, records(december))
    future = event(
        99, occurred_at=datetime(2027, 3, 15, tzinfo=UTC), input_tokens=1, output_tokens=1
    )
    out = run(store, processor, records([future], start=3))
    assert out.stats.dead_letters == 1 and out.stats.charged == 0
    dead = DEAD_LETTER.decode(out.dead_letters[0][1])
    assert dead["reason"] == FUTURE_EVENT and dead["source_offset"] == 3
    assert "2027-03-15" in dead["detail"] and "max_future_skew_seconds" in dead["detail"]
    assert dead["value"] is not None
    assert USAGE_EVENT.decode(dead["value"])["event_id"] == "ev-99"  # nothing lost: requeue it
    assert counter(store).period == "m:2026-12"
    assert out.verdict_changes == {} and out.priced == []
    # the event id is not taken: once its time has come, a requeued copy counts
    later = run(store, processor, records([future], start=4), now=datetime(2027, 3, 15, tzinfo=UTC))
    assert later.stats.charged == 1


def test_a_gateway_clock_a_little_ahead_is_within_the_bound() -> None:
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    ahead = event(1, occurred_at=NOW + timedelta(seconds=MAX_FUTURE_SKEW_SECONDS - 1))
    too_far = event(2, occurred_at=NOW + timedelta(seconds=MAX_FUTURE_SKEW_SECONDS + 1))
    out = run(store, processor, records([ahead, too_far]))
    assert out.stats.charged == 1 and out.stats.dead_letters == 1
    assert DEAD_LETTER.decode(out.dead_letters[0][1])["source_offset"] == 1


def test_a_skewed_producer_clock_is_bounded_by_the_worker_clock() -> None:
    """The record's Kafka timestamp counts only when it is earlier than the worker's clock:
    a gateway whose clock is a year ahead stamps both its event and its record."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    skewed = NOW + timedelta(days=365)
    e = event(1, occurred_at=skewed)
    stamp_ms = int(skewed.timestamp() * 1000)
    out = run(store, processor, [RawRecord(0, 0, b"acme", USAGE_EVENT.encode(e), stamp_ms)])
    assert out.stats.dead_letters == 1
    # and a replay folding the ledger later decides as the live fold did: an event stamped
    # by Kafka an hour before its occurred_at is from the future whenever it is folded
    early = event(2, occurred_at=NOW)
    early_ms = int((NOW - timedelta(hours=1)).timestamp() * 1000)
    replayed = run(
        Store(),
        BatchProcessor(reference(), source_topic="usage.raw"),
        [RawRecord(0, 1, b"acme", USAGE_EVENT.encode(early), early_ms)],
        now=NOW + timedelta(days=30),
    )
    assert replayed.stats.dead_letters == 1


def test_the_bound_is_a_setting() -> None:
    processor = BatchProcessor(reference(), source_topic="usage.raw", max_future_skew_seconds=0)
    out = run(Store(), processor, records([event(1, occurred_at=NOW + timedelta(seconds=1))]))
    assert out.stats.dead_letters == 1


def test_late_events_count_in_their_own_period_and_leave_the_verdict_alone() -> None:
    """A period rollover while one partition lags: partition 1 is still in November when
    partition 0 already folds December; its late events count in November only."""
    store, processor = Store(), BatchProcessor(reference(), source_topic="usage.raw")
    dec = [event(i, occurred_at=NOW - timedelta(minutes=i)) for i in range(2)]
    run(store, processor, records(dec))
    late = [event(10 + i, occurred_at=datetime(2026, 11, 30, 23, 59, tzinfo=UTC)) for i in range(3)]
    out = run(store, processor, records(late, start=2))
    state = counter(store)
    assert state.period == "m:2026-12"
    assert state.periods["m:2026-12"].nanos == 2 * COST
    assert state.periods["m:2026-11"].nanos == 3 * COST
    assert SECRET not in out.verdict_changes  # December's verdict is not re-sent with November's
    verdict = VERDICT.decode(
        run(store, processor, records([event(20, occurred_at=NOW)], start=5)).verdicts[SECRET]
    )
    assert verdict["period"] == "m:2026-12" and verdict["spent_nanos"] == 3 * COST

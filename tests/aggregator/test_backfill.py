"""A budget new to a partition is counted from its period's start by folding the records
again (aggregator/counting/backfill.py): the re-read equals a fold that had the budget from
the first record, and leaves every other counter as it was; the plan says which budgets
need a re-read, which are taken as counted, and from when."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.counting.backfill import (
    MARKER_PREFIX,
    MARKERS_KEPT,
    Backfills,
    marker_entries,
    period_begins_us,
)
from aggregator.counting.process import BatchProcessor, RawRecord
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import USAGE_EVENT
from schemas.periods import to_micros
from tests.aggregator.test_process import BUDGETS, T0, Store, event, records, reference

NEW = budgets_from_yaml(
    yaml.safe_load(
        """
- {id: late-day, scope: org, match: {org_id: acme}, window: day, limit_usd: "1"}
- {id: late-secret, scope: secret, window: "rolling:2h", limit_tokens: 100000}
"""
    )
)
SKEW_US = 300_000_000


def fold_all(store: Store, processor: BatchProcessor, batches: list[list[RawRecord]]) -> None:
    for batch in batches:
        store.run(processor, batch)


@settings(max_examples=40, deadline=None)
@given(
    seconds=st.lists(st.integers(0, 6 * 3600), min_size=2, max_size=30),
    applied_after=st.integers(1, 29),
    batch=st.integers(1, 7),
)
def test_a_re_read_counts_a_new_budget_as_if_it_had_always_been_there(
    seconds: list[int], applied_after: int, batch: int
) -> None:
    ledger = [
        event(i, secret_id=f"sk-{i % 3}", occurred_at=T0 + timedelta(seconds=s))
        for i, s in enumerate(seconds)
    ]
    raw = records(ledger)
    cut = min(applied_after, len(raw))

    # live: the old budgets fold the records before the cut; the new ones arrive; the
    # stage folds those records again (a re-read), then goes on
    live_ref = reference()
    live, processor = Store(), BatchProcessor(live_ref, source_topic="usage.raw")
    fold_all(live, processor, [raw[i : i + batch] for i in range(0, cut, batch)])
    before = dict(live.counters)
    live_ref.budgets.update({b.budget_id: b for b in NEW})
    live_ref.version += 1
    fold_all(live, processor, [raw[i : i + batch] for i in range(0, cut, batch)])
    # the old budgets' counters are exactly as they were before the re-read
    assert {k: v for k, v in live.counters.items() if k in before} == before
    fold_all(live, processor, [raw[i : i + batch] for i in range(cut, len(raw), batch)])

    # the oracle: one fold with every budget from the first record
    whole_ref = reference()
    whole_ref.budgets.update({b.budget_id: b for b in NEW})
    whole = Store()
    fold_all(whole, BatchProcessor(whole_ref, source_topic="usage.raw"), [raw])

    assert live.counters == whole.counters


def budget(text: str) -> Budget:
    return budgets_from_yaml(yaml.safe_load(text))[0]


def test_a_new_partition_takes_the_budgets_as_counted_without_a_re_read() -> None:
    plans = Backfills(SKEW_US).plan(1, BUDGETS, {0}, lambda p, k: None, to_micros(T0))
    assert [p.reread for p in plans] == [{}]
    assert set(plans[0].mark_now) == {b.budget_id for b in BUDGETS} | {""}
    entries = dict(marker_entries(plans[0].mark_now))
    assert entries[MARKERS_KEPT] == "kept"
    assert entries[MARKER_PREFIX + "per-secret"] == BUDGETS[0].counting_fingerprint


def test_a_budget_new_to_a_kept_partition_is_read_again_from_its_period_start() -> None:
    seen = {MARKERS_KEPT: "kept"} | {
        MARKER_PREFIX + b.budget_id: b.counting_fingerprint for b in BUDGETS
    }
    backfills = Backfills(SKEW_US)
    now = T0 + timedelta(hours=5)
    plans = backfills.plan(2, [*BUDGETS, *NEW], {0, 1}, lambda p, k: seen.get(k), to_micros(now))
    assert [(p.partition, sorted(p.reread), p.mark_now) for p in plans] == [
        (0, ["late-day", "late-secret"], {}),
        (1, ["late-day", "late-secret"], {}),
    ]
    # the earlier of midnight (the day) and two hours ago (the rolling window), less the skew
    midnight = to_micros(datetime(2026, 11, 30, tzinfo=UTC))
    assert plans[0].from_us == midnight - SKEW_US
    assert period_begins_us(NEW[1], to_micros(now)) == to_micros(now - timedelta(hours=2))

    backfills.begin(plans[0], until=40)
    # a re-read folds the events of the budgets' current periods only
    assert plans[0].counts_from_us == midnight
    today, yesterday = (
        USAGE_EVENT.encode(event(i, occurred_at=at))
        for i, at in enumerate((datetime(2026, 11, 30, tzinfo=UTC), T0 - timedelta(hours=11)))
    )
    assert backfills.counts_again(0, today) and not backfills.counts_again(0, yesterday)
    assert not backfills.counts_again(0, b"not avro")
    assert backfills.rereads(0, 39) and not backfills.rereads(0, 40)
    assert backfills.loading() == {"late-day": [0], "late-secret": [0]}
    assert "late-day" not in backfills.counting()
    assert backfills.finished({0: 39}, epoch=7) == []
    done = {b.budget_id: b.counting_fingerprint for b in NEW}
    assert backfills.finished({0: 40}, epoch=7) == [(0, done)]
    # loaded once the checkpoint holding its markers and verdicts is delivered
    assert backfills.loading() == {"late-day": [0], "late-secret": [0]}
    backfills.settled(6)
    assert "late-day" not in backfills.counting()
    backfills.settled(7)
    assert backfills.loading() == {}
    assert "late-day" in backfills.counting()


def test_only_what_a_budget_counts_decides_a_re_read() -> None:
    base = budget("- {id: b, scope: org, window: day, limit_usd: '1', alert_at: [0.5]}")
    for same in (
        "- {id: b, scope: org, window: day, limit_usd: '9', action: warn}",
        "- {id: b, scope: org, window: day, limit_tokens: 5, rate: {requests_per_minute: 1}}",
    ):
        assert budget(same).counting_fingerprint == base.counting_fingerprint
    for other in (
        "- {id: b, scope: secret, window: day, limit_usd: '1'}",
        "- {id: b, scope: org, match: {org_id: acme}, window: day, limit_usd: '1'}",
        "- {id: b, scope: org, window: week, limit_usd: '1'}",
        "- {id: b, scope: org, window: day, timezone: Europe/Berlin, limit_usd: '1'}",
        "- {id: b, scope: org, window: day, limit_usd: '1', count_denied: true}",
    ):
        assert budget(other).counting_fingerprint != base.counting_fingerprint
    # a changed definition on a kept partition: taken as it is, from the next event on
    seen = {MARKERS_KEPT: "kept", MARKER_PREFIX + "b": base.counting_fingerprint}
    changed = budget(other)
    plans = Backfills(SKEW_US).plan(1, [changed], {0}, lambda p, k: seen.get(k), 0)
    assert [(p.mark_now, p.reread) for p in plans] == [({"b": changed.counting_fingerprint}, {})]
    # unchanged: nothing to do
    assert Backfills(SKEW_US).plan(1, [base], {0}, lambda p, k: seen.get(k), 0) == []

"""A fold that starts from a counter snapshot equals a fold of the whole ledger (real Kafka)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from aggregator.replay.snapshots import (
    Bounds,
    FoldState,
    fold_ledger,
    latest_snapshot,
    load_reference,
    write_snapshot,
)
from runtime.topic_reader import read_latest_values
from schemas.topics import Topics
from tests.pipeline_kit import Pipeline
from tests.pipeline_kit import publish_usage as publish
from tests.replay.kit import BASE_TIME, make_events

pytestmark = pytest.mark.integration


def _apply_reference(bootstrap: str, topics: Topics, home: Path) -> None:
    """The pipeline kit's prices and budgets (no worker is started)."""
    Pipeline(bootstrap, topics, home, f"chdb://{home / 'unused'}").apply_reference()


async def _fold_all(bootstrap: str, topics: Topics, **kwargs: Any) -> FoldState:
    reference = await load_reference(bootstrap, topics)
    return await fold_ledger(bootstrap, topics, reference, **kwargs)


def test_snapshot_start_equals_full_replay(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    _apply_reference(kafka_bootstrap, topics, tmp_path)
    first = make_events(600, seed=3)
    asyncio.run(publish(kafka_bootstrap, topics.usage_raw, first + first[:20]))

    state = asyncio.run(_fold_all(kafka_bootstrap, topics))
    assert state.stats.charged == 600 and state.stats.duplicates == 20
    snapshot_id = asyncio.run(write_snapshot(kafka_bootstrap, topics, state))
    fences = dict(state.fences)
    assert sum(fences.values()) == 620

    # after the snapshot: new events, and event ids published before the fence again
    later = make_events(400, seed=3, start=600)
    asyncio.run(publish(kafka_bootstrap, topics.usage_raw, later + first[100:130] + later[:10]))

    found = asyncio.run(latest_snapshot(kafka_bootstrap, topics))
    assert found is not None and found[0] == snapshot_id and found[1].fences == fences
    from_snapshot = asyncio.run(_fold_all(kafka_bootstrap, topics, start=found[1]))
    from_zero = asyncio.run(_fold_all(kafka_bootstrap, topics))

    assert from_snapshot.canonical() == from_zero.canonical()  # byte-identical counters
    assert from_snapshot.stats == from_zero.stats
    assert from_zero.stats.charged == 1000 and from_zero.stats.duplicates == 60
    assert from_snapshot.orgs == from_zero.orgs
    assert from_snapshot.seen == from_zero.seen
    # replaying twice gives byte-identical counters
    assert asyncio.run(_fold_all(kafka_bootstrap, topics)).canonical() == from_zero.canonical()

    # a second snapshot supersedes the first; the old one's keys are tombstoned beyond `keep`
    second = asyncio.run(write_snapshot(kafka_bootstrap, topics, from_zero, keep=1))
    live = asyncio.run(read_latest_values(kafka_bootstrap, topics.counter_snapshots))
    assert {k.split(b"|")[0] for k, v in live.items() if v is not None} == {second.encode()}


def test_a_bounded_fold_counts_only_its_event_time_slice(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    _apply_reference(kafka_bootstrap, topics, tmp_path)
    events = make_events(300, seed=5)
    asyncio.run(publish(kafka_bootstrap, topics.usage_raw, events))
    since = BASE_TIME + timedelta(seconds=37 * 100)
    until = BASE_TIME + timedelta(seconds=37 * 250)
    sliced = asyncio.run(_fold_all(kafka_bootstrap, topics, bounds=Bounds(since, until)))
    assert sliced.stats.charged == 150
    whole = asyncio.run(_fold_all(kafka_bootstrap, topics))
    assert whole.stats.charged == 300
    assert sum(n for _, n in sliced.orgs.values()) < sum(n for _, n in whole.orgs.values())

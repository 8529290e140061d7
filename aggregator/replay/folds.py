"""The folds of the ledger that run in memory: a dry-run replay and a new counter snapshot.

Neither starts a worker nor publishes a generation; ``write_new_snapshot`` publishes only
the snapshot. Design: docs/replay.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aggregator.replay.generations import (
    compare_at_cut,
    current_generation,
    fold_views,
    verdict_views,
)
from aggregator.replay.report import ReplayReport, fill_totals, org_changes, priced_org_spend
from aggregator.replay.run import StackPlace
from aggregator.replay.snapshots import (
    Bounds,
    FoldState,
    fold_ledger,
    latest_snapshot,
    ledger_ends,
    load_reference,
    write_snapshot,
)
from schemas.errors import ConfigError


async def fold_dry_run(
    place: StackPlace,
    *,
    bounds: Bounds | None = None,
    from_snapshot: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[ReplayReport, FoldState]:
    """Fold the ledger in memory (from the latest snapshot when asked) and compare with the
    current generation's verdicts (only when unbounded: a slice's counters are partial)."""
    started = time.monotonic()
    bounds = bounds if bounds is not None else Bounds()
    generation = await current_generation(place.bootstrap, place.topics, security=place.security)
    current = place.topics.of_generation(generation)
    reference = await load_reference(place.bootstrap, place.topics, security=place.security)
    start = None
    if from_snapshot:
        found = await latest_snapshot(place.bootstrap, place.topics, security=place.security)
        if found is None:
            raise ConfigError(f"no complete snapshot on {place.topics.counter_snapshots}")
        start = found[1]
    ends = await ledger_ends(place.bootstrap, place.topics, security=place.security)
    fold = await fold_ledger(
        place.bootstrap,
        place.topics,
        reference,
        start=start,
        until=ends,
        bounds=bounds,
        progress=progress,
        security=place.security,
    )
    report = ReplayReport("(dry run)", generation)
    fill_totals(report, fold)
    report.seconds = time.monotonic() - started
    report.events_per_second = report.records / report.seconds if report.seconds else 0.0
    if bounds == Bounds():
        differences, pending = compare_at_cut(
            fold_views(fold),
            await verdict_views(place.bootstrap, current.budget_verdicts, security=place.security),
        )
        report.vs_previous = differences + pending
        before = await priced_org_spend(place.bootstrap, current, ends, security=place.security)
        report.org_changes = org_changes(before, fold.org_spend())
    return report, fold


async def write_new_snapshot(
    place: StackPlace, progress: Callable[[int, int], None] | None = None
) -> tuple[str, FoldState]:
    """Fold the ledger from the latest snapshot (or offset 0) and write a new snapshot of
    the result: its id and the fold."""
    reference = await load_reference(place.bootstrap, place.topics, security=place.security)
    found = await latest_snapshot(place.bootstrap, place.topics, security=place.security)
    fold = await fold_ledger(
        place.bootstrap,
        place.topics,
        reference,
        start=None if found is None else found[1],
        progress=progress,
        security=place.security,
    )
    return await write_snapshot(place.bootstrap, place.topics, fold, security=place.security), fold

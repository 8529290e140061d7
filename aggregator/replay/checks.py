"""A replay's checks: verdicts against the fold's history, ClickHouse rows against the fold.

The verdict comparison matches each verdict with the state the fold showed at the same seq
(live traffic keeps verdicts moving); the ClickHouse checks ask the new generation's store
through ``sql`` (the worker's ``/sql`` page), waiting ``settle_seconds`` at most for its
sink to write. Design: docs/replay.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aggregator.counting.fold import CounterState
from aggregator.counting.reference import Reference
from aggregator.replay.generations import (
    CounterView,
    Difference,
    compare_at_cut,
    compare_views,
    counters_from_rows,
    fold_views,
)
from aggregator.replay.snapshots import FoldState

#: runs one query on the new generation's store: {"columns": [...], "rows": [[...], ...]}
SqlQuery = Callable[[str], dict[str, Any]]


def counter_view(counter: CounterState) -> CounterView:
    """A counter's current period as the comparisons see it."""
    totals = counter.periods[counter.period]
    return (counter.period, totals.nanos, totals.tokens, totals.requests)


def compare_with_history(
    history: dict[str, dict[int, CounterView]], verdicts: dict[str, tuple[CounterView, int]]
) -> list[Difference]:
    """Each verdict against the state the fold showed at the verdict's seq (expected = the
    fold). A verdict at a seq the fold has not reached is a ``seq`` difference (in flight:
    read again); a counter only one side has is a ``counter`` difference."""
    out: list[Difference] = []
    for key in sorted(set(history) | set(verdicts)):
        states, verdict = history.get(key), verdicts.get(key)
        if states is None or verdict is None:
            mine, theirs = states is not None, verdict is not None
            out.append(
                Difference(
                    key,
                    "counter",
                    "present" if mine else "missing",
                    "present" if theirs else "missing",
                )
            )
            continue
        view, seq = verdict
        expected = states.get(seq)
        if expected is None:
            out.append(Difference(key, "seq", max(states), seq))
            continue
        out.extend(compare_views({key: expected}, {key: view}))
    return out


def in_flight(
    vs_ledger: list[Difference], vs_previous: list[Difference], *, previous_done: bool
) -> list[Difference]:
    """The differences worth reading the verdicts again for: a seq the fold has not reached,
    a verdict not sent yet. A counter the previous generation lacks (of a budget added
    since) stays missing; a previous verdict behind the fold's state at the cut stays
    behind once ``previous_done`` (its group committed past the cut): that generation
    counted otherwise (a price or a budget changed since), it is not catching up."""
    return [d for d in vs_ledger if d.field in ("seq", "counter")] + [
        d for d in vs_previous if d.field == "seq" and (d.found > d.expected or not previous_done)
    ]


def clickhouse_differences(
    sql: SqlQuery,
    reference: Reference,
    fold: FoldState,
    ends: dict[int, int],
    settle_seconds: float,
) -> list[Difference]:
    """Counters recomputed from the rows the new generation's sink stored, at the cut."""
    cut = " OR ".join(
        f"(source_partition = {p} AND source_offset < {end})" for p, end in sorted(ends.items())
    )
    deadline = time.monotonic() + settle_seconds
    while True:  # the sink writes within a second or so of the priced records
        count = sql(f"SELECT count() FROM usage_events WHERE {cut}")
        if int(count["rows"][0][0]) >= fold.stats.charged or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    rows: list[dict[str, Any]] = []
    for partition, end in sorted(ends.items()):
        result = sql(
            "SELECT * EXCEPT (inserted_at, priced_at) FROM usage_events "
            f"WHERE source_partition = {partition} AND source_offset < {end}"
        )
        for values in result["rows"]:
            row = dict(zip(result["columns"], values, strict=True))
            row["occurred_at"] = datetime.fromisoformat(row["occurred_at"])
            rows.append(row)
    differences, pending = compare_at_cut(
        fold_views(fold), counters_from_rows(reference.budgets.values(), rows)
    )
    return differences + pending  # both sides at the same cut: nothing is in flight


def clickhouse_after_fences(
    sql: SqlQuery, fold: FoldState, snapshot: FoldState, ends: dict[int, int], settle_seconds: float
) -> list[Difference]:
    """What a snapshot-start store can be checked for: per org, the events and spend
    of its rows between the fences and the cut against the fold's part after the
    fences (fold minus snapshot); and that it holds no row below a fence."""
    expected: dict[str, tuple[int, int]] = {}
    for org, (events, nanos) in fold.orgs.items():
        before = snapshot.orgs.get(org, [0, 0])
        if (events - before[0], nanos - before[1]) != (0, 0):
            expected[org] = (events - before[0], nanos - before[1])
    after = " OR ".join(
        f"(source_partition = {p} AND source_offset >= {snapshot.fences.get(p, 0)} "
        f"AND source_offset < {end})"
        for p, end in sorted(ends.items())
    )
    below = " OR ".join(
        f"(source_partition = {p} AND source_offset < {fence})"
        for p, fence in sorted(snapshot.fences.items())
    )
    # one row per ledger position (a re-delivered insert is not counted twice)
    query = (
        "SELECT org_id, count(), sum(cost_nanos) FROM (SELECT org_id, cost_nanos "
        f"FROM usage_events WHERE {after} LIMIT 1 BY source_partition, source_offset) "
        "GROUP BY org_id"
    )
    wanted = sum(events for events, _ in expected.values())
    deadline = time.monotonic() + settle_seconds
    while True:  # the sink writes within a second or so of the priced records
        rows = sql(query)["rows"]
        found = {str(org): (int(n), int(nanos)) for org, n, nanos in rows}
        if sum(n for n, _ in found.values()) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    differences = [
        Difference(f"org {org}", name, a, b)
        for org in sorted(set(expected) | set(found))
        for name, a, b in zip(
            ("events after the fences", "cost_nanos after the fences"),
            expected.get(org, (0, 0)),
            found.get(org, (0, 0)),
            strict=True,
        )
        if a != b
    ]
    if below:
        stray = sql(f"SELECT count() FROM usage_events WHERE {below}")
        count = int(stray["rows"][0][0])
        if count:
            differences.append(Difference("(store)", "rows below the fences", 0, count))
    return differences

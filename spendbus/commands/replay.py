"""`spendbus replay` and `spendbus snapshot`: rebuild every counter from the ledger.

``replay`` starts a real aggregator worker for a new generation (its own
consumer group, tables, derived topics and ClickHouse store) beside the one
that serves, shows its progress from the group's committed offsets, and when
it has caught up compares its counters with the serving generation's, with an
in-memory fold of the ledger and with a recomputation from its ClickHouse
rows. ``--cutover`` then switches the enforcers to it and retires the old
generation. ``--dry-run`` folds in memory only and publishes nothing (the one
mode ``--since``/``--until`` are allowed in). Design: docs/replay.md.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from aggregator.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess
from aggregator.config import AggregatorConfig
from aggregator.fold import CounterState
from aggregator.generations import (
    CounterView,
    Difference,
    GroupProgress,
    compare_at_cut,
    compare_views,
    counters_from_rows,
    current_generation,
    fold_views,
    group_members,
    group_progress,
    prepare_store,
    publish_switch,
    read_switch,
    switch_to,
    topic_values,
    verdict_views,
)
from aggregator.reference import Reference
from aggregator.snapshots import (
    Bounds,
    FoldState,
    SeedResult,
    fold_ledger,
    incomplete_snapshots,
    latest_snapshot,
    ledger_ends,
    load_reference,
    seed_generation,
    snapshot_from_records,
    write_snapshot,
)
from schemas.codec import PRICED_USAGE
from schemas.errors import ConfigError, ContractError, SpendbusError
from schemas.kafka import PLAINTEXT, KafkaSecurity
from schemas.money import format_usd
from schemas.replication import FOLLOW_CLUSTER, ReplicationPolicy
from schemas.topic_reader import read_latest_values
from schemas.topics import Topics, check_generation
from spendbus.stack.broker_probe import free_port
from spendbus.stack.topics import ensure_topics
from spendbus.stack.worker import WorkerProcess

console = Console(stderr=True)

#: called with (events done, events to do, lag)
ProgressCallback = Callable[[int, int, int], None]


class ReplayError(SpendbusError):
    pass


@dataclass(frozen=True)
class OrgChange:
    org_id: str
    before_nanos: int
    after_nanos: int

    @property
    def delta_nanos(self) -> int:
        return self.after_nanos - self.before_nanos


@dataclass
class ReplayReport:
    generation: str
    previous: str
    records: int = 0
    charged: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    cost_nanos: int = 0
    counters: int = 0
    #: sha256 of the canonical counters: two replays of one ledger give the same digest
    counters_sha256: str = ""
    #: the new generation against the in-memory fold of the same ledger offsets
    vs_ledger: list[Difference] = field(default_factory=list)
    #: the new generation against the generation it replaces (price corrections show here)
    vs_previous: list[Difference] = field(default_factory=list)
    #: counters recomputed from the new generation's ClickHouse rows against the fold; after
    #: a snapshot start only events and spend per org after the fences (``clickhouse_scope``)
    vs_clickhouse: list[Difference] | None = None
    #: what vs_clickhouse compared, or why it compared nothing
    clickhouse_scope: str = ""
    #: the snapshot the generation started from ('' = offset 0) and what was seeded
    from_snapshot: str = ""
    seeded: dict[str, Any] | None = None
    org_changes: list[OrgChange] = field(default_factory=list)
    seconds: float = 0.0
    events_per_second: float = 0.0
    cut_over: bool = False

    @property
    def consistent(self) -> bool:
        """The rebuild is right: it equals the ledger fold and its own ClickHouse rows."""
        return not self.vs_ledger and not self.vs_clickhouse

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["org_changes"] = [{**asdict(c), "delta_nanos": c.delta_nanos} for c in self.org_changes]
        out["consistent"] = self.consistent
        return out


@dataclass
class StackPlace:
    """Where a replay runs: the cluster, the base names and the local state folder."""

    bootstrap: str
    topics: Topics  # the base prefix (its generation is ignored)
    dsn: str | None  # the base ClickHouse DSN; None = no sink
    home: Path
    partitions: int = 4
    #: how the replay's own clients connect (its worker reads the same settings)
    security: KafkaSecurity = PLAINTEXT
    #: an https:// ClickHouse server's CA file, verification and password (the same)
    clickhouse_access: ClickHouseAccess = DEFAULT_ACCESS
    #: the replication of the generation's new topics (schemas/replication.py)
    replication: ReplicationPolicy = FOLLOW_CLUSTER


class GenerationReplay:
    """One replay into ``generation``, step by step (the CLI and the tests drive it)."""

    def __init__(
        self,
        place: StackPlace,
        generation: str,
        *,
        worker_args: tuple[str, ...] = (),
        from_snapshot: bool = False,
    ) -> None:
        self.place = place
        self.from_snapshot = from_snapshot
        #: the snapshot the worker was seeded from (id, state as read) and what was written
        self.snapshot: tuple[str, FoldState] | None = None
        self.seeded: SeedResult | None = None
        self.generation = check_generation(generation)
        if not generation:
            raise ConfigError("a replay builds a new generation: give it a name (e.g. g2)")
        self.worker_args = worker_args
        self.previous = ""
        self.topics = place.topics.of_generation(generation)
        port = free_port()
        self.worker = WorkerProcess(
            run_dir=place.home / "run",
            env={
                "KAFKA_BOOTSTRAP": place.bootstrap,
                "SPENDBUS_TOPIC_PREFIX": place.topics.prefix,
                "SPENDBUS_HOME": str(place.home),
                "SPENDBUS_PARTITIONS": str(place.partitions),
                "SPENDBUS_WEB_PORT": str(port),
                **({"CLICKHOUSE_DSN": place.dsn} if place.dsn else {}),
            },
            web_port=port,
            name=f"aggregator-{generation}",
            args=(
                "--generation",
                generation,
                *(() if place.dsn else ("--no-sink",)),
                *worker_args,
            ),
        )
        self.started_at = 0.0
        self.start_committed = 0
        #: an earlier command started the worker; this one only watches and compares
        self.attached = False

    # --- 1. start ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the generation's worker, or attach to it when an earlier `spendbus replay`
        left it running (a stopped one resumes from its committed offsets)."""
        place = self.place
        switch = asyncio.run(read_switch(place.bootstrap, place.topics, security=place.security))
        self.previous = "" if switch is None else switch.generation
        if self.previous == self.generation:
            raise ConfigError(f"generation {self.generation!r} is the current one already")
        if switch is not None and switch.previous == self.generation:
            raise ConfigError(f"generation {self.generation!r} was retired; pick a new name")
        snapshot = self._latest_snapshot() if self.from_snapshot else None
        asyncio.run(
            ensure_topics(
                place.bootstrap,
                self.topics,
                place.partitions,
                security=place.security,
                replication=place.replication,
            )
        )
        self.start_committed = asyncio.run(
            group_progress(place.bootstrap, self.topics, security=place.security)
        ).committed
        self.started_at = time.monotonic()
        port_file = self.worker.run_dir / f"{self.worker.name}.port"
        if self.worker.pid() is not None and port_file.exists():
            if snapshot is not None:
                raise ConfigError(
                    f"generation {self.generation!r} runs already (it started earlier): "
                    "drop --from-snapshot to attach to it"
                )
            self.worker.web_port = int(port_file.read_text())
            self.worker.env["SPENDBUS_WEB_PORT"] = str(self.worker.web_port)
            self.attached = True
            return
        if place.dsn:
            prepare_store(place.dsn, self.generation, place.clickhouse_access)
        if snapshot is not None:
            self._seed(snapshot)
        self.worker.start(timeout=180)
        port_file.write_text(str(self.worker.web_port))

    def _latest_snapshot(self) -> tuple[str, FoldState]:
        """The newest complete snapshot; a clear error when there is none."""
        topic = self.place.topics.counter_snapshots
        values = asyncio.run(
            read_latest_values(self.place.bootstrap, topic, security=self.place.security)
        )
        found = snapshot_from_records(values)
        if found is None:
            incomplete = incomplete_snapshots(values)
            detail = (
                f" ({', '.join(incomplete)} without a manifest: incomplete, never used)"
                if incomplete
                else ""
            )
            raise ConfigError(
                f"no complete snapshot on {topic}{detail}; write one with `spendbus snapshot`"
            )
        return found

    def _seed(self, snapshot: tuple[str, FoldState]) -> None:
        """Write the snapshot into the new generation's changelogs, verdicts and group
        offsets (``aggregator.snapshots.seed_generation``) before its worker starts."""
        place = self.place
        config = AggregatorConfig(
            bootstrap=place.bootstrap,
            kafka_security=place.security,
            topic_prefix=place.topics.prefix,
            generation=self.generation,
            app_id=self.topics.aggregator_app_id,
            partitions=place.partitions,
            replication=place.replication,
        )
        reference = asyncio.run(
            load_reference(place.bootstrap, place.topics, security=place.security)
        )
        # the fold in report() starts from the snapshot and changes what it is given
        self.seeded = asyncio.run(seed_generation(config, copy.deepcopy(snapshot[1]), reference))
        self.snapshot = snapshot
        self.start_committed = asyncio.run(
            group_progress(place.bootstrap, self.topics, security=place.security)
        ).committed

    # --- 2. watch until caught up -----------------------------------------------------------
    def wait_caught_up(
        self,
        progress: ProgressCallback | None = None,
        *,
        target: dict[int, int] | None = None,
        timeout: float = 3600.0,
        poll_seconds: float = 0.5,
    ) -> GroupProgress:
        """Until the generation's committed offsets reach ``target`` (default: the ledger's
        ends now). Raises ReplayError if the worker dies or the timeout passes."""
        place = self.place
        goal = (
            target
            if target is not None
            else asyncio.run(ledger_ends(place.bootstrap, place.topics, security=place.security))
        )
        deadline = time.monotonic() + timeout
        while True:
            state = asyncio.run(
                group_progress(place.bootstrap, self.topics, security=place.security)
            )
            if progress is not None:
                progress(state.committed, max(state.end, 1), state.lag)
            if state.past(goal):
                return state
            if self.worker.pid() is None:
                raise ReplayError(f"the replay worker stopped:\n{self.worker.log_tail()}")
            if time.monotonic() > deadline:
                raise ReplayError(f"not caught up after {timeout:.0f}s (lag {state.lag:,})")
            time.sleep(poll_seconds)

    # --- 3. compare ---------------------------------------------------------------------------
    def report(self, *, settle_seconds: float = 60.0) -> ReplayReport:
        """Compare the new generation with the ledger, its ClickHouse rows and the old one.

        Totals, spend per org and ClickHouse are compared at one cut of the ledger (its
        ends when the report starts). Verdicts keep moving under live traffic, so they
        are compared counter by counter where both sides applied the same events (same
        seq), re-reading the pending ones (and folding the ledger on) until they settle.
        """
        place = self.place
        report = ReplayReport(self.generation, self.previous)
        ends = asyncio.run(ledger_ends(place.bootstrap, place.topics, security=place.security))
        reached = self.wait_caught_up(target=ends)
        report.seconds = time.monotonic() - self.started_at
        done = reached.committed - self.start_committed
        report.events_per_second = done / report.seconds if report.seconds else 0.0
        reference = asyncio.run(
            load_reference(place.bootstrap, place.topics, security=place.security)
        )
        # a seeded generation is checked against a fold from the same snapshot (equal to a
        # fold from 0: tests/replay/test_snapshots.py), which needs no ledger below the fences
        start = None if self.snapshot is None else copy.deepcopy(self.snapshot[1])
        fold = asyncio.run(
            fold_ledger(
                place.bootstrap,
                place.topics,
                reference,
                start=start,
                until=ends,
                security=place.security,
            )
        )
        _fill_totals(report, fold)
        if self.snapshot is not None and self.seeded is not None:
            report.from_snapshot = self.snapshot[0]
            report.seeded = asdict(self.seeded)
        previous_topics = place.topics.of_generation(self.previous)
        before = asyncio.run(
            _priced_org_spend(place.bootstrap, previous_topics, ends, security=place.security)
        )
        after = fold.org_spend()
        report.org_changes = [
            OrgChange(org, before.get(org, 0), after.get(org, 0))
            for org in sorted(set(before) | set(after))
            if before.get(org, 0) != after.get(org, 0)
        ]
        if not place.dsn:
            report.clickhouse_scope = "not compared: the generation runs without a ClickHouse sink"
        elif self.snapshot is not None:
            report.vs_clickhouse = self._clickhouse_after_fences(
                fold, self.snapshot[1], ends, settle_seconds
            )
            report.clickhouse_scope = (
                "only the rows after the snapshot's fences (events and spend per org): a "
                "snapshot start does not rebuild the rows before them, so counters are not "
                "recomputed from ClickHouse"
            )
        else:
            report.vs_clickhouse = self._clickhouse_differences(
                reference, fold, ends, settle_seconds
            )
            report.clickhouse_scope = (
                "counters recomputed from every usage_events row below the cut"
            )

        # Verdicts keep moving under live traffic: each is compared with the state the
        # fold showed at the verdict's own seq. From the cut on, the fold goes record by
        # record and keeps every state each counter passes through.
        history: dict[str, dict[int, CounterView]] = {}
        for key, (view, seq) in fold_views(fold).items():
            history[key] = {seq: view}

        def remember(key: str, data: dict[str, Any]) -> None:
            counter = CounterState.from_json(data)
            if counter.period:
                history.setdefault(key, {})[counter.seq] = _counter_view(counter)

        deadline = time.monotonic() + settle_seconds
        while True:
            found = asyncio.run(
                verdict_views(place.bootstrap, self.topics.budget_verdicts, security=place.security)
            )
            old = asyncio.run(
                verdict_views(
                    place.bootstrap, previous_topics.budget_verdicts, security=place.security
                )
            )
            fold = asyncio.run(
                fold_ledger(
                    place.bootstrap,
                    place.topics,
                    reference,
                    start=fold,
                    on_counter=remember,
                    security=place.security,
                )
            )
            vs_ledger = compare_with_history(history, found)
            vs_previous = compare_with_history(history, old)
            # in flight: a seq the fold has not reached, a verdict not sent yet (a counter
            # the previous generation lacks, e.g. of a budget added since, stays missing)
            pending = [d for d in vs_ledger if d.field in ("seq", "counter")] + [
                d for d in vs_previous if d.field == "seq"
            ]
            if not pending or time.monotonic() > deadline:
                report.vs_ledger = vs_ledger
                # old -> new: what the previous generation shows, against the rebuild
                report.vs_previous = [
                    Difference(d.counter_key, d.field, d.found, d.expected) for d in vs_previous
                ]
                return report
            time.sleep(0.5)

    def _clickhouse_differences(
        self, reference: Reference, fold: FoldState, ends: dict[int, int], settle_seconds: float
    ) -> list[Difference]:
        """Counters recomputed from the rows the new generation's sink stored, at the cut."""
        cut = " OR ".join(
            f"(source_partition = {p} AND source_offset < {end})" for p, end in sorted(ends.items())
        )
        deadline = time.monotonic() + settle_seconds
        while True:  # the sink writes within a second or so of the priced records
            count = self.worker.post(
                "/sql", {"sql": f"SELECT count() FROM usage_events WHERE {cut}"}
            )
            if int(count["rows"][0][0]) >= fold.stats.charged or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        rows: list[dict[str, Any]] = []
        for partition, end in sorted(ends.items()):
            result = self.worker.post(
                "/sql",
                {
                    "sql": "SELECT * EXCEPT (inserted_at, priced_at) FROM usage_events "
                    f"WHERE source_partition = {partition} AND source_offset < {end}"
                },
            )
            for values in result["rows"]:
                row = dict(zip(result["columns"], values, strict=True))
                row["occurred_at"] = datetime.fromisoformat(row["occurred_at"])
                rows.append(row)
        differences, pending = compare_at_cut(
            fold_views(fold), counters_from_rows(reference.budgets.values(), rows)
        )
        return differences + pending  # both sides at the same cut: nothing is in flight

    def _clickhouse_after_fences(
        self, fold: FoldState, snapshot: FoldState, ends: dict[int, int], settle_seconds: float
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
            rows = self.worker.post("/sql", {"sql": query})["rows"]
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
            stray = self.worker.post(
                "/sql", {"sql": f"SELECT count() FROM usage_events WHERE {below}"}
            )
            count = int(stray["rows"][0][0])
            if count:
                differences.append(Difference("(store)", "rows below the fences", 0, count))
        return differences

    # --- 4. cut over --------------------------------------------------------------------------
    def cutover(self, serving: WorkerProcess | None, *, timeout: float = 600.0) -> None:
        """Switch the enforcers to this generation, then retire the old one.

        1. Wait until this generation has committed past the old generation's committed
           offsets (read now): it has applied at least everything the old one applied.
        2. Publish the switch (previous not yet retired): enforcers load the new verdicts
           in the background and swap atomically, keeping per counter the newer verdict.
        3. Stop ``serving`` (the old generation's worker, when this process knows it);
           without one, wait until the old generation's consumer group is empty (its
           workers run elsewhere: an operator stops them; restarted, they build the
           current generation).
        4. Publish the switch again with previous_retired: the alert relay starts forwarding.
        5. Hand over the serving slot: stop the replay worker and start ``serving`` again,
           which starts at the current generation (now this one).
        """
        place = self.place
        old = asyncio.run(
            group_progress(
                place.bootstrap, place.topics.of_generation(self.previous), security=place.security
            )
        )
        # Step 1
        self.wait_caught_up(target={p: c for p, (c, _) in old.partitions.items()}, timeout=timeout)
        # Step 2
        asyncio.run(
            publish_switch(
                place.bootstrap,
                place.topics,
                switch_to(self.generation, self.previous, retired=False),
                security=place.security,
            )
        )
        # Step 3
        if serving is not None:
            serving.stop()
        else:  # its workers run elsewhere: they must be stopped before it counts as retired
            self._wait_retired(timeout)
        # Step 4
        asyncio.run(
            publish_switch(
                place.bootstrap,
                place.topics,
                switch_to(self.generation, self.previous, retired=True),
                security=place.security,
            )
        )
        # Step 5
        if serving is not None:
            self.worker.stop()
            serving.start(timeout=180)

    def _wait_retired(self, timeout: float) -> None:
        group = self.place.topics.of_generation(self.previous).aggregator_app_id
        deadline = time.monotonic() + timeout
        warned = False
        while asyncio.run(group_members(self.place.bootstrap, group, security=self.place.security)):
            if not warned:
                console.print(
                    f"waiting for the workers of the old generation (group {group}) to stop",
                    highlight=False,
                )
                warned = True
            if time.monotonic() > deadline:
                raise ReplayError(f"the old generation's workers (group {group}) still run")
            time.sleep(1.0)

    def stop(self) -> None:
        self.worker.stop()


def _counter_view(counter: CounterState) -> CounterView:
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


def _fill_totals(report: ReplayReport, fold: FoldState) -> None:
    report.records = fold.stats.events
    report.charged = fold.stats.charged
    report.duplicates = fold.stats.duplicates
    report.dead_letters = fold.stats.dead_letters
    report.cost_nanos = fold.stats.cost_nanos
    report.counters = len(fold.counters)
    report.counters_sha256 = hashlib.sha256(fold.canonical()).hexdigest()


async def _priced_org_spend(
    bootstrap: str, topics: Topics, ends: dict[int, int], *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    """Spend per org as a generation priced it (its usage.priced, one record per ledger
    position up to ``ends``; a re-sent record is counted once)."""
    seen: dict[tuple[int, int], tuple[str, int]] = {}
    for value in await topic_values(bootstrap, topics.usage_priced, security=security):
        if value is None:
            continue
        try:
            record = PRICED_USAGE.decode(value)
        except ContractError:
            continue
        position = (record["source_partition"], record["source_offset"])
        if position[1] < ends.get(position[0], 0):
            seen[position] = (record["event"]["org_id"], record["cost_nanos"])
    out: dict[str, int] = {}
    for org, cost in seen.values():
        out[org] = out.get(org, 0) + cost
    return out


# --- dry run: in memory only ------------------------------------------------------------------


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
    _fill_totals(report, fold)
    report.seconds = time.monotonic() - started
    report.events_per_second = report.records / report.seconds if report.seconds else 0.0
    if bounds == Bounds():
        differences, pending = compare_at_cut(
            fold_views(fold),
            await verdict_views(place.bootstrap, current.budget_verdicts, security=place.security),
        )
        report.vs_previous = differences + pending
        before = await _priced_org_spend(place.bootstrap, current, ends, security=place.security)
        after = fold.org_spend()
        report.org_changes = [
            OrgChange(org, before.get(org, 0), after.get(org, 0))
            for org in sorted(set(before) | set(after))
            if before.get(org, 0) != after.get(org, 0)
        ]
    return report, fold


# --- the commands -------------------------------------------------------------------------------


def _place() -> tuple[StackPlace, Any]:
    from spendbus.settings import load_settings
    from spendbus.stack.local import bootstrap_or_fail

    settings = load_settings()
    place = StackPlace(
        bootstrap=bootstrap_or_fail(settings),
        security=settings.kafka_security,
        topics=settings.topics,
        dsn=settings.dsn,
        clickhouse_access=settings.clickhouse_access,
        home=settings.home.resolve(),
        partitions=settings.partitions,
        replication=settings.replication,
    )
    return place, settings


def progress_bar(disable: bool = False, on: Console | None = None) -> Progress:
    """The replay's progress display: events, events/s, lag, elapsed, ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>9,.0f} events/s"),
        TextColumn("lag {task.fields[lag]:>9,}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=on or console,
        disable=disable,
    )


class Meter:
    """Feeds the progress bar: events done, rate over the last few seconds, lag."""

    def __init__(self, bar: Progress, task: TaskID) -> None:
        self.bar, self.task = bar, task
        self.samples: list[tuple[float, int]] = []

    def __call__(self, done: int, total: int, lag: int | None = None) -> None:
        now = time.monotonic()
        self.samples = [(t, d) for t, d in self.samples if now - t < 5.0] + [(now, done)]
        t0, d0 = self.samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        self.bar.update(
            self.task,
            completed=done,
            total=total,
            rate=rate,
            lag=total - done if lag is None else lag,
        )


def _parse_time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected an ISO 8601 time, e.g. 2026-11-01T00:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r}: give a time zone (Z or +00:00)")
    return parsed


@click.command()
@click.option(
    "--generation", "generation", default=None, help="Name of the new generation (default: g<N+1>)."
)
@click.option(
    "--since",
    default=None,
    help="Only events that occurred at or after (ISO 8601; with --dry-run).",
)
@click.option(
    "--until", default=None, help="Only events that occurred before (ISO 8601; with --dry-run)."
)
@click.option("--dry-run", is_flag=True, help="Fold in memory, compare, publish nothing.")
@click.option(
    "--from-snapshot",
    is_flag=True,
    help="Start from the latest complete counter snapshot instead of offset 0 "
    "(ClickHouse then holds only the events after its fences).",
)
@click.option(
    "--cutover",
    is_flag=True,
    help="When consistent, switch enforcers to it and retire the old one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def replay(
    generation: str | None,
    since: str | None,
    until: str | None,
    dry_run: bool,
    from_snapshot: bool,
    cutover: bool,
    as_json: bool,
) -> None:
    """Rebuild every counter, verdict and ClickHouse table from usage.raw into a new generation.

    Exit status 0 when the rebuild is consistent (equal to the ledger fold and to its own
    ClickHouse rows), 1 otherwise. Differences from the old generation are reported, not
    failures: after a price correction they are the point.
    """
    bounds = Bounds(_parse_time(since), _parse_time(until))
    if bounds != Bounds() and not dry_run:
        raise click.UsageError(
            "--since/--until give partial counters, for investigations: use them with --dry-run"
        )
    if cutover and dry_run:
        raise click.UsageError("--cutover needs a real generation: drop --dry-run")
    place, settings = _place()
    if dry_run:
        with progress_bar(as_json) as bar:
            meter = Meter(bar, bar.add_task("folding usage.raw", total=None, rate=0.0, lag=0))
            report, _ = asyncio.run(
                fold_dry_run(place, bounds=bounds, from_snapshot=from_snapshot, progress=meter)
            )
        _show(report, as_json)
        sys.exit(0)
    name = generation or asyncio.run(_next_generation(place))
    run = GenerationReplay(place, name, from_snapshot=from_snapshot)
    console.print(f"replaying usage.raw into generation [bold]{name}[/bold] ...", highlight=False)
    run.start()
    if run.seeded is not None and run.snapshot is not None:
        console.print(
            f"started from snapshot {run.snapshot[0]} (fences {run.seeded.fences}): "
            f"{run.seeded.counters:,} counters, {run.seeded.dedupe_entries:,} dedupe entries "
            f"and {run.seeded.verdicts:,} verdicts seeded; ClickHouse is rebuilt only from the "
            "fences on",
            highlight=False,
        )
    try:
        with progress_bar(as_json) as bar:
            meter = Meter(bar, bar.add_task(f"generation {name}", total=None, rate=0.0, lag=0))
            run.wait_caught_up(meter)
        report = run.report()
        if cutover and report.consistent:
            from spendbus.stack.local import worker_process

            serving = worker_process(settings, {"KAFKA_BOOTSTRAP": place.bootstrap})
            run.cutover(serving if serving.pid() is not None else None)
            report.cut_over = True
    except BaseException:
        run.stop()
        raise
    _show(report, as_json)
    if not report.cut_over:
        console.print(
            f"generation {name} keeps running beside the current one (worker pid "
            f"{run.worker.pid()}, log {run.worker.log_file}); stop it with "
            f"`kill {run.worker.pid()}` or cut over with "
            f"`spendbus replay --generation {name} --cutover`",
            highlight=False,
        )
    sys.exit(0 if report.consistent else 1)


async def _next_generation(place: StackPlace) -> str:
    current = await current_generation(place.bootstrap, place.topics, security=place.security)
    number = int(current[1:]) + 1 if current.startswith("g") and current[1:].isdigit() else 2
    return f"g{number}"


def _show(report: ReplayReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_json(), default=str))
        return
    out = Console()
    out.print(
        f"{report.records:,} ledger records, {report.charged:,} charged "
        f"({format_usd(report.cost_nanos)}), {report.duplicates:,} duplicates, "
        f"{report.dead_letters:,} dead letters; {report.counters:,} counters "
        f"(sha256 {report.counters_sha256[:16]}); {report.events_per_second:,.0f} events/s"
    )
    for title, differences in (
        ("vs the ledger (in memory)", report.vs_ledger),
        ("vs its ClickHouse rows", report.vs_clickhouse),
        (f"vs generation {report.previous or '(default)'}", report.vs_previous),
    ):
        # a limited or skipped ClickHouse comparison says what it covered, never a bare "equal"
        limited = differences is report.vs_clickhouse and (
            report.from_snapshot or differences is None
        )
        if limited and report.clickhouse_scope:
            title = f"{title} ({report.clickhouse_scope})"
        if differences is None:
            if limited and report.clickhouse_scope:
                out.print(f"[yellow]{title}[/yellow]")
            continue
        if not differences:
            out.print(f"[green]{title}: no differences[/green]")
            continue
        table = Table("counter", "field", "expected", "found", title=f"{title}: {len(differences)}")
        for d in differences[:50]:
            table.add_row(d.counter_key, d.field, str(d.expected), str(d.found))
        out.print(table)
    if report.org_changes:
        table = Table("org", "before", "after", "change", title="spend per org that changed")
        for c in report.org_changes:
            table.add_row(
                c.org_id,
                format_usd(c.before_nanos),
                format_usd(c.after_nanos),
                ("+" if c.delta_nanos > 0 else "-") + format_usd(abs(c.delta_nanos)),
            )
        out.print(table)
    if report.cut_over:
        out.print(f"[green]cut over to generation {report.generation}[/green]")


@click.command()
@click.option("--json", "as_json", is_flag=True)
def snapshot(as_json: bool) -> None:
    """Fold the ledger from the latest snapshot (or offset 0) and write a new counter snapshot."""
    place, _ = _place()

    async def make(progress: Callable[[int, int], None]) -> tuple[str, FoldState]:
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
        return await write_snapshot(
            place.bootstrap, place.topics, fold, security=place.security
        ), fold

    with progress_bar(as_json) as bar:
        meter = Meter(bar, bar.add_task("folding usage.raw", total=None, rate=0.0, lag=0))
        snapshot_id, fold = asyncio.run(make(meter))
    summary = {
        "snapshot": snapshot_id,
        "fences": fold.fences,
        "counters": len(fold.counters),
        "dedupe_entries": len(fold.seen),
        "counters_sha256": hashlib.sha256(fold.canonical()).hexdigest(),
    }
    if as_json:
        click.echo(json.dumps(summary))
    else:
        Console().print(
            f"snapshot {snapshot_id}: {summary['counters']:,} counters, "
            f"{summary['dedupe_entries']:,} dedupe entries, fences {fold.fences}"
        )

"""A replay generation, step by step: start (or attach to) its worker, watch it catch up,
compare it, cut over to it.

The worker is whatever runs ``spendbus aggregator run --generation <name>`` for it
(``ReplayWorker``: the CLI passes a child process); this module decides when to start,
seed, wait, compare and switch. Design: docs/replay.md.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from aggregator.config import AggregatorConfig
from aggregator.counting.fold import CounterState
from aggregator.counting.reference import Reference
from aggregator.replay.checks import (
    clickhouse_after_fences,
    clickhouse_differences,
    compare_with_history,
    counter_view,
    in_flight,
)
from aggregator.replay.errors import ReplayError
from aggregator.replay.generations import (
    CounterView,
    Difference,
    GroupProgress,
    current_generation,
    fold_views,
    group_members,
    group_progress,
    prepare_store,
    publish_switch,
    read_switch,
    switch_to,
    verdict_views,
)
from aggregator.replay.report import (
    ReplayReport,
    fill_totals,
    org_changes,
    priced_org_spend,
)
from aggregator.replay.seeding import SeedResult, seed_generation
from aggregator.replay.snapshots import (
    FoldState,
    fold_ledger,
    incomplete_snapshots,
    ledger_ends,
    load_reference,
    snapshot_from_records,
)
from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess
from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.replication import FOLLOW_CLUSTER, ReplicationPolicy
from runtime.topic_reader import read_latest_values
from schemas.errors import ConfigError
from schemas.topics import Topics, check_generation

#: called with (events done, events to do, lag)
ProgressCallback = Callable[[int, int, int], None]


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
    #: the replication of the generation's new topics (runtime/replication.py)
    replication: ReplicationPolicy = FOLLOW_CLUSTER


class ReplayWorker(Protocol):
    """The generation's aggregator worker as a replay drives it (a child process in the CLI)."""

    name: str
    run_dir: Path
    env: dict[str, str]
    web_port: int

    @property
    def log_file(self) -> Path: ...

    def pid(self) -> int | None: ...

    def start(self, timeout: float = ...) -> int: ...

    def stop(self, timeout: float = ..., sig: int = ...) -> None: ...

    def log_tail(self, lines: int = ...) -> str: ...

    def get(self, path: str, timeout: float = ...) -> Any: ...

    def post(self, path: str, body: Any, timeout: float = ...) -> Any: ...


class GenerationReplay:
    """One replay into ``generation``, step by step (the CLI and the tests drive it)."""

    def __init__(
        self,
        place: StackPlace,
        generation: str,
        worker: ReplayWorker,
        create_topics: Callable[[Topics], Coroutine[Any, Any, object]],
        *,
        from_snapshot: bool = False,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.place = place
        self.from_snapshot = from_snapshot
        #: the snapshot the worker was seeded from (id, state as read) and what was written
        self.snapshot: tuple[str, FoldState] | None = None
        self.seeded: SeedResult | None = None
        self.generation = check_generation(generation)
        if not generation:
            raise ConfigError("a replay builds a new generation: give it a name (e.g. g2)")
        self.previous = ""
        self.topics = place.topics.of_generation(generation)
        #: runs `spendbus aggregator run --generation <generation>` (see ReplayWorker)
        self.worker = worker
        #: creates the generation's missing topics (the stack's admin client does, in the CLI)
        self.create_topics = create_topics
        #: what an operator should know while a step waits (the CLI prints it)
        self.on_notice = on_notice
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
        asyncio.run(self.create_topics(self.topics))
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
        offsets (``aggregator.replay.seeding.seed_generation``) before its worker starts."""
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
        fill_totals(report, fold)
        if self.snapshot is not None and self.seeded is not None:
            report.from_snapshot = self.snapshot[0]
            report.seeded = asdict(self.seeded)
        previous_topics = place.topics.of_generation(self.previous)
        before = asyncio.run(
            priced_org_spend(place.bootstrap, previous_topics, ends, security=place.security)
        )
        report.org_changes = org_changes(before, fold.org_spend())
        self._compare_clickhouse(report, reference, fold, ends, settle_seconds)
        self._compare_verdicts(report, reference, fold, previous_topics, ends, settle_seconds)
        return report

    def _compare_clickhouse(
        self,
        report: ReplayReport,
        reference: Reference,
        fold: FoldState,
        ends: dict[int, int],
        settle_seconds: float,
    ) -> None:
        """The generation's ClickHouse rows against the fold at the cut, as far as its start
        lets them be rebuilt."""
        if not self.place.dsn:
            report.clickhouse_scope = "not compared: the generation runs without a ClickHouse sink"
        elif self.snapshot is not None:
            report.vs_clickhouse = clickhouse_after_fences(
                self._sql, fold, self.snapshot[1], ends, settle_seconds
            )
            report.clickhouse_scope = (
                "only the rows after the snapshot's fences (events and spend per org): a "
                "snapshot start does not rebuild the rows before them, so counters are not "
                "recomputed from ClickHouse"
            )
        else:
            report.vs_clickhouse = clickhouse_differences(
                self._sql, reference, fold, ends, settle_seconds
            )
            report.clickhouse_scope = (
                "counters recomputed from every usage_events row below the cut"
            )

    def _compare_verdicts(
        self,
        report: ReplayReport,
        reference: Reference,
        fold: FoldState,
        previous_topics: Topics,
        cut: dict[int, int],
        settle_seconds: float,
    ) -> None:
        """Verdicts keep moving under live traffic: each is compared with the state the
        fold showed at the verdict's own seq. From the cut on, the fold goes record by
        record and keeps every state each counter passes through."""
        place = self.place
        history: dict[str, dict[int, CounterView]] = {}
        for key, (view, seq) in fold_views(fold).items():
            history[key] = {seq: view}

        def remember(key: str, data: dict[str, Any]) -> None:
            counter = CounterState.from_json(data)
            if counter.period:
                history.setdefault(key, {})[counter.seq] = counter_view(counter)

        deadline = time.monotonic() + settle_seconds
        previous_done = False
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
            # the previous generation has applied everything below the cut: a verdict of its
            # behind the fold's state at the cut is where it stays (it counted otherwise: a
            # price or budget changed since), not in flight; waiting for it took the whole
            # settle time, a minute for a 24-event ledger (issue 35)
            previous_done = previous_done or asyncio.run(
                group_progress(place.bootstrap, previous_topics, security=place.security)
            ).past(cut)
            pending = in_flight(vs_ledger, vs_previous, previous_done=previous_done)
            if not pending or time.monotonic() > deadline:
                report.vs_ledger = vs_ledger
                # old -> new: what the previous generation shows, against the rebuild
                report.vs_previous = [
                    Difference(d.counter_key, d.field, d.found, d.expected) for d in vs_previous
                ]
                return
            time.sleep(0.5)

    def _sql(self, query: str) -> dict[str, Any]:
        """One query on the new generation's store, through its worker's /sql page."""
        answer: dict[str, Any] = self.worker.post("/sql", {"sql": query})
        return answer

    # --- 4. cut over --------------------------------------------------------------------------
    def cutover(self, serving: ReplayWorker | None, *, timeout: float = 600.0) -> None:
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
            if not warned and self.on_notice is not None:
                self.on_notice(
                    f"waiting for the workers of the old generation (group {group}) to stop"
                )
                warned = True
            if time.monotonic() > deadline:
                raise ReplayError(f"the old generation's workers (group {group}) still run")
            time.sleep(1.0)

    def stop(self) -> None:
        self.worker.stop()


async def next_generation(place: StackPlace) -> str:
    """The name after the current generation's: g<N+1> (g2 after the default one)."""
    current = await current_generation(place.bootstrap, place.topics, security=place.security)
    number = int(current[1:]) + 1 if current.startswith("g") and current[1:].isdigit() else 2
    return f"g{number}"

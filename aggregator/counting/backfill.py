"""A budget counts its current period from its first moment (issue 35).

A budget applied (or first seen by a partition) mid-period must count the events of that
period that came before it: a daily cap applied at noon that forgot the morning is not the
cap the admin typed. The counting stage re-reads each owned ``usage.raw`` partition from
where the budget's current period begins and folds the records again through the same
fold. That re-read is exactly a re-delivery: the dedupe entries say "same position", the
counters that already hold those records skip them by their fences, and only the counters
that never saw them (the new budget's) take them. So the result is the same fold, exact,
whatever else the partition counts. A re-read record whose event occurred before the
earliest current period of the budgets being read for is not folded again: it belongs to a
period those budgets never had. The re-read writes no priced record or dead letter: each
was written when the record was first read.

Which budgets a partition has counted from their period's start is kept in the partition's
dedupe state, written with the checkpoint like any dedupe entry (so it follows the
partition and survives a restart): ``MARKER_PREFIX + budget_id`` -> the budget's counting
fingerprint, written when the re-read reaches the position the stage had when the budget
arrived. A partition that has no such entries at all (a new partition, or one counted by a
version without this rule) takes the budgets it finds as counted, without a re-read.

A change of a budget that does not change what it counts (its limits, alerts, action,
rate) needs no re-read; a change of what it counts (scope, match, window, calendar,
count_denied) keeps the counters as they are and counts by the new definition from the
next event on (their fences hold the records already read), and the marker takes the new
fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from aiokafka import AIOKafkaConsumer, TopicPartition

from aggregator.counting.decode import read_usage_event
from schemas.budgets import Budget
from schemas.errors import ContractError
from schemas.periods import from_micros, period_start, to_micros

#: dedupe-state key of a budget a partition counts from its period's start
MARKER_PREFIX: Final = "\x00budget\x00"
#: dedupe-state key saying the partition keeps markers (absent: take the budgets as counted)
MARKERS_KEPT: Final = "\x00budgets\x00"
#: a removed budget's marker (pruning.py): read as none, so a budget defined again is
#: counted again from its period's start
PRUNED_MARKER: Final = "pruned"

#: reads a dedupe-state value of a partition: (partition, key) -> value or None
SeenReader = Callable[[int, str], str | None]


def period_begins_us(budget: Budget, now_us: int) -> int:
    """When the budget's current period began (µs): a calendar period's start, a rolling
    window's oldest moment, the epoch for a total window (every event counts)."""
    window = budget.window
    if window.kind == "rolling":
        return max(0, now_us - window.rolling_us)
    start = period_start(window, from_micros(now_us))
    return 0 if start is None else to_micros(start)


@dataclass
class PartitionBackfill:
    """One partition's re-read: the records below ``until`` are folded again for ``budgets``."""

    #: the offset the stage had folded to when the re-read began (the first one not re-read)
    until: int
    #: budget id -> counting fingerprint, written as markers once the re-read reaches ``until``
    budgets: dict[str, str] = field(default_factory=dict)
    #: when the earliest current period of those budgets began (µs): a re-read record of an
    #: event before it is not folded again (it belongs to a period the budgets never had)
    counts_from_us: int = 0


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """What a partition needs now: markers to write at once, and budgets to re-read for."""

    partition: int
    #: budget id -> fingerprint: counted as they are (a new partition, a changed definition)
    mark_now: dict[str, str]
    #: budget id -> fingerprint: new to this partition, counted again from their period start
    reread: dict[str, str]
    #: the re-read begins at records written from this time (µs): ``counts_from_us`` less
    #: the skew an event's time may have ahead of its record's
    from_us: int
    #: the re-read folds the events that occurred from this time (µs)
    counts_from_us: int


class Backfills:
    """The re-reads in progress, per owned partition, and the reference version they saw."""

    def __init__(self, max_future_skew_us: int) -> None:
        self.max_future_skew_us = max_future_skew_us
        self.active: dict[int, PartitionBackfill] = {}
        #: (output epoch, partition, budgets): re-reads done, their outputs not yet delivered
        self.settling: list[tuple[int, int, dict[str, str]]] = []
        #: budget id -> counting fingerprint of every budget of the last plan
        self.counted: dict[str, str] = {}
        #: (reference version, owned partitions) last planned for
        self._planned: tuple[int, frozenset[int]] | None = None

    def due(self, reference_version: int, owned: Iterable[int]) -> bool:
        """The budgets or the owned partitions changed since the last plan."""
        return self._planned != (reference_version, frozenset(owned))

    def replan(self) -> None:
        """The last plan could not be carried out: make it again at the next look."""
        self._planned = None

    def plan(
        self,
        reference_version: int,
        budgets: Iterable[Budget],
        owned: Iterable[int],
        seen: SeenReader,
        now_us: int,
    ) -> list[BackfillPlan]:
        owned = frozenset(owned)
        self._planned = (reference_version, owned)
        for gone in set(self.active) - owned:
            del self.active[gone]
        fingerprints = {b.budget_id: (b, b.counting_fingerprint) for b in budgets}
        self.counted = {budget_id: fp for budget_id, (_, fp) in fingerprints.items()}
        plans = []
        for partition in sorted(owned):
            kept = seen(partition, MARKERS_KEPT) is not None
            running = self.active.get(partition)
            mark_now: dict[str, str] = {}
            reread: dict[str, str] = {}
            from_us = now_us
            for budget_id, (budget, fingerprint) in fingerprints.items():
                if running is not None and running.budgets.get(budget_id) == fingerprint:
                    continue  # its re-read is under way
                marked = seen(partition, MARKER_PREFIX + budget_id)
                if marked == PRUNED_MARKER:
                    marked = None
                if marked == fingerprint:
                    continue
                if not kept or marked is not None:
                    mark_now[budget_id] = fingerprint
                else:
                    reread[budget_id] = fingerprint
                    from_us = min(from_us, period_begins_us(budget, now_us))
            if not kept:
                mark_now[""] = "kept"  # written as MARKERS_KEPT
            if mark_now or reread:
                plans.append(
                    BackfillPlan(
                        partition,
                        mark_now,
                        reread,
                        max(0, from_us - self.max_future_skew_us),
                        from_us,
                    )
                )
        return plans

    def begin(self, plan: BackfillPlan, until: int) -> None:
        """The re-read of ``plan`` starts; the records below ``until`` are its."""
        running = self.active.get(plan.partition)
        if running is None:
            self.active[plan.partition] = PartitionBackfill(
                until, dict(plan.reread), plan.counts_from_us
            )
        else:
            running.until = max(running.until, until)
            running.budgets.update(plan.reread)
            running.counts_from_us = min(running.counts_from_us, plan.counts_from_us)

    def rereads(self, partition: int, offset: int) -> bool:
        """The record at ``offset`` was folded before: this fold of it is a re-read."""
        running = self.active.get(partition)
        return running is not None and offset < running.until

    def counts_again(self, partition: int, value: bytes | None) -> bool:
        """A re-read record is folded again when its event occurred in the current period
        of a budget being read for (an undecodable one was dead-lettered when first read)."""
        try:
            _, occurred_us = read_usage_event(value)
        except ContractError:
            return False
        return occurred_us >= self.active[partition].counts_from_us

    def finished(self, folded_to: dict[int, int], epoch: int) -> list[tuple[int, dict[str, str]]]:
        """The partitions whose re-read reached its end: (partition, markers to write).
        Their budgets count as loaded once the checkpoint of output ``epoch`` (which holds
        the markers and the verdicts the re-read changed) is delivered: ``settled``."""
        done = [
            (partition, running.budgets)
            for partition, running in self.active.items()
            if folded_to.get(partition, -1) >= running.until
        ]
        for partition, budgets in done:
            del self.active[partition]
            self.settling.append((epoch, partition, budgets))
        return done

    def settled(self, epoch: int) -> None:
        """Every output of ``epoch`` and before reached the broker."""
        self.settling = [s for s in self.settling if s[0] > epoch]

    def counting(self) -> dict[str, str]:
        """Budget id -> fingerprint of each budget every owned partition counts from its
        period's start (what `budgets apply` waits for on /stats)."""
        loading = self.loading()
        return {b: fp for b, fp in self.counted.items() if b not in loading}

    def loading(self) -> dict[str, list[int]]:
        """Budget id -> the partitions still re-reading for it, or whose re-read's outputs
        are not delivered yet (what /stats shows)."""
        out: dict[str, list[int]] = {}
        reading = [(p, running.budgets) for p, running in self.active.items()]
        delivering = [(p, budgets) for _, p, budgets in self.settling]
        for partition, budgets in sorted(reading + delivering):
            for budget_id in budgets:
                out.setdefault(budget_id, []).append(partition)
        return out


def marker_entries(markers: dict[str, str]) -> list[tuple[str, str]]:
    """The dedupe-state entries of ``markers`` (``""`` names MARKERS_KEPT)."""
    return [
        (MARKERS_KEPT if budget_id == "" else MARKER_PREFIX + budget_id, value)
        for budget_id, value in markers.items()
    ]


async def seek_rereads(
    consumer: AIOKafkaConsumer,
    topic: str,
    plans: list[BackfillPlan],
    backfills: Backfills,
    folded_to: dict[int, int],
    write_markers: Callable[[int, dict[str, str]], None],
) -> list[int]:
    """Start the re-reads ``plans`` ask for: each partition's consumer position goes back
    to its first record written since ``from_us`` (Kafka's time index), and the records up
    to where the stage had folded are folded again. Markers that need no re-read are
    written at once. Returns the partitions sought back."""
    wanted = {TopicPartition(topic, p.partition): p.from_us // 1000 for p in plans if p.reread}
    found = await consumer.offsets_for_times(wanted) if wanted else {}
    sought = []
    for plan in plans:
        if plan.mark_now:
            write_markers(plan.partition, plan.mark_now)
        if not plan.reread:
            continue
        tp = TopicPartition(topic, plan.partition)
        position = folded_to.get(plan.partition)
        if position is None:
            position = await consumer.position(tp)
        first = found.get(tp)
        if first is None or first.offset >= position:
            write_markers(plan.partition, plan.reread)  # nothing of their period came before
            continue
        backfills.begin(plan, position)
        folded_to[plan.partition] = first.offset
        consumer.seek(tp, first.offset)
        sought.append(plan.partition)
    return sought

"""What a replay found: the report of a generation rebuilt from the ledger (or of a dry run).

Totals of the fold, the differences against the ledger, the previous generation and the
generation's own ClickHouse rows, and the spend per org that changed. Design: docs/replay.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from aggregator.replay.generations import Difference, topic_values
from aggregator.replay.snapshots import FoldState
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.codec import PRICED_USAGE
from schemas.errors import ContractError
from schemas.topics import Topics


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


def fill_totals(report: ReplayReport, fold: FoldState) -> None:
    """The fold's totals and its counters' digest into ``report``."""
    report.records = fold.stats.events
    report.charged = fold.stats.charged
    report.duplicates = fold.stats.duplicates
    report.dead_letters = fold.stats.dead_letters
    report.cost_nanos = fold.stats.cost_nanos
    report.counters = len(fold.counters)
    report.counters_sha256 = hashlib.sha256(fold.canonical()).hexdigest()


def org_changes(before: dict[str, int], after: dict[str, int]) -> list[OrgChange]:
    """The orgs whose spend differs between two generations' pricing."""
    return [
        OrgChange(org, before.get(org, 0), after.get(org, 0))
        for org in sorted(set(before) | set(after))
        if before.get(org, 0) != after.get(org, 0)
    ]


async def priced_org_spend(
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

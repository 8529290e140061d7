"""Topic names, keys, cleanup policies and partitioning: the one place they are defined.

Every name can carry a prefix (``Topics(prefix="t42.")``) so tests and
parallel stacks get their own set on one cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: compacted topics roll segments often so the active segment does not hide
#: superseded values from the cleaner for long (enforcers read them from the start)
COMPACTED_CONFIG: Final = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "min.compaction.lag.ms": "0",
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "86400000",
}
LEDGER_CONFIG: Final = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
DELETE_CONFIG: Final = {"cleanup.policy": "delete"}
DEFAULT_PARTITIONS: Final = 4


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    key: str
    value: str
    config: dict[str, str]
    #: keyed by org_id: partition counts of the data topics must stay as created
    #: (re-partitioning would move an org's counters), so they are set once here
    partitions: int


@dataclass(frozen=True, slots=True)
class Topics:
    """The names of every topic, optionally prefixed."""

    prefix: str = ""

    @property
    def usage_raw(self) -> str:
        return f"{self.prefix}usage.raw"

    @property
    def usage_priced(self) -> str:
        return f"{self.prefix}usage.priced"

    @property
    def usage_dlq(self) -> str:
        return f"{self.prefix}usage.dlq"

    @property
    def budget_policies(self) -> str:
        return f"{self.prefix}budget.policies"

    @property
    def pricing(self) -> str:
        return f"{self.prefix}pricing"

    @property
    def budget_verdicts(self) -> str:
        return f"{self.prefix}budget.verdicts"

    @property
    def budget_alerts(self) -> str:
        return f"{self.prefix}budget.alerts"

    def specs(self, partitions: int = DEFAULT_PARTITIONS) -> list[TopicSpec]:
        return [
            TopicSpec(self.usage_raw, "org_id", "UsageEvent", LEDGER_CONFIG, partitions),
            TopicSpec(self.usage_priced, "org_id", "PricedUsage", DELETE_CONFIG, partitions),
            TopicSpec(self.usage_dlq, "org_id|null", "DeadLetter", DELETE_CONFIG, 1),
            TopicSpec(self.budget_policies, "budget_id", "BudgetPolicy", COMPACTED_CONFIG, 1),
            TopicSpec(self.pricing, "version", "PriceTable", COMPACTED_CONFIG, 1),
            TopicSpec(self.budget_verdicts, "counter_key", "Verdict", COMPACTED_CONFIG, partitions),
            TopicSpec(self.budget_alerts, "counter_key", "Alert", DELETE_CONFIG, 1),
        ]

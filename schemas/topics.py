"""Topic names, keys, cleanup policies and partitioning: the one place they are defined.

Every name can carry a prefix (``Topics(prefix="t42.")``) so tests and
parallel stacks get their own set on one cluster.

Generations (``Topics(prefix, generation="g2")``, docs/replay.md): the ledger
and the reference topics (usage.raw, budget.policies, pricing, usage.dlq), the
shared alert topic, the generation control topic and the counter snapshots are
shared by every generation; what the aggregator derives from the ledger
(usage.priced, budget.verdicts, its alert staging topic, its consumer group and
table namespace) is per generation. The default generation (``""``) keeps the
original names, so a stack that never replayed sees no change.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

from schemas.errors import ConfigError
from schemas.ids import canonical_id

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
#: seconds an Idempotency-Key's answer is kept for a retry (Stripe's 24 h); a retry later
#: than that is a new request
IDEMPOTENCY_LIFETIME_S: Final = 24 * 3600
#: compacted (one answer per key) and deleted past twice the lifetime, so the topic stays
#: bounded even if no server ever reads an expired answer again
IDEMPOTENCY_CONFIG: Final = {
    **COMPACTED_CONFIG,
    "cleanup.policy": "compact,delete",
    "retention.ms": str(2 * IDEMPOTENCY_LIFETIME_S * 1000),
}
DEFAULT_PARTITIONS: Final = 4
#: a generation name: short, lower case, usable in topic, group and database names
GENERATION_PATTERN: Final = re.compile(r"[a-z][a-z0-9]{0,15}")
#: the one key of the control topic: its live value names the current generation
CONTROL_KEY: Final = b"current"
#: usage.priced record header: the source position of the priced event and the month its
#: occurred_at falls in (``STORE_ROW``: big-endian int32 source_partition, int64
#: source_offset, int32 YYYYMM in UTC; 16 bytes, one struct unpack). The counting stage
#: sets it on every record it writes, and writes the event's scope ids canonical
#: (schemas.ids.with_canonical_ids): the body is the usage_events row as it is stored, and
#: the sink fences and inserts it without decoding it (aggregator/sink/README.md). A record
#: without it (written before it existed) is decoded and its ids canonicalised.
STORE_ROW_HEADER: Final = "spendbus-store-row"
STORE_ROW: Final = struct.Struct(">iqi")
#: the dead-letter reason of a usage.raw record whose key is not ``usage_raw_key`` of its
#: event: dedupe, fences and counters are per partition, so a record keyed otherwise lands
#: beside other orgs' state and would count in a second copy of its org's counters
WRONG_KEY: Final = "wrong_key"


def usage_raw_key(org_id: str) -> bytes:
    """The key of a usage.raw record: the UTF-8 of its event's canonical ``org_id``, so
    Kafka's default partitioner (murmur2 of the key) puts every event of an org in one
    partition, whichever client wrote it."""
    return canonical_id(org_id, "org_id").encode("utf-8")


def store_row_value(source_partition: int, source_offset: int, month: int) -> bytes:
    """The STORE_ROW_HEADER value of a priced record (``month`` is YYYYMM)."""
    return STORE_ROW.pack(source_partition, source_offset, month)


def parse_store_row(value: bytes) -> tuple[int, int, int] | None:
    """(source_partition, source_offset, YYYYMM) of a STORE_ROW_HEADER value; None when it
    is not one (the record is then decoded like one without the header)."""
    if len(value) != STORE_ROW.size:
        return None
    partition, offset, month = STORE_ROW.unpack(value)
    if partition < 0 or offset < 0 or not 100_001 <= month <= 999_912:
        return None
    return partition, offset, month


def check_generation(name: str) -> str:
    """``name`` if it is a valid generation name ('' = the default generation)."""
    if name and not GENERATION_PATTERN.fullmatch(name):
        raise ConfigError(
            f"generation {name!r}: expected 1-16 lower-case letters and digits, "
            "starting with a letter (e.g. g2)"
        )
    return name


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
    """The names of every topic, optionally prefixed, for one generation ('' = default)."""

    prefix: str = ""
    generation: str = ""

    def __post_init__(self) -> None:
        check_generation(self.generation)

    def _derived(self, name: str) -> str:
        """A topic the aggregator derives from the ledger: one per generation."""
        return (
            f"{self.prefix}{name}.{self.generation}" if self.generation else f"{self.prefix}{name}"
        )

    def of_generation(self, generation: str) -> Topics:
        return Topics(self.prefix, generation)

    @property
    def usage_raw(self) -> str:
        return f"{self.prefix}usage.raw"

    @property
    def usage_priced(self) -> str:
        return self._derived("usage.priced")

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
        return self._derived("budget.verdicts")

    @property
    def budget_alerts(self) -> str:
        """Where this generation's aggregator writes alerts: the shared topic for the
        default generation, a staging topic otherwise (relayed into ``shared_alerts``
        once the generation is current and its predecessor retired: docs/replay.md)."""
        return self._derived("budget.alerts")

    @property
    def shared_alerts(self) -> str:
        """The alert topic people and pagers read: one for every generation."""
        return f"{self.prefix}budget.alerts"

    @property
    def budget_raises(self) -> str:
        """Compacted: temporary raises of budget limits by raise id (schemas/raises.py); a
        revocation rewrites its record, so every raise stays on the topic."""
        return f"{self.prefix}budget.raises"

    @property
    def budget_approvals(self) -> str:
        """Kept forever (the audit trail): each job's approval requests and the operators'
        decisions on them, keyed by the job's opaque key (schemas/jobs.py, seed 001)."""
        return f"{self.prefix}budget.approvals"

    @property
    def notify_deliveries(self) -> str:
        """Compacted: what ``spendbus notify`` delivered, key (webhook id, alert_id), and where
        each webhook started (key (webhook id,)): read back whole at each start (notify/)."""
        return f"{self.prefix}notify.deliveries"

    @property
    def generations(self) -> str:
        """Compacted control topic: key ``current`` names the generation enforcers follow."""
        return f"{self.prefix}spendbus.generations"

    @property
    def counter_snapshots(self) -> str:
        """Compacted: counter snapshots with their ledger offset fences (replay starts there)."""
        return f"{self.prefix}counters.snapshots"

    @property
    def gateway_keys(self) -> str:
        """Compacted: the gateways' virtual keys, keyed ``hmac-sha256:<hex>`` (HMAC-SHA256 under
        the server-side key secret; never the key), legacy records by plain SHA-256 hex; null
        revokes."""
        return f"{self.prefix}gateway.keys"

    @property
    def admin_audit(self) -> str:
        """Append-only, kept forever: every change the admin API made (who, what before and
        after, when, from where), JSON keyed by its audit id (admin/README.md)."""
        return f"{self.prefix}admin.audit"

    @property
    def admin_idempotency(self) -> str:
        """Compacted, kept ``IDEMPOTENCY_LIFETIME_S``: the admin API's answers to POSTs sent
        with an Idempotency-Key, keyed by (token id, route and key digest), AES-GCM
        encrypted (an answer can hold a new virtual key; admin/README.md)."""
        return f"{self.prefix}admin.idempotency"

    @property
    def enforcer_group(self) -> str:
        """The consumer group every enforcer joins to count the replicas sharing the budgets
        (enforcer/membership.py; shared by every generation, nothing is committed)."""
        return f"{self.prefix}spendbus-enforcers"

    @property
    def aggregator_app_id(self) -> str:
        """The aggregator's Faust app id: its consumer group and table/changelog namespace."""
        base = f"{self.prefix}spendbus-aggregator"
        return f"{base}-{self.generation}" if self.generation else base

    def specs(self, partitions: int = DEFAULT_PARTITIONS) -> list[TopicSpec]:
        return [
            TopicSpec(self.usage_raw, "org_id", "UsageEvent", LEDGER_CONFIG, partitions),
            TopicSpec(self.usage_priced, "org_id", "PricedUsage", DELETE_CONFIG, partitions),
            TopicSpec(self.usage_dlq, "org_id|null", "DeadLetter", DELETE_CONFIG, 1),
            TopicSpec(self.budget_policies, "budget_id", "BudgetPolicy", COMPACTED_CONFIG, 1),
            TopicSpec(self.pricing, "version", "PriceTable", COMPACTED_CONFIG, 1),
            TopicSpec(self.budget_verdicts, "counter_key", "Verdict", COMPACTED_CONFIG, partitions),
            TopicSpec(self.shared_alerts, "counter_key", "Alert", DELETE_CONFIG, 1),
            TopicSpec(self.generations, "current", "GenerationSwitch", COMPACTED_CONFIG, 1),
            TopicSpec(self.gateway_keys, "key_digest", "VirtualKey", COMPACTED_CONFIG, 1),
            TopicSpec(self.budget_raises, "raise_id", "BudgetRaise", COMPACTED_CONFIG, 1),
            TopicSpec(self.budget_approvals, "job_key", "JobApproval", LEDGER_CONFIG, 1),
            TopicSpec(self.notify_deliveries, "webhook|alert_id", "JSON", COMPACTED_CONFIG, 1),
            TopicSpec(self.admin_audit, "audit_id", "JSON", LEDGER_CONFIG, 1),
            TopicSpec(
                self.admin_idempotency, "token_id|answer_digest", "AES-GCM", IDEMPOTENCY_CONFIG, 1
            ),
            TopicSpec(
                self.counter_snapshots, "snapshot|partition|counter", "JSON", COMPACTED_CONFIG, 1
            ),
        ] + (
            [TopicSpec(self.budget_alerts, "counter_key", "Alert", DELETE_CONFIG, 1)]
            if self.generation
            else []
        )

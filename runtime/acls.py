"""Least privilege: the Kafka ACL bindings each role of spendbus needs, and nothing more.

A role is what one kind of process does on the cluster (docs/security.md has the table):

- ``gateway``: the reference gateway, a proxy embedding ingest's publisher, or
  ``spendbus ingest``: writes usage.raw; follows the verdicts (every generation), budgets,
  prices and the generation switch for its enforcer, and the virtual keys.
- ``sidecar``: ``spendbus enforcer serve``: the same reads without the keys; writes its
  refusal events to usage.raw.
- ``aggregator``: ``spendbus aggregator run``: reads usage.raw, the reference topics and
  admin.audit (copied into the store), writes what it derives (usage.priced,
  budget.verdicts, alerts, dead letters), owns the topics and consumer groups named after
  its app id (changelogs, Faust's own topics).
- ``operator``: the CLI of a person running the stack (``up``, ``prices``/``budgets``/
  ``keys apply``, ``status``, ``dlq``, ``verify``, ``replay``, ``snapshot``): every topic of
  the stack and its groups, and the cluster's description.

Topics come from :class:`schemas.topics.Topics` (with its prefix). A topic derived per
generation (``usage.priced``, ``budget.verdicts``, ``budget.alerts``) and the app id's
namespace are PREFIXED patterns, so a replay generation (``budget.verdicts.g2``,
``spendbus-aggregator-g2``) needs no new binding. No role uses transactions (the pipeline is
at-least-once with offset fences), so no transactional id is granted; an idempotent
producer needs only WRITE on its topic (Kafka 3.0+).

Codes are Kafka's own (AclOperation, ResourceType, PatternType, AclPermissionType), as the
CreateAcls request carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from schemas.errors import ConfigError
from schemas.topics import Topics


class ResourceType(IntEnum):
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4


class PatternType(IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11


#: AclPermissionType ALLOW: every binding spendbus makes allows (deny is the cluster's default)
ALLOW: Final = 3
#: the resource name of the cluster resource
CLUSTER_NAME: Final = "kafka-cluster"

ROLES: Final = ("gateway", "sidecar", "aggregator", "notifier", "operator")

_READ = (Operation.READ, Operation.DESCRIBE)
_WRITE = (Operation.WRITE, Operation.DESCRIBE)


@dataclass(frozen=True, order=True)
class AclBinding:
    """One allowed operation of one principal on one resource (pattern), from any host."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    principal: str
    host: str = "*"

    def describe(self) -> str:
        pattern = "" if self.pattern_type == PatternType.LITERAL else " (prefixed)"
        return (
            f"ALLOW {self.principal} {self.operation.name} on "
            f"{self.resource_type.name} {self.resource_name}{pattern} from {self.host}"
        )


def _on(
    kind: ResourceType, name: str, ops: tuple[Operation, ...], pattern: PatternType
) -> list[tuple[ResourceType, str, PatternType, Operation]]:
    return [(kind, name, pattern, op) for op in ops]


def _topic(name: str, *ops: Operation) -> list[tuple[ResourceType, str, PatternType, Operation]]:
    return _on(ResourceType.TOPIC, name, ops, PatternType.LITERAL)


def _topics_from(
    prefix: str, *ops: Operation
) -> list[tuple[ResourceType, str, PatternType, Operation]]:
    return _on(ResourceType.TOPIC, prefix, ops, PatternType.PREFIXED)


def _enforcer_reads(
    topics: Topics,
) -> list[tuple[ResourceType, str, PatternType, Operation]]:
    """What an enforcer follows: every generation's verdicts, budgets, prices, the switch."""
    return [
        *_topics_from(topics.of_generation("").budget_verdicts, *_READ),
        *_topic(topics.budget_policies, *_READ),
        *_topic(topics.pricing, *_READ),
        *_topic(topics.generations, *_READ),
        *_topic(topics.budget_raises, *_READ),
        # a policy's approvals: read back, and its requests written (enforcer/policy.py)
        *_topic(topics.budget_approvals, Operation.READ, *_WRITE),
    ]


def _enforcer_group(topics: Topics) -> list[tuple[ResourceType, str, PatternType, Operation]]:
    """The enforcers' consumer group (``membership``: the replicas count themselves in it)."""
    return _on(ResourceType.GROUP, topics.enforcer_group, _READ, PatternType.LITERAL)


def role_bindings(
    role: str, principal: str, topics: Topics, *, app_id: str | None = None
) -> list[AclBinding]:
    """The bindings ``principal`` needs to act as ``role`` on the stack named by ``topics``
    (its prefix; any generation). ``app_id`` is the aggregator's base app id (default
    ``Topics.aggregator_app_id`` of the default generation)."""
    if not principal or ":" not in principal:
        raise ConfigError(f"principal {principal!r}: expected TYPE:NAME, e.g. User:gateway")
    base = topics.of_generation("")
    app = app_id or base.aggregator_app_id
    entries: list[tuple[ResourceType, str, PatternType, Operation]]
    if role == "gateway":
        entries = [
            *_topic(base.usage_raw, *_WRITE),
            *_enforcer_reads(base),
            *_enforcer_group(base),
            *_topic(base.gateway_keys, *_READ),
        ]
    elif role == "sidecar":
        entries = [*_topic(base.usage_raw, *_WRITE), *_enforcer_reads(base), *_enforcer_group(base)]
    elif role == "aggregator":
        entries = [
            *_topic(base.usage_raw, *_READ),
            *_topic(base.budget_policies, *_READ),
            *_topic(base.pricing, *_READ),
            *_topic(base.generations, *_READ),
            *_topic(base.budget_raises, *_READ),
            # the sink copies the admin API's audit trail into admin_audit (no group)
            *_topic(base.admin_audit, *_READ),
            *_topic(base.usage_dlq, *_WRITE),
            # derived per generation; Faust declares (CREATE) the topics its agents use and
            # the sink reads usage.priced back; a replay generation's alert relay reads its
            # staging topic and the shared one
            *_topics_from(base.usage_priced, Operation.CREATE, Operation.READ, *_WRITE),
            *_topics_from(base.budget_verdicts, Operation.CREATE, Operation.READ, *_WRITE),
            *_topics_from(base.shared_alerts, Operation.READ, *_WRITE),
            # its own namespace: changelogs, Faust's assignor topics
            *_topics_from(
                app,
                Operation.CREATE,
                Operation.READ,
                Operation.WRITE,
                Operation.DESCRIBE,
                Operation.DESCRIBE_CONFIGS,
            ),
            # the counting group, the sink's group, the alert relay's group
            *_on(ResourceType.GROUP, app, _READ, PatternType.PREFIXED),
        ]
    elif role == "notifier":
        entries = [
            *_topic(base.shared_alerts, *_READ),
            *_topic(base.budget_policies, *_READ),
            *_topic(base.notify_deliveries, Operation.READ, *_WRITE),
        ]
    elif role == "operator":
        shared = [
            base.usage_raw,
            base.usage_dlq,
            base.budget_policies,
            base.pricing,
            base.generations,
            base.counter_snapshots,
            base.gateway_keys,
            base.notify_deliveries,
            base.budget_raises,
            base.budget_approvals,
            base.admin_audit,
            base.admin_idempotency,
        ]
        derived = [base.usage_priced, base.budget_verdicts, base.shared_alerts, app]
        entries = [
            *[e for name in shared for e in _topic(name, Operation.ALL)],
            *[e for name in derived for e in _topics_from(name, Operation.ALL)],
            *_on(ResourceType.GROUP, app, (Operation.ALL,), PatternType.PREFIXED),
            *_on(ResourceType.CLUSTER, CLUSTER_NAME, (Operation.DESCRIBE,), PatternType.LITERAL),
        ]
    else:
        raise ConfigError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    return sorted(
        {AclBinding(kind, name, pattern, op, principal) for kind, name, pattern, op in entries}
    )

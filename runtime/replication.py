"""How many replicas every topic gets: the one rule, used wherever a topic is created.

The ledger (usage.raw) is the one source of truth and the counters' changelogs are their
state: a partition with one replica is lost with one broker's disk. So a topic gets
``min(3, brokers)`` replicas and ``min.insync.replicas`` = RF - 1 from three replicas on
(else 1), so that with ``acks=all`` a write is on two brokers before it is acknowledged
and one broker may be down without stopping the writes.

Settings may raise or lower both (``SPENDBUS_REPLICATION_FACTOR``,
``SPENDBUS_MIN_INSYNC_REPLICAS``); fewer replicas than the cluster allows is refused
unless ``SPENDBUS_ALLOW_UNDER_REPLICATION`` says so explicitly, and is then logged at
every topic creation. :func:`replication_problems` compares existing topics with the plan
(``spendbus status`` reports them, ``spendbus topics fix-replication`` raises them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, ConfigDict, Field

from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.errors import ConfigError

log = logging.getLogger(__name__)

#: replicas a topic gets on a cluster of at least this many brokers
WANTED_REPLICAS: Final = 3
MIN_INSYNC_CONFIG: Final = "min.insync.replicas"


def default_min_insync(replication_factor: int) -> int:
    """RF - 1 from three replicas on (one broker may be down), else 1."""
    return replication_factor - 1 if replication_factor >= WANTED_REPLICAS else 1


class ReplicationPlan(BaseModel):
    """What a new topic gets on this cluster, resolved from a policy and a broker count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replication_factor: int = Field(ge=1)
    min_insync_replicas: int = Field(ge=1)
    #: the brokers the plan was made for (those the cluster listed)
    brokers: int = Field(ge=1)
    #: fewer replicas than the cluster allows, by an explicit override
    under_replicated: bool = False

    @property
    def topic_config(self) -> dict[str, str]:
        return {MIN_INSYNC_CONFIG: str(self.min_insync_replicas)}


class ReplicationPolicy(BaseModel):
    """The settings' part: None = follow the cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    #: allow a replication factor below min(3, brokers) (logged at each creation)
    allow_under_replication: bool = False

    def plan(self, brokers: int) -> ReplicationPlan:
        """The plan for a cluster of ``brokers``; ConfigError naming the setting when the
        settings ask for what the cluster cannot hold or for fewer replicas unannounced."""
        brokers = max(1, brokers)
        allowed = min(WANTED_REPLICAS, brokers)
        rf = self.replication_factor or allowed
        if rf > brokers:
            raise ConfigError(
                f"SPENDBUS_REPLICATION_FACTOR={rf} but the cluster lists {brokers} "
                f"broker{'s' if brokers != 1 else ''}: a topic cannot have more replicas"
            )
        under = rf < allowed
        if under and not self.allow_under_replication:
            raise ConfigError(
                f"SPENDBUS_REPLICATION_FACTOR={rf} is fewer replicas than this cluster of "
                f"{brokers} brokers allows ({allowed}): the ledger and the counters' "
                "changelogs would not survive a broker's disk. Set "
                "SPENDBUS_ALLOW_UNDER_REPLICATION=true to do it anyway"
            )
        min_isr = self.min_insync_replicas or default_min_insync(rf)
        if min_isr > rf:
            raise ConfigError(
                f"SPENDBUS_MIN_INSYNC_REPLICAS={min_isr} is more than the replication factor "
                f"{rf}: no write with acks=all could ever succeed"
            )
        return ReplicationPlan(
            replication_factor=rf,
            min_insync_replicas=min_isr,
            brokers=brokers,
            under_replicated=under,
        )


FOLLOW_CLUSTER: Final = ReplicationPolicy()


async def cluster_brokers(admin: AIOKafkaAdminClient) -> int:
    """How many brokers the cluster lists (the unfenced ones)."""
    described = await admin.describe_cluster()
    return len(described.get("brokers") or []) or 1


async def plan_for(
    admin: AIOKafkaAdminClient, policy: ReplicationPolicy, what: str
) -> ReplicationPlan:
    """The policy's plan on the admin's cluster; an override below the cluster's is logged."""
    plan = policy.plan(await cluster_brokers(admin))
    if plan.under_replicated:
        log.warning(
            "creating %s with %d replica(s) on a cluster of %d brokers "
            "(SPENDBUS_ALLOW_UNDER_REPLICATION): a broker's disk may lose them",
            what,
            plan.replication_factor,
            plan.brokers,
        )
    return plan


async def resolve_plan(
    bootstrap: str, policy: ReplicationPolicy, *, security: KafkaSecurity = PLAINTEXT
) -> ReplicationPlan:
    """:func:`plan_for` on a short-lived admin client of its own."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=30_000, **security.client_kwargs()
    )
    await admin.start()
    try:
        return policy.plan(await cluster_brokers(admin))
    finally:
        await admin.close()


class ReplicationProblem(BaseModel):
    """An existing topic with fewer replicas (or a lower min.insync.replicas) than the plan."""

    model_config = ConfigDict(frozen=True)

    topic: str
    #: the fewest replicas any of its partitions has
    replicas: int
    min_insync_replicas: int | None
    wanted_replicas: int
    wanted_min_insync: int

    def __str__(self) -> str:
        parts = []
        if self.replicas < self.wanted_replicas:
            parts.append(f"{self.replicas} replica(s), the cluster allows {self.wanted_replicas}")
        if (self.min_insync_replicas or 1) < self.wanted_min_insync:
            parts.append(
                f"min.insync.replicas={self.min_insync_replicas or 1}, "
                f"wanted {self.wanted_min_insync}"
            )
        return f"{self.topic}: {'; '.join(parts)}"


def replication_problems(
    replicas: Mapping[str, int], min_insync: Mapping[str, int | None], plan: ReplicationPlan
) -> list[ReplicationProblem]:
    """Topics (name -> fewest replicas of a partition; name -> min.insync.replicas) below
    the plan. An explicit under-replication override lowers the bar to what it asked for."""
    return [
        ReplicationProblem(
            topic=name,
            replicas=count,
            min_insync_replicas=min_insync.get(name),
            wanted_replicas=plan.replication_factor,
            wanted_min_insync=plan.min_insync_replicas,
        )
        for name, count in sorted(replicas.items())
        if count < plan.replication_factor or (min_insync.get(name) or 1) < plan.min_insync_replicas
    ]


def fewest_replicas(partitions: Iterable[Mapping[str, object]]) -> int:
    """The fewest replicas of any partition of a described topic (aiokafka's describe_topics)."""
    counts = [len(p.get("replicas") or ()) for p in partitions]  # type: ignore[arg-type]  # aiokafka's untyped describe: replicas is a list
    return min(counts) if counts else 0

"""Create every topic of the contract (schemas.topics) with its cleanup policy and the
replication the cluster allows (runtime.replication); find and raise topics below it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.protocol.admin import AlterPartitionReassignmentsRequest

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.replication import (
    FOLLOW_CLUSTER,
    MIN_INSYNC_CONFIG,
    ReplicationPlan,
    ReplicationPolicy,
    ReplicationProblem,
    cluster_brokers,
    fewest_replicas,
    plan_for,
    replication_problems,
)
from schemas.errors import ConfigError
from schemas.topics import Topics

#: what `spendbus status` tells an operator to run for a topic below the plan
FIX_COMMAND = "spendbus topics fix-replication"


def _admin(bootstrap: str, security: KafkaSecurity) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=30_000, **security.client_kwargs()
    )


async def ensure_topics(
    bootstrap: str,
    topics: Topics,
    partitions: int,
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> list[str]:
    """Create the missing topics; returns the names created. Existing ones are left as they
    are (``replication_report`` finds those below the plan)."""
    admin = _admin(bootstrap, security)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [s for s in topics.specs(partitions) if s.name not in existing]
        if not wanted:
            return []
        plan = await plan_for(admin, replication, f"{len(wanted)} topic(s)")
        response = await admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=plan.replication_factor,
                    topic_configs={**s.config, **plan.topic_config},
                )
                for s in wanted
            ]
        )
        for name, code, message in _errors(response):
            if code != 0 and code != TopicAlreadyExistsError.errno:
                raise RuntimeError(f"cannot create topic {name}: error {code} {message}")
        created = [s.name for s in wanted]
        await _wait_for_leaders(admin, created)
        return created
    finally:
        await admin.close()


async def replication_report(
    bootstrap: str,
    names: Sequence[str],
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> tuple[ReplicationPlan, list[ReplicationProblem]]:
    """The plan for this cluster and every existing topic of ``names`` below it."""
    admin = _admin(bootstrap, security)
    await admin.start()
    try:
        plan = replication.plan(await cluster_brokers(admin))
        replicas, min_insync = await _replication_of(admin, names)
        return plan, replication_problems(replicas, min_insync, plan)
    finally:
        await admin.close()


async def fix_replication(
    bootstrap: str,
    names: Sequence[str],
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
    timeout: float = 300.0,
) -> list[ReplicationProblem]:
    """Raise every topic of ``names`` below the plan to it: more replicas through the admin
    API's partition reassignment (KIP-455; the brokers copy the data, the topic stays
    writable), then ``min.insync.replicas``. Returns what was fixed, after the new replicas
    have caught up (or raises after ``timeout``)."""
    admin = _admin(bootstrap, security)
    await admin.start()
    try:
        brokers = sorted(b["node_id"] for b in (await admin.describe_cluster())["brokers"])
        plan = replication.plan(len(brokers))
        replicas, min_insync = await _replication_of(admin, names)
        problems = replication_problems(replicas, min_insync, plan)
        short = [p.topic for p in problems if p.replicas < plan.replication_factor]
        if short:
            await _reassign(admin, short, brokers, plan.replication_factor)
            await _wait_replicated(admin, short, plan.replication_factor, timeout)
        for problem in problems:
            if (problem.min_insync_replicas or 1) < plan.min_insync_replicas:
                await _set_min_insync(admin, problem.topic, plan.min_insync_replicas)
        return problems
    finally:
        await admin.close()


async def _replication_of(
    admin: AIOKafkaAdminClient, names: Sequence[str]
) -> tuple[dict[str, int], dict[str, int | None]]:
    existing = set(await admin.list_topics())
    present = [n for n in names if n in existing]
    if not present:
        return {}, {}
    described = await admin.describe_topics(present)
    replicas = {t["topic"]: fewest_replicas(t["partitions"]) for t in described}
    configs = await _topic_configs(admin, present)
    min_insync = {
        name: int(cfg[MIN_INSYNC_CONFIG]) if MIN_INSYNC_CONFIG in cfg else None
        for name, cfg in configs.items()
    }
    return replicas, min_insync


async def _topic_configs(
    admin: AIOKafkaAdminClient, names: Sequence[str], *, dynamic_only: bool = False
) -> dict[str, dict[str, str]]:
    """name -> {config: value} of each topic (``dynamic_only``: those set on the topic)."""
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    )
    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            entries = resource["config_entries"]
            out[resource["resource_name"]] = {
                e["config_names"] if "config_names" in e else e["config_name"]: e["config_value"]
                for e in entries
                if e["config_value"] is not None and (not dynamic_only or _set_on_topic(e))
            }
    return out


def _set_on_topic(entry: dict[str, Any]) -> bool:
    if "config_source" in entry:
        return bool(entry["config_source"] == 1)  # DYNAMIC_TOPIC_CONFIG
    return not entry.get("is_default", True)


async def _set_min_insync(admin: AIOKafkaAdminClient, topic: str, value: int) -> None:
    # AlterConfigs (aiokafka has no incremental form) replaces the topic's whole set:
    # send every config set on it, with min.insync.replicas changed
    current = (await _topic_configs(admin, [topic], dynamic_only=True)).get(topic, {})
    (response,) = await admin.alter_configs(
        [
            ConfigResource(
                ConfigResourceType.TOPIC, topic, {**current, MIN_INSYNC_CONFIG: str(value)}
            )
        ]
    )
    for code, message, *_ in response.resources:
        if code != 0:
            raise ConfigError(f"cannot set {MIN_INSYNC_CONFIG} of {topic}: error {code} {message}")


async def _reassign(
    admin: AIOKafkaAdminClient, names: Sequence[str], brokers: Sequence[int], wanted: int
) -> None:
    """Add replicas on the least loaded brokers a partition is not on yet (the current
    replicas stay, the leader first)."""
    described = await admin.describe_topics(list(names))
    load = {b: 0 for b in brokers}
    for topic in described:
        for p in topic["partitions"]:
            for b in p["replicas"]:
                load[b] = load.get(b, 0) + 1
    request_topics: list[tuple[str, list[tuple[int, list[int], dict[int, bytes]]], Any]] = []
    for topic in described:
        partitions: list[tuple[int, list[int], dict[int, bytes]]] = []
        for p in sorted(topic["partitions"], key=lambda p: p["partition"]):
            chosen = list(p["replicas"])
            while len(chosen) < wanted:
                extra = min((b for b in brokers if b not in chosen), key=lambda b: (load[b], b))
                chosen.append(extra)
                load[extra] += 1
            if len(chosen) != len(p["replicas"]):
                partitions.append((p["partition"], chosen, {}))
        if partitions:
            request_topics.append((topic["topic"], partitions, {}))
    if not request_topics:
        return
    request = AlterPartitionReassignmentsRequest(timeout_ms=30_000, topics=request_topics, tags={})
    response = await admin._send_to_controller(request)  # aiokafka has the request, no method
    result = response.to_object()
    if result["error_code"]:
        raise ConfigError(
            f"partition reassignment refused: error {result['error_code']} {result['error_message']}"
        )
    for topic in result["responses"]:
        for p in topic["partitions"]:
            if p["error_code"]:
                raise ConfigError(
                    f"reassigning {topic['name']}[{p['partition_index']}] refused: "
                    f"error {p['error_code']} {p['error_message']}"
                )


async def _wait_replicated(
    admin: AIOKafkaAdminClient, names: Sequence[str], wanted: int, timeout: float
) -> None:
    """Until every partition has ``wanted`` replicas, all of them in sync."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        described = await admin.describe_topics(list(names))
        if all(
            len(p["replicas"]) >= wanted and len(p["isr"]) >= wanted
            for t in described
            for p in t["partitions"]
        ):
            return
        if asyncio.get_running_loop().time() >= deadline:
            raise ConfigError(
                f"the new replicas of {', '.join(names)} are not in sync after {timeout:.0f}s"
            )
        await asyncio.sleep(0.5)


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float = 30.0
) -> None:
    """A new topic takes a moment to elect its leaders; producing before that only logs retries."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            described = await admin.describe_topics(names)
        except KafkaError as exc:
            # the admin client asks a random broker: one that is down answers this way,
            # the next attempt picks another
            if not exc.retriable:
                raise
            await asyncio.sleep(0.5)
            continue
        if all(
            t["error_code"] == 0
            and t["partitions"]
            and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        ):
            return
        await asyncio.sleep(0.1)


def _errors(response: object) -> list[tuple[str, int, str | None]]:
    out = []
    for item in getattr(response, "topic_errors", []):
        name, code = item[0], item[1]
        message = item[2] if len(item) > 2 else None
        out.append((name, code, message))
    return out

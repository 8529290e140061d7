"""What `spendbus status` asks Kafka (aiokafka's admin client and a group-less consumer,
each within a bounded time): brokers, topics and their offsets, consumer groups and their
lag, the newest verdict, the replication plan. It changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from aggregator import current_generation
from runtime.kafka import PLAINTEXT, KafkaSecurity, preflight
from runtime.replication import FOLLOW_CLUSTER, ReplicationPolicy
from schemas.codec import VERDICT
from schemas.errors import ConfigError
from schemas.records import Verdict
from schemas.topics import Topics
from spendbus.stack.topics import replication_report

#: with usage waiting to be counted, a newest verdict older than this is worth a look
STALE_VERDICT_S = 60.0


class KafkaUnreachable(Exception):
    """No broker answered within the time given."""


async def kafka_report(
    bootstrap: str,
    topics: Topics,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> dict[str, Any]:
    """Everything status reads from Kafka; raises KafkaUnreachable after ``timeout`` seconds
    (or at once, with the setting to look at, when the cluster refuses the security settings)."""
    try:
        await preflight(bootstrap, security, timeout_s=timeout)
    except ConfigError as exc:
        raise KafkaUnreachable(str(exc)) from None
    try:
        return await asyncio.wait_for(
            _kafka_report(bootstrap, topics, timeout, security=security, replication=replication),
            timeout,
        )
    except TimeoutError:
        raise KafkaUnreachable(f"no answer from {bootstrap} within {timeout:g}s") from None
    except KafkaUnreachable:
        raise
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError, KafkaError

        if isinstance(exc, KafkaConnectionError | KafkaError | OSError):
            raise KafkaUnreachable(f"{bootstrap}: {exc}") from None
        raise


async def _kafka_report(
    bootstrap: str,
    topics: Topics,
    timeout: float,
    *,
    security: KafkaSecurity = PLAINTEXT,
    replication: ReplicationPolicy = FOLLOW_CLUSTER,
) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    request_ms = max(1000, int(timeout * 1000))
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=request_ms, **security.client_kwargs()
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=request_ms,
        **security.client_kwargs(),
    )
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        # after `spendbus replay --cutover` the pipeline is the current generation's: its
        # derived topics and its consumer groups (docs/replay.md)
        generation = await current_generation(bootstrap, topics, security=security)
        topics = topics.of_generation(generation)
        names = [spec.name for spec in topics.specs()]
        # the counters' changelogs of every generation: their state, replicated like the ledger
        changelogs = sorted(
            n
            for n in await admin.list_topics()
            if n.startswith(f"{topics.prefix}spendbus-aggregator") and n.endswith("-changelog")
        )
        described = {t["topic"]: t for t in await admin.describe_topics(names)}
        partitions = [
            TopicPartition(name, p["partition"])
            for name in names
            if described.get(name, {}).get("error_code") == 0
            for p in described[name]["partitions"]
        ]
        await consumer.start()
        starts = await consumer.beginning_offsets(partitions) if partitions else {}
        ends = await consumer.end_offsets(partitions) if partitions else {}
        groups = await _groups(admin, set(names), starts, ends, counting=topics.enforcer_group)
        _mark_generations(groups, topics)
        newest = await _newest_verdict(consumer, topics.budget_verdicts, starts, ends)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()

    topic_rows = []
    for name in names:
        tps = [tp for tp in partitions if tp.topic == name]
        topic_rows.append(
            {
                "name": name,
                "exists": bool(tps),
                "partitions": len(tps),
                "records": sum(ends[tp] - starts[tp] for tp in tps),
            }
        )
    by_name = {row["name"]: row for row in topic_rows}
    return {
        "generation": generation,
        "replication": await _replication(bootstrap, names + changelogs, security, replication),
        "cluster_id": cluster.get("cluster_id"),
        "controller_id": cluster.get("controller_id"),
        "brokers": sorted(
            (
                {"node_id": b["node_id"], "host": b["host"], "port": b["port"]}
                for b in cluster.get("brokers", [])
            ),
            key=lambda b: b["node_id"],
        ),
        "topics": topic_rows,
        "consumer_groups": groups,
        "verdicts": {
            "topic": topics.budget_verdicts,
            "records": by_name[topics.budget_verdicts]["records"],
            **newest,
        },
        "dlq": {"topic": topics.usage_dlq, "letters": by_name[topics.usage_dlq]["records"]},
    }


async def _groups(
    admin: Any,
    ours: set[str],
    starts: dict[Any, int],
    ends: dict[Any, int],
    *,
    counting: str | None = None,
) -> list[dict[str, Any]]:
    """Groups that subscribe to or committed offsets on ``ours``: members and lag per topic.
    ``counting``: the enforcers' group, whose members count themselves and read nothing
    (no lag: ``enforcer/membership.py``)."""
    listed = sorted({g[0] for g in await admin.list_consumer_groups()})
    views = await asyncio.gather(*(_group_if_allowed(admin, g) for g in listed))
    groups = []
    for group, view in zip(listed, views, strict=True):
        if view is None:
            continue
        described, committed = view
        mine = {tp: meta.offset for tp, meta in committed.items() if tp.topic in ours}
        subscribed = described.pop("subscribed") & ours
        if not mine and not subscribed:
            continue
        if group == counting:
            groups.append(
                {"group": group, "lag": 0, "topics": [], "counts_enforcers": True, **described}
            )
            continue
        per_topic = []
        for topic in sorted({tp.topic for tp in mine} | subscribed):
            done = end = 0
            for tp in (tp for tp in ends if tp.topic == topic):
                # no commit yet on a partition: its records from the start are unread
                position = mine.get(tp, -1)
                position = starts[tp] if position < 0 else position
                done += position
                end += ends[tp]
            per_topic.append({"topic": topic, "committed": done, "end": end, "lag": end - done})
        groups.append(
            {
                "group": group,
                "lag": sum(t["lag"] for t in per_topic),
                "topics": per_topic,
                **described,
            }
        )
    return groups


def _mark_generations(groups: list[dict[str, Any]], topics: Topics) -> None:
    """Each aggregator group gets ``generation_current``: False for a group of another
    generation (one retired by a cutover, or one a replay builds), whose members and lag
    are that generation's business, not the pipeline's health."""
    base = topics.of_generation("").aggregator_app_id
    app = topics.aggregator_app_id
    current = {app, f"{app}-sink", f"{app}-worker"}
    for group in groups:
        if group["group"].startswith(base):
            group["generation_current"] = group["group"] in current


async def _group_if_allowed(admin: Any, group: str) -> tuple[dict[str, Any], Any] | None:
    """(members, committed offsets) of a group; None for a group this principal may not
    describe (another stack's, on a shared cluster with ACLs: not ours to report)."""
    from aiokafka.errors import GroupAuthorizationFailedError

    try:
        return await _members(admin, group), await admin.list_consumer_group_offsets(group)
    except GroupAuthorizationFailedError:
        return None


async def _members(admin: Any, group: str) -> dict[str, Any]:
    """State, members and subscribed topics of a classic consumer group (DescribeGroups)."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

    state, clients, subscribed = "unknown", [], set()
    for response in await admin.describe_consumer_groups([group]):
        for described in response.to_object()["groups"]:
            if described["group"] != group:
                continue
            state = described["state"]
            for member in described["members"]:
                clients.append(f"{member['client_id']}@{member['client_host']}")
                with contextlib.suppress(Exception):  # a protocol other than "consumer"
                    metadata = ConsumerProtocolMemberMetadata.decode(member["member_metadata"])
                    subscribed.update(metadata.subscription)
    return {
        "state": state,
        "members": len(clients),
        "clients": sorted(clients),
        "subscribed": subscribed,
    }


async def _newest_verdict(
    consumer: Any, topic: str, starts: dict[Any, int], ends: dict[Any, int]
) -> dict[str, Any]:
    """The newest verdict: the last record of each partition, the latest ``emitted_at``."""
    last = [tp for tp in ends if tp.topic == topic and ends[tp] > starts[tp]]
    newest: Verdict | None = None
    if last:
        consumer.assign(last)
        for tp in last:
            consumer.seek(tp, ends[tp] - 1)
        pending = set(last)
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    newest = _later(newest, message)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    if newest is None:
        return {"newest_emitted_at": None, "newest_as_of": None, "age_seconds": None}
    emitted, as_of = newest["emitted_at"], newest["as_of"]
    return {
        "newest_emitted_at": emitted.isoformat(),
        "newest_as_of": as_of.isoformat(),
        "age_seconds": round(max(0.0, (datetime.now(UTC) - emitted).total_seconds()), 3),
    }


async def _replication(
    bootstrap: str, names: list[str], security: KafkaSecurity, policy: ReplicationPolicy
) -> dict[str, Any]:
    try:
        plan, under = await replication_report(
            bootstrap, names, security=security, replication=policy
        )
    except ConfigError as exc:  # the settings ask what this cluster cannot hold
        return {"error": str(exc), "under_replicated": []}
    return {
        "replication_factor": plan.replication_factor,
        "min_insync_replicas": plan.min_insync_replicas,
        "brokers": plan.brokers,
        "error": None,
        "under_replicated": [p.model_dump() for p in under],
    }


def _later(newest: Verdict | None, message: Any) -> Verdict | None:
    try:
        verdict = VERDICT.decode(message.value)
    except Exception:  # a record status cannot read says nothing about freshness
        return newest
    if newest is None or verdict["emitted_at"] > newest["emitted_at"]:
        return verdict
    return newest

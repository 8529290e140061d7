"""One sink per embedded store: a worker that would split usage.priced with another refuses.

Several workers share usage.raw (the counting stage's group); the sink stages have a group
of their own (``AggregatorConfig.sink_app_id``) on usage.priced and budget.verdicts. An
embedded store (``chdb://``) is one process's: two workers sinking into embedded stores
would each write half the partitions into a store of its own, and every store would miss
rows. So a worker about to sink into an embedded store first asks Kafka who is in the sink
group already; a member subscribed to usage.priced means another worker sinks, and this
one stops with an error that says what to pick (aggregator/README.md, "Several workers"):
``--no-sink`` (count only, the usual second worker), or a ClickHouse server DSN for every
sinking worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any, Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from aiokafka.errors import CoordinatorNotAvailableError

from aggregator.config import AggregatorConfig
from aggregator.sink.store import chdb_path
from schemas.errors import ConfigError

#: lookups of the sink group's coordinator before it counts as no group at all
COORDINATOR_TRIES: Final = 10


def sink_client_id(config: AggregatorConfig) -> str:
    """The sink's Kafka client id, named after its store: a member of the sink group with
    this id is this store's own earlier process (killed, its membership not yet expired),
    never a second store."""
    dsn = config.clickhouse_dsn or ""
    path = chdb_path(dsn) if dsn else None
    digest = hashlib.sha256((path or dsn).encode()).hexdigest()[:12]
    return f"spendbus-sink-{digest}"


async def sinking_members(config: AggregatorConfig) -> list[str]:
    """``client_id@host`` of every member of the sink group subscribed to usage.priced,
    but this store's own earlier process (:func:`sink_client_id`)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=config.bootstrap,
        request_timeout_ms=30_000,
        **config.kafka_security.client_kwargs(),
    )
    await admin.start()
    try:
        found = []
        for response in await _describe(admin, config.sink_app_id):
            for group in response.to_object()["groups"]:
                if group["group"] != config.sink_app_id:
                    continue
                for member in group["members"]:
                    subscribed: list[str] = []
                    with contextlib.suppress(Exception):  # not the consumer protocol
                        metadata = ConsumerProtocolMemberMetadata.decode(member["member_metadata"])
                        subscribed = list(metadata.subscription)
                    if config.topics.usage_priced in subscribed and member[
                        "client_id"
                    ] != sink_client_id(config):
                        found.append(f"{member['client_id']}@{member['client_host']}")
        return found
    finally:
        await admin.close()


async def _describe(admin: AIOKafkaAdminClient, group: str) -> list[Any]:
    # a fresh cluster creates its offsets topic on the first coordinator lookup: while it
    # has none, no member can have joined any group
    for _ in range(COORDINATOR_TRIES - 1):
        try:
            return list(await admin.describe_consumer_groups([group]))
        except CoordinatorNotAvailableError:
            await asyncio.sleep(1.0)
    try:
        return list(await admin.describe_consumer_groups([group]))
    except CoordinatorNotAvailableError:
        return []


async def check_embedded_sink(config: AggregatorConfig) -> None:
    """ConfigError when this worker would sink into an embedded store while another
    worker of its group already sinks (that split would leave rows out of both stores)."""
    if not config.clickhouse_dsn or chdb_path(config.clickhouse_dsn) is None:
        return  # no sink, or a server: any number of workers write to it
    others = await sinking_members(config)
    if others:
        raise ConfigError(
            f"another worker of {config.app_id} already writes usage.priced to ClickHouse "
            f"({', '.join(others)}): an embedded store (chdb://) takes one sinking worker, "
            "and a second would leave half the partitions' rows out of each store. Run this "
            "worker with --no-sink (it counts, the first sinks), or give every sinking "
            "worker the same ClickHouse server (CLICKHOUSE_DSN=https://...)"
        )

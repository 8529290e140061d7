"""The counting stage's changelog topics: counters and event-id dedupe, created if missing."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from aggregator.config import AggregatorConfig
from aggregator.counting.errors import CountingError
from runtime.replication import plan_for
from schemas.topics import COMPACTED_CONFIG, Topics


async def ensure_changelogs(config: AggregatorConfig, topics: Topics) -> None:
    """Create the counting stage's two changelog topics, co-partitioned with usage.raw, if
    missing (the stage at start, and a replay seeding a generation from a snapshot)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=config.bootstrap, **config.kafka_security.client_kwargs()
    )
    await admin.start()
    try:
        source = await admin.describe_topics([topics.usage_raw])
        partitions = len(source[0]["partitions"]) or config.partitions
        existing = set(await admin.list_topics())
        names = [n for n in (config.counter_changelog, config.seen_changelog) if n not in existing]
        if names:
            # the counters' state: as many replicas as the cluster allows (runtime/replication.py)
            plan = await plan_for(admin, config.replication, f"changelogs {', '.join(names)}")
            wanted = [
                NewTopic(
                    name,
                    partitions,
                    plan.replication_factor,
                    topic_configs={**COMPACTED_CONFIG, **plan.topic_config},
                )
                for name in names
            ]
            response = await admin.create_topics(wanted)
            for name, code, *_ in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise CountingError(f"cannot create changelog {name}: error {code}")
    finally:
        await admin.close()

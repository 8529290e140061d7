"""Small Kafka helpers every room uses to read the contract's topics (aiokafka only)."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas.errors import ConfigError


async def topic_partitions(bootstrap: str, *topics: str) -> list[TopicPartition]:
    """Every partition of ``topics``; ConfigError naming a topic that does not exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    out: list[TopicPartition] = []
    for item in described:
        if item["error_code"] != 0 or not item["partitions"]:
            raise ConfigError(
                f"topic {item['topic']!r} does not exist (run `spendbus up`, or create the topics)"
            )
        out.extend(TopicPartition(item["topic"], p["partition"]) for p in item["partitions"])
    return sorted(out)

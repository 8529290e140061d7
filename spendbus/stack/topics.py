"""Create every topic of the contract (schemas.topics) with its cleanup policy."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import Topics


async def ensure_topics(bootstrap: str, topics: Topics, partitions: int) -> list[str]:
    """Create the missing topics; returns the names created. Existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [s for s in topics.specs(partitions) if s.name not in existing]
        if not wanted:
            return []
        response = await admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=1,
                    topic_configs=s.config,
                )
                for s in wanted
            ]
        )
        for name, code, message in _errors(response):
            if code != 0 and code != TopicAlreadyExistsError.errno:
                raise RuntimeError(f"cannot create topic {name}: error {code} {message}")
        return [s.name for s in wanted]
    finally:
        await admin.close()


def _errors(response: object) -> list[tuple[str, int, str | None]]:
    out = []
    for item in getattr(response, "topic_errors", []):
        name, code = item[0], item[1]
        message = item[2] if len(item) > 2 else None
        out.append((name, code, message))
    return out

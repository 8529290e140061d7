"""Create every topic of the contract (schemas.topics) with its cleanup policy."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.kafka import PLAINTEXT, KafkaSecurity
from schemas.topics import Topics


async def ensure_topics(
    bootstrap: str, topics: Topics, partitions: int, *, security: KafkaSecurity = PLAINTEXT
) -> list[str]:
    """Create the missing topics; returns the names created. Existing ones are left as they are."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=30_000, **security.client_kwargs()
    )
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
        created = [s.name for s in wanted]
        await _wait_for_leaders(admin, created)
        return created
    finally:
        await admin.close()


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float = 30.0
) -> None:
    """A new topic takes a moment to elect its leaders; producing before that only logs retries."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(names)
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

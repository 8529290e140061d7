"""Helpers of the HTTP and JSON-lines ingest tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer

from schemas.codec import USAGE_EVENT
from schemas.usage import new_event_id

TOKEN = "s3cret-token"
DEAD_BOOTSTRAP = "127.0.0.1:1"


def json_event(i: int = 0, org: str = "acme", **fields: Any) -> dict[str, Any]:
    """A UsageEvent in its JSON form, as a proxy in another language sends it."""
    body: dict[str, Any] = {
        "event_id": new_event_id(),
        "occurred_at": datetime(2026, 3, 1, 12, 0, i % 60, tzinfo=UTC)
        .isoformat()
        .replace("+00:00", "Z"),
        "provider": "openai",
        "api": "openai-chat",
        "model": "gpt-4.1",
        "secret_id": "sec-1",
        "org_id": org,
        "gateway_id": "gw-go-1",
        "input_tokens": 100 + i,
        "output_tokens": 20,
    }
    body.update(fields)
    return body


async def consume(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0
) -> list[tuple[bytes, dict[str, Any]]]:
    """(key, decoded UsageEvent) of every record of ``topic``; waits for ``expected`` of them."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,  # no group to join: every partition, from the start
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[tuple[bytes, dict[str, Any]]] = []
    try:
        idle = 0.0
        while len(out) < expected and idle < timeout_s:
            batch = await consumer.getmany(timeout_ms=500)
            idle = idle + 0.5 if not batch else 0.0
            for messages in batch.values():
                out.extend((m.key, USAGE_EVENT.decode(m.value)) for m in messages)
        for messages in (await consumer.getmany(timeout_ms=300)).values():
            out.extend((m.key, USAGE_EVENT.decode(m.value)) for m in messages)
    finally:
        await consumer.stop()
    return out

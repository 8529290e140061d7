"""Helpers of the publisher tests: events, configs, reading usage.raw back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from ingest.publisher import PublisherConfig
from schemas.codec import USAGE_EVENT
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

#: a port nothing listens on (bound then closed would race; port 1 needs root to listen)
DEAD_BOOTSTRAP = "127.0.0.1:1"


def event(i: int = 0, org: str = "acme", **fields: Any) -> UsageEvent:
    return new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model="claude-sonnet-4",
        secret_id="sec-1",
        org_id=org,
        gateway_id="gw-test",
        input_tokens=100 + i,
        output_tokens=10,
        **fields,
    )


def config(spool_dir: Path, bootstrap: str = DEAD_BOOTSTRAP, **overrides: Any) -> PublisherConfig:
    values: dict[str, Any] = {
        "bootstrap": bootstrap,
        "spool_dir": spool_dir,
        "retry_backoff_ms": 50,
        "retry_backoff_max_ms": 500,
        "send_timeout_ms": 5_000,
        "linger_ms": 1,
    }
    values.update(overrides)
    return PublisherConfig(**values)


async def consume(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0
) -> list[tuple[int, bytes, dict[str, Any]]]:
    """Every record of ``topic`` from the start as (partition, key, decoded value), in offset
    order per partition; waits until ``expected`` records or a quiet ``timeout_s``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,  # no group to join: every partition, from the start
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[tuple[int, bytes, dict[str, Any]]] = []
    try:
        idle = 0.0
        while len(out) < expected and idle < timeout_s:
            batch = await consumer.getmany(timeout_ms=500)
            if not batch:
                idle += 0.5
                continue
            idle = 0.0
            for tp, messages in batch.items():
                for message in messages:
                    out.append((tp.partition, message.key, USAGE_EVENT.decode(message.value)))
        # anything more (a duplicate) shows up within a short extra read
        batch = await consumer.getmany(timeout_ms=300)
        for tp, messages in batch.items():
            for message in messages:
                out.append((tp.partition, message.key, USAGE_EVENT.decode(message.value)))
    finally:
        await consumer.stop()
    return out

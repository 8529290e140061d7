"""The whole pipeline for tests: an aggregator worker process on the real broker and engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiokafka import AIOKafkaProducer

from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT
from schemas.pricing import PriceBook, price_table_from_yaml
from schemas.records import UsageEvent
from schemas.topics import Topics, usage_raw_key
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from spendbus.stack.worker import WorkerProcess

T = TypeVar("T")

PRICES_YAML = """
version: "it-1"
effective_from: "2026-01-01T00:00:00Z"
models:
  - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00", cache_read_per_mtok: "0.30"}
  - {match: gpt-4o-mini, input_per_mtok: "0.15", output_per_mtok: "0.60"}
"""
BUDGETS_YAML = """
- {id: per-secret, scope: secret, window: month, limit_usd: "0.10", alert_at: [0.5, 1.0]}
- {id: org-total, scope: org, window: total, limit_tokens: 1000000000}
"""


def price_book() -> PriceBook:
    table = price_table_from_yaml(yaml.safe_load(PRICES_YAML), source="it")
    return PriceBook(table if isinstance(table, list) else [table])


class Pipeline:
    """A running aggregator worker plus helpers to feed and read it."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        home: Path,
        dsn: str,
        *,
        security: KafkaSecurity = PLAINTEXT,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        """``security``: how this kit's own clients connect (reference data, the enforcer);
        ``worker_env``: more settings of the worker process (e.g. its Kafka security)."""
        self.bootstrap = bootstrap
        self.topics = topics
        self.dsn = dsn
        self.security = security
        self.worker = WorkerProcess(
            run_dir=home / "run",
            env={
                "KAFKA_BOOTSTRAP": bootstrap,
                "CLICKHOUSE_DSN": dsn,
                "SPENDBUS_TOPIC_PREFIX": topics.prefix,
                "SPENDBUS_HOME": str(home),
                "SPENDBUS_PARTITIONS": "4",
                "SPENDBUS_WEB_PORT": str(free_port()),
                **(worker_env or {}),
            },
            web_port=0,
        )
        self.worker.web_port = int(self.worker.env["SPENDBUS_WEB_PORT"])
        self.prices = price_book()

    def apply_reference(self) -> None:
        table = price_table_from_yaml(yaml.safe_load(PRICES_YAML), source="it")
        tables = table if isinstance(table, list) else [table]
        now = datetime.now(UTC)
        asyncio.run(
            publish(
                self.bootstrap,
                self.topics.pricing,
                [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
                security=self.security,
            )
        )
        asyncio.run(
            publish(
                self.bootstrap,
                self.topics.budget_policies,
                [
                    (b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now)))
                    for b in budgets_from_yaml(yaml.safe_load(BUDGETS_YAML))
                ],
                security=self.security,
            )
        )

    def sql(self, query: str) -> list[list[Any]]:
        return self.worker.post("/sql", {"sql": query})["rows"]  # type: ignore[no-any-return]  # the worker's JSON answer is Any

    def stats(self) -> dict[str, Any]:
        return self.worker.get("/stats")  # type: ignore[no-any-return]  # the worker's JSON answer is Any

    def sql_until(
        self, query: str, done: Callable[[list[list[Any]]], bool], timeout: float = 90.0
    ) -> list[list[Any]]:
        """Run ``query`` until ``done(rows)`` or the timeout; the last rows either way
        (the sink writes within a second or so: tests assert on what this returns)."""
        return poll(lambda: self.sql(query), done, timeout)

    def stats_until(
        self, done: Callable[[dict[str, Any]], bool], timeout: float = 120.0
    ) -> dict[str, Any]:
        """``stats()`` until ``done(stats)`` or the timeout; the last stats either way."""
        return poll(self.stats, done, timeout)

    def verdict_spend_until(
        self, wanted: dict[tuple[str, str], int], timeout: float = 120.0
    ) -> dict[tuple[str, str], int]:
        """What an enforcer following the verdicts says each (org, secret) spent on the
        ``per-secret`` budget, once it equals ``wanted`` or at the timeout (0 = no verdict)."""
        from enforcer import Enforcer, EnforcerConfig

        async def follow() -> dict[tuple[str, str], int]:
            config = EnforcerConfig(
                bootstrap=self.bootstrap,
                topic_prefix=self.topics.prefix,
                kafka_security=self.security,
            )
            async with Enforcer(config) as enforcer:
                await enforcer.wait_ready(60)

                def spent(org_id: str, secret_id: str) -> int:
                    statuses = enforcer.usage(enforcer.context(org_id=org_id, secret_id=secret_id))
                    return next((s.spent_nanos for s in statuses if s.budget_id == "per-secret"), 0)

                deadline = time.monotonic() + timeout
                seen = {key: spent(*key) for key in wanted}
                while seen != wanted and time.monotonic() < deadline:
                    await asyncio.sleep(0.3)
                    seen = {key: spent(*key) for key in wanted}
                return seen

        return asyncio.run(follow())


def poll(
    read: Callable[[], T], done: Callable[[T], bool], timeout: float = 60.0, interval: float = 0.3
) -> T:
    """read() until done(value) or the deadline; the last value, for the assertion."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(interval)
        value = read()
    return value


async def publish_usage(bootstrap: str, topic: str, events: list[UsageEvent]) -> None:
    """Publish events keyed by org (as the publisher does), in order, acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=usage_raw_key(e["org_id"]), value=USAGE_EVENT.encode(e))
            for e in events
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()

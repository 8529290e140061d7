"""Where the operator commands read ClickHouse: the store of the generation the enforcers
follow, and a query on it through the running worker when it owns the embedded engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import click

from schemas.errors import ConfigError
from spendbus.settings import Settings
from spendbus.stack.local import bootstrap_or_fail, worker_process


def current_store(settings: Settings) -> str:
    """The ClickHouse store of the generation the enforcers follow (after a cutover: the new one).

    Without Kafka the control topic cannot be read: the default generation's store is
    used, and the analyst is told so.
    """
    from aiokafka.errors import KafkaError

    from aggregator import current_generation, generation_dsn

    try:
        bootstrap = bootstrap_or_fail(settings)
        generation = asyncio.run(
            asyncio.wait_for(
                current_generation(bootstrap, settings.topics, security=settings.kafka_security), 10
            )
        )
    except (ConfigError, TimeoutError, OSError, KafkaError) as exc:
        click.echo(
            f"warning: current generation unknown ({type(exc).__name__}); "
            "reading the default generation's store",
            err=True,
        )
        return settings.dsn
    return generation_dsn(settings.dsn, generation)


def history_query(settings: Any) -> Callable[[str], list[Any]] | None:
    """Runs a query on the current generation's store: through the running worker when it
    owns the embedded engine, else directly; None when neither answers (verify then
    compares the live verdicts only, and says so)."""
    worker = worker_process(settings)
    if worker.pid() is not None and settings.dsn.startswith("chdb://"):
        return lambda query: list(worker.post("/sql", {"sql": query})["rows"])
    from aggregator import SinkError, open_client, run_query

    try:
        client = open_client(current_store(settings), access=settings.clickhouse_access)
    except SinkError:
        return None
    return lambda query: list(run_query(client, query)[1])

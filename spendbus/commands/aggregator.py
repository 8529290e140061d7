"""`spendbus aggregator run`: one Faust worker of the aggregator."""

from __future__ import annotations

import logging

import click

from spendbus.settings import load_settings


@click.group()
def aggregator() -> None:
    """The stream processor that prices usage and keeps the budget counters."""


@aggregator.command("run")
@click.option(
    "--store",
    default="rocksdb://",
    show_default=True,
    help="Faust table store (rocksdb:// or memory://).",
)
@click.option("--no-sink", is_flag=True, help="Do not write ClickHouse from this worker.")
@click.option(
    "--app-id", default=None, help="Consumer group / state namespace (default spendbus-aggregator)."
)
@click.option(
    "--generation",
    default=None,
    help="The generation to build (docs/replay.md); default: the current one on the control topic.",
)
@click.option("--log-level", default="WARNING", show_default=True)
def run(
    store: str, no_sink: bool, app_id: str | None, generation: str | None, log_level: str
) -> None:
    """Run one aggregator worker in the foreground (Ctrl-C / SIGTERM stops it cleanly)."""
    import asyncio

    import faust

    from aggregator import (
        AggregatorConfig,
        check_embedded_sink,
        create_app,
        current_generation,
        generation_dsn,
    )
    from spendbus.stack.local import bootstrap_or_fail
    from spendbus.stack.web_token import worker_token

    settings = load_settings()
    # before Kafka: a worker that may not serve its pages fails at once, not after a connect
    web_token = worker_token(settings)
    clickhouse_access = settings.clickhouse_access
    bootstrap = bootstrap_or_fail(settings)
    if generation is None:
        generation = asyncio.run(
            current_generation(bootstrap, settings.topics, security=settings.kafka_security)
        )
    topics = settings.topics.of_generation(generation)
    config = AggregatorConfig(
        bootstrap=bootstrap,
        kafka_security=settings.kafka_security,
        clickhouse_dsn=None if no_sink else generation_dsn(settings.dsn, generation),
        topic_prefix=settings.topic_prefix,
        generation=generation,
        app_id=app_id or topics.aggregator_app_id,
        # RocksDB tables are named alike in every generation: one directory each
        data_dir=settings.home / (f"aggregator-{generation}" if generation else "aggregator"),
        store=store,
        partitions=settings.partitions,
        replication=settings.replication,
        web_port=settings.web_port,
        web_host=settings.web_host,
        web_body_timeout_s=settings.web_body_timeout_s,
        session_idle_seconds=settings.session_idle_seconds,
        prune_seconds=settings.prune_seconds,
        web_token=web_token,
        clickhouse_access=clickhouse_access,
        sink_process=settings.sink_process,
        engine_process=settings.engine_process,
        log_level=log_level.upper(),
    )
    # an embedded store takes one sinking worker: refuse to split usage.priced (sink_owner.py)
    asyncio.run(check_embedded_sink(config))
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    app = create_app(config)
    worker = faust.Worker(app, loglevel=config.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()

"""Builds the Faust app; nothing else. Agents live in ``agents.py``.

Start order (mode services): Faust starts its producer and consumer; the reference
follower (budgets, prices) starts with the app and must be caught up before the counting
stage folds its first batch; the sink stage opens its store before it subscribes.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import faust
from faust.auth import Credentials, SASLCredentials, SSLCredentials

from aggregator.config import AggregatorConfig
from runtime.kafka import KafkaSecurity
from runtime.replication import ReplicationPlan, resolve_plan


def faust_credentials(security: KafkaSecurity) -> Credentials | None:
    """The Faust form of the security settings (None = PLAINTEXT, Faust's default)."""
    if security.uses_sasl:
        assert security.sasl_password is not None  # KafkaSecurity checks it
        return SASLCredentials(
            username=security.sasl_username,
            password=security.sasl_password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            # None over SASL_PLAINTEXT; with a context Faust speaks SASL_SSL
            ssl_context=security.ssl_context(),
        )
    context = security.ssl_context()
    return None if context is None else SSLCredentials(context)


def replication_plan(config: AggregatorConfig) -> ReplicationPlan:
    """The replication of the topics Faust declares (its assignor's topic), asked of the
    cluster on a loop of its own: the app is built before Faust's loop runs."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        coro = resolve_plan(config.bootstrap, config.replication, security=config.kafka_security)
        return pool.submit(asyncio.run, coro).result()


def create_app(config: AggregatorConfig) -> faust.App:
    logging.getLogger("faust").setLevel(config.log_level)
    # faust's Worker sets the root logger to DEBUG for its terminal spinner (its handler
    # filters): without a level of its own, every aiokafka debug call (one per batch sent
    # or fetched) builds a LogRecord, a share of a counting worker's time worth saving
    logging.getLogger("aiokafka").setLevel(config.log_level)
    app = faust.App(
        # Faust's own group: the counting and sink stages have groups of their own
        config.worker_app_id,
        broker=f"kafka://{config.bootstrap}",
        # Faust's own consumer, producer and topic declarations; the counting stage and the
        # followers take config.kafka_security directly
        broker_credentials=faust_credentials(config.kafka_security),
        store=config.store,
        datadir=str(config.data_dir),
        autodiscover=False,
        # at-least-once: the app reads no topic of ours (the counting and sink stages
        # commit their own offsets); exactly_once is avoided on purpose (docs/design.md,
        # "Why it is built this way").
        processing_guarantee="at_least_once",
        topic_partitions=config.partitions,
        topic_replication_factor=replication_plan(config).replication_factor,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # a crashed worker's partitions move after this long: short, so a kill -9 costs seconds
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=config.session_timeout_s / 4,
        producer_acks=-1,
        producer_linger_ms=5,
        web_enabled=True,
        # web_host only names the URL; Faust listens on web_bind (its default is 0.0.0.0)
        web_bind=config.web_host,
        web_host=config.web_host,
        web_port=config.web_port,
        # Faust's own pages (/router, /table, /graph, /stats/, /performance) are not ours
        # to guard: off; the worker serves /sql, /stats and /metrics (agents.py)
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_in_thread=False,
        table_standby_replicas=0,
        stream_buffer_maxsize=8192,
        stream_wait_empty=False,
        worker_redirect_stdouts=False,
    )
    from aggregator.agents import install

    install(app, config)
    # a replay generation without a store stages the fold's alerts (docs/replay.md); with
    # one, the alert publisher (aggregator/alerts/publisher.py) writes the shared topic itself
    if config.generation and not config.clickhouse_dsn:
        from aggregator.replay.generations import install_alert_relay

        install_alert_relay(app, config.bootstrap, config.topics, security=config.kafka_security)
    return app

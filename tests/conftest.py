"""Session fixtures: one real Kafka broker and the real ClickHouse engine.

Where they come from, in order:
  1. KAFKA_BOOTSTRAP / CLICKHOUSE_DSN when set (an existing cluster / server);
  2. testcontainers, when a Docker engine answers;
  3. the local broker from infra/kafka (Maven-fetched, KRaft, 127.0.0.1, a free
     port) and the embedded ClickHouse engine (chdb) in a temporary folder.
Each test gets fresh topics (a unique prefix) and consumer group ids.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from schemas.topics import Topics
from spendbus.stack.topics import ensure_topics
from tests.native_kit import stale_extensions


def pytest_sessionstart(session: pytest.Session) -> None:
    if stale := stale_extensions():
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; "
            "run `make native` (or delete them to run the sources interpreted)",
            returncode=2,
        )


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]  # docker ships no type stubs

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from spendbus.stack.broker_jars import ensure_broker_jars
    from spendbus.stack.kafka import LocalKafka

    ensure_broker_jars()
    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"), port=0)
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def local_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker of our own, for tests that stop and restart it (never the shared one)."""
    from spendbus.stack.broker_jars import ensure_broker_jars
    from spendbus.stack.kafka import LocalKafka

    ensure_broker_jars()
    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka-own"), port=0)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Three local KRaft nodes (each a broker and a controller voter, spendbus/stack/cluster.py)
    for the tests that ask: fault tests kill, stop and restart its nodes; each such test
    leaves every node running again (``cluster.start()``) for the next."""
    from spendbus.stack.broker_jars import ensure_broker_jars
    from spendbus.stack.cluster import LocalCluster

    ensure_broker_jars()
    cluster = LocalCluster(tmp_path_factory.mktemp("kafka-cluster"), brokers=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def clickhouse_server_dsn() -> Iterator[str | None]:
    """A ClickHouse server DSN when one is configured or Docker can start one; else None (use chdb)."""
    if os.environ.get("CLICKHOUSE_DSN"):
        yield os.environ["CLICKHOUSE_DSN"]
        return
    if _docker_answers():
        from testcontainers.community.clickhouse import ClickHouseContainer

        # clickhouse-connect speaks HTTP (8123, which the container exposes), not the native 9000
        with ClickHouseContainer() as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(8123)
            yield f"http://{container.username}:{container.password}@{host}:{port}/{container.dbname}"
        return
    yield None


@pytest.fixture
def clickhouse_dsn(clickhouse_server_dsn: str | None, tmp_path: Path, unique: str) -> str:
    """A store for one test: a fresh database on the server, or a fresh embedded engine path."""
    if clickhouse_server_dsn is None:
        return f"chdb://{tmp_path / 'clickhouse'}"
    import clickhouse_connect

    database = f"t{unique}"
    clickhouse_connect.get_client(dsn=clickhouse_server_dsn).command(
        f"CREATE DATABASE IF NOT EXISTS {database}"
    )
    return urlunsplit(urlsplit(clickhouse_server_dsn)._replace(path=f"/{database}"))


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def topics(kafka_bootstrap: str, unique: str) -> Topics:
    """Fresh topics of the whole contract for one test."""
    names = Topics(prefix=f"t{unique}.")
    asyncio.run(ensure_topics(kafka_bootstrap, names, partitions=4))
    return names


@pytest.fixture
def pipeline(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> Iterator[Any]:
    """A running aggregator worker process on fresh topics and a fresh store (see pipeline_kit)."""
    from tests.pipeline_kit import Pipeline

    p = Pipeline(kafka_bootstrap, topics, tmp_path, clickhouse_dsn)
    p.apply_reference()
    p.worker.start(timeout=180)
    try:
        yield p
    finally:
        p.worker.stop()


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker of its own with a SASL_SSL listener (SCRAM users, a CA made for the session,
    deny-by-default ACLs): see kafka_security_kit. Started only for the tests that ask."""
    from spendbus.stack.broker_jars import ensure_broker_jars
    from tests.kafka_security_kit import start_secured_kafka

    ensure_broker_jars()
    secured = start_secured_kafka(tmp_path_factory.mktemp("kafka-sasl-ssl"))
    try:
        yield secured
    finally:
        secured.broker.stop()

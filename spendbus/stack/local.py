"""The local stack of `spendbus up`: a Kafka broker, or a cluster of N (`--brokers N`),
unless KAFKA_BOOTSTRAP names one; the topics, replicated as the cluster allows; and one
aggregator worker owning the embedded ClickHouse store.
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runtime.kafka import KafkaSecurity, preflight
from schemas.errors import ConfigError
from spendbus.settings import Settings
from spendbus.stack.broker_jars import ensure_broker_jars
from spendbus.stack.cluster import CLUSTER_FILE, LocalCluster
from spendbus.stack.kafka import LocalKafka
from spendbus.stack.private_home import secure_home
from spendbus.stack.topics import ensure_topics
from spendbus.stack.web_token import default_token_file, worker_token
from spendbus.stack.worker import WorkerProcess


def kafka_dir(settings: Settings) -> Path:
    return settings.home / "kafka"


def cluster_dir(settings: Settings) -> Path:
    return settings.home / "kafka-cluster"


def local_broker(settings: Settings, brokers: int | None = None) -> LocalKafka | LocalCluster:
    """The local Kafka of `spendbus up`: one broker in ``kafka/``, or the cluster of
    ``--brokers N`` (N > 1) in ``kafka-cluster/``; None = whichever was started before."""
    # stop_with_parent=False: the broker of `spendbus up` outlives the command; `down` stops it
    made = (cluster_dir(settings) / CLUSTER_FILE).is_file()
    if brokers is None:
        brokers = LocalCluster(cluster_dir(settings)).brokers if made else 1
    if brokers > 1 or made:
        cluster = LocalCluster(
            cluster_dir(settings),
            brokers=brokers,
            cache_dir=settings.cache_dir,
            stop_with_parent=False,
        )
        if cluster.brokers != brokers:
            raise ConfigError(
                f"the local cluster in {cluster_dir(settings)} has {cluster.brokers} brokers, "
                f"not {brokers}: `spendbus down` and delete that folder to start another"
            )
        return cluster
    return LocalKafka(
        data_dir=kafka_dir(settings), cache_dir=settings.cache_dir, stop_with_parent=False
    )


def check_kafka(bootstrap: str, security: KafkaSecurity) -> None:
    """The preflight (runtime.kafka.preflight): a ConfigError naming the setting and the
    broker within seconds when the cluster refuses these security settings."""
    if security.security_protocol == "PLAINTEXT":
        return  # not probed: nothing changes for a plaintext cluster
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(preflight(bootstrap, security))
        return
    # called from async code (an embedding, a test): the probe runs on a loop of its own
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, preflight(bootstrap, security)).result()


#: how long `check_broker_answers` waits for each bootstrap address to accept a connection
REACH_TIMEOUT_S = 5.0


def unreachable_message(bootstrap: str, setting: str) -> str:
    """One line: which setting named which address, and what to do about it."""
    return (
        f"no Kafka broker answers at {bootstrap} ({setting}): start it, or point "
        "the setting at a running one; the local broker of `spendbus up` picks a free "
        "port, which commands find through SPENDBUS_HOME when kafka.bootstrap and "
        "KAFKA_BOOTSTRAP are unset (`spendbus status` shows it)"
    )


def check_broker_answers(bootstrap: str, setting: str, security: KafkaSecurity) -> None:
    """A ConfigError in one line (``unreachable_message``) when no address of ``bootstrap``
    accepts a connection; a secured cluster gets the preflight, which says more."""
    if security.security_protocol != "PLAINTEXT":
        check_kafka(bootstrap, security)
        return
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), REACH_TIMEOUT_S):
                return
        except (OSError, ValueError):
            continue
    raise ConfigError(unreachable_message(bootstrap, setting))


def bootstrap_or_fail(settings: Settings) -> str:
    """KAFKA_BOOTSTRAP (checked with the security settings), else the local broker that
    `spendbus up` started (plaintext on loopback: no security settings apply to it)."""
    security = settings.kafka_security  # a ConfigError naming the setting if inconsistent
    if settings.kafka_bootstrap:
        check_kafka(settings.kafka_bootstrap, security)
        return settings.kafka_bootstrap
    if security.security_protocol != "PLAINTEXT":
        raise ConfigError(
            f"KAFKA_SECURITY_PROTOCOL={security.security_protocol} needs KAFKA_BOOTSTRAP: "
            "the local broker of `spendbus up` speaks PLAINTEXT on loopback"
        )
    broker = local_broker(settings)
    if broker.is_running():
        return broker.bootstrap
    raise ConfigError(
        "no Kafka: set KAFKA_BOOTSTRAP, or run `spendbus up` to start the local broker "
        f"(none runs in SPENDBUS_HOME={settings.home})"
    )


def worker_process(settings: Settings, env: dict[str, str] | None = None) -> WorkerProcess:
    return WorkerProcess(
        run_dir=(settings.home / "run").resolve(),
        env={
            "SPENDBUS_HOME": str(settings.home.resolve()),
            "CLICKHOUSE_DSN": settings.dsn,
            "SPENDBUS_TOPIC_PREFIX": settings.topic_prefix,
            "SPENDBUS_PARTITIONS": str(settings.partitions),
            "SPENDBUS_WEB_PORT": str(settings.web_port),
            "SPENDBUS_WEB_HOST": settings.web_host,
            **(env or {}),
        },
        web_port=settings.web_port,
        web_host=settings.web_host,
        # read when a request is made: a broken token setting must not break `down`
        token=settings.web_token,
        token_file=settings.web_token_file or default_token_file(settings),
    )


@dataclass
class LocalStack:
    settings: Settings

    def up(self, with_worker: bool = True, brokers: int | None = None) -> str:
        """Start what is not running yet; returns the bootstrap address. ``brokers``: the
        size of the local Kafka (None: as before, else one); not with KAFKA_BOOTSTRAP."""
        settings = self.settings
        secure_home(settings.home)  # 0700, tightened if made earlier (private_home.py)
        if settings.kafka_bootstrap or settings.kafka_security.security_protocol != "PLAINTEXT":
            if brokers is not None:
                raise ConfigError(
                    "--brokers starts a local Kafka: not with KAFKA_BOOTSTRAP or "
                    "KAFKA_SECURITY_PROTOCOL (that cluster's size is its own)"
                )
            # the preflight, or the error that secured Kafka needs KAFKA_BOOTSTRAP
            bootstrap = bootstrap_or_fail(settings)
        else:
            ensure_broker_jars(settings.cache_dir)
            one_broker = LocalKafka(data_dir=kafka_dir(settings))
            if brokers is not None and brokers > 1 and one_broker.is_running():
                raise ConfigError(
                    "a one-broker local Kafka is running: `spendbus down` first, then "
                    f"`spendbus up --brokers {brokers}`"
                )
            broker = local_broker(settings, brokers)
            broker.start()
            bootstrap = broker.bootstrap
        asyncio.run(
            ensure_topics(
                bootstrap,
                settings.topics,
                settings.partitions,
                security=settings.kafka_security,
                replication=settings.replication,
            )
        )
        if with_worker:
            worker_token(settings)  # $SPENDBUS_HOME/web.token unless configured (web_token.py)
            worker_process(settings, {"KAFKA_BOOTSTRAP": bootstrap}).start()
        return bootstrap

    def down(self) -> None:
        worker_process(self.settings).stop()
        if not self.settings.kafka_bootstrap:
            local_broker(self.settings).stop()

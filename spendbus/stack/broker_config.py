"""What a local broker node runs with: its server.properties (KRaft, tuned for tests on a
small machine) and its JVM's command line. kafka.py writes and launches them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def server_properties(
    *,
    node_id: int,
    port: int,
    controller_port: int,
    quorum: Mapping[int, int] | None,
    log_dir: Path,
    partitions_default: int,
    replication: int,
    min_insync_replicas: int,
) -> dict[str, str]:
    """A node's PLAINTEXT server.properties (``quorum``: node id -> controller port of every
    voter; None: this node alone). The SASL_SSL listener and overrides come on top."""
    quorum = quorum or {node_id: controller_port}
    voters = ",".join(f"{node}@127.0.0.1:{p}" for node, p in sorted(quorum.items()))
    rf, min_isr = str(replication), str(min_insync_replicas)
    return {
        # KRaft combined mode: each JVM is a controller (a voter) and a broker.
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        # Static quorum: ourselves, or every node of a LocalCluster. Chosen over the dynamic quorum
        # (controller.quorum.bootstrap.servers + format --standalone) because the static
        # voter's endpoint is read from this file at each start instead of being frozen into
        # the metadata log at format time, so nothing else depends on the controller port.
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        # Topics are declared explicitly (infra topics, faust changelogs); a typo in a topic
        # name must fail instead of silently creating a new topic.
        "auto.create.topics.enable": "false",
        "num.partitions": str(partitions_default),
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        # Internal topics default to RF 3 and would never be created on one node; on a
        # cluster they follow it (a lost broker must not lose the group offsets).
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Fewer partitions of internal topics (defaults 50): they are created on first use,
        # and creating 50 partitions costs seconds of a test's time.
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.num.partitions": "4",
        # After a crash (kill -9) the restarted broker cannot register until the controller
        # has expired the dead incarnation's session (default 9 s), which fault tests pay on
        # every crash-restart. 4 s stays well above the heartbeat interval, so a briefly
        # starved JVM on a loaded machine is not fenced.
        "broker.heartbeat.interval.ms": "1000",
        "broker.session.timeout.ms": "4000",
        # The first consumer group join would otherwise wait 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        # Compaction is what budget.verdicts, budget.policies, pricing and faust changelogs
        # rely on. The dedupe buffer defaults to 128 MiB of heap: 32 MiB fits a 512 MiB heap.
        "log.cleaner.enable": "true",
        "log.cleaner.threads": "1",
        # Look for dirty logs every 2 s (default 15 s), so tests can observe compaction.
        "log.cleaner.backoff.ms": "2000",
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        # Two cores: a handful of threads is plenty.
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
    }


def jvm_command(
    java: str,
    libs: Path,
    *,
    cds: Sequence[str],
    heap_min: str,
    heap_max: str,
    infra_dir: Path,
    data_dir: Path,
    log_level: str,
    jvm_opts: Sequence[str],
) -> list[str]:
    """The JVM and its options up to the main class (``cds``: class-archive options)."""
    return [
        java,
        *cds,
        f"-Xms{heap_min}",
        f"-Xmx{heap_max}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        # Die instead of limping on with a broken heap: a dead broker is an honest failure.
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={infra_dir / 'log4j2.yaml'}",
        f"-Dkafka.logs.dir={data_dir / 'logs'}",
        # lz4/snappy/zstd unpack their native libraries into java.io.tmpdir and leave them
        # behind when the JVM is killed: keep them in the data dir rather than in /tmp.
        f"-Djava.io.tmpdir={data_dir / 'tmp'}",
        f"-Dspendbus.kafka.loglevel={log_level}",
        *jvm_opts,
        "-cp",
        # The JVM expands "dir/*" to every jar in dir itself; no shell involved.
        f"{libs}/*",
    ]

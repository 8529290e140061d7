"""A local Kafka cluster of N KRaft nodes on 127.0.0.1, each a broker and a controller.

Every node is a :class:`~spendbus.stack.kafka.LocalKafka` in ``<data_dir>/node-<id>`` and a
voter of one static controller quorum, so three nodes survive the loss of any one: a broker
(its partitions' leaders move to the replicas in sync) and a voter (the two left elect a
controller). One node is what ``spendbus up`` starts by default; ``--brokers 3`` starts three.

``cluster.json`` in ``data_dir`` keeps the cluster id and every node's ports, so a restart (in
this process or another: ``spendbus down``) finds the same cluster at the same addresses.
Replication follows the size (``runtime.replication``): the internal topics and the default of
new topics get min(3, N) replicas, ``min.insync.replicas`` RF - 1 from three replicas on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.replication import ReplicationPolicy
from spendbus.stack.broker_jars import DEFAULT_INFRA_DIR
from spendbus.stack.broker_probe import free_ports
from spendbus.stack.broker_process import BrokerStartError, new_cluster_id
from spendbus.stack.kafka import LocalKafka

__all__ = ["CLUSTER_FILE", "LocalCluster"]

#: the cluster's own state file in its data dir (cluster id, ports of every node)
CLUSTER_FILE = "cluster.json"


@dataclass
class LocalCluster:
    """N local KRaft nodes (combined broker + controller), their state under ``data_dir``.

    ``heap_max`` is per node: three nodes at 384 MiB fit beside a test session's own broker.
    The first start picks the ports and the cluster id (``cluster.json``); every later start,
    and ``LocalCluster(data_dir)`` in another process, reuses them (``brokers`` then comes
    from the file).
    """

    data_dir: Path
    brokers: int = 3
    cache_dir: Path | None = None
    infra_dir: Path = DEFAULT_INFRA_DIR
    stop_with_parent: bool = True
    heap_max: str = "384m"
    heap_min: str = "128m"
    log_level: str = "WARN"
    #: more server.properties entries for every node
    extra_config: Mapping[str, str] = field(default_factory=dict)
    nodes: list[LocalKafka] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        state = self._read_state()
        if state:
            self.brokers = len(state["nodes"])
        elif self.brokers < 1:
            raise BrokerStartError(f"a cluster needs at least one broker, not {self.brokers}")
        else:
            ports = iter(free_ports(2 * self.brokers))
            state = {
                "cluster_id": new_cluster_id(),
                "nodes": {str(n): [next(ports), next(ports)] for n in range(1, self.brokers + 1)},
            }
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir / CLUSTER_FILE).write_text(json.dumps(state, indent=2))
        nodes = {int(n): (int(p), int(c)) for n, (p, c) in state["nodes"].items()}
        quorum = {n: c for n, (_, c) in nodes.items()}
        plan = ReplicationPolicy().plan(len(nodes))
        self.nodes = [
            LocalKafka(
                data_dir=self.data_dir / f"node-{n}",
                port=port,
                controller_port=cport,
                node_id=n,
                quorum=quorum,
                cluster_id=str(state["cluster_id"]),
                replication=plan.replication_factor,
                min_insync_replicas=plan.min_insync_replicas,
                partitions_default=1,
                cache_dir=self.cache_dir,
                infra_dir=self.infra_dir,
                stop_with_parent=self.stop_with_parent,
                heap_max=self.heap_max,
                heap_min=self.heap_min,
                log_level=self.log_level,
                extra_config=self.extra_config,
            )
            for n, (port, cport) in sorted(nodes.items())
        ]

    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads((self.data_dir / CLUSTER_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) and state.get("nodes") else {}

    @property
    def bootstrap(self) -> str:
        """Every node's listener, ``127.0.0.1:p1,127.0.0.1:p2,...``."""
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        return next(n for n in self.nodes if n.node_id == node_id)

    def running(self) -> list[LocalKafka]:
        return [n for n in self.nodes if n.is_running()]

    def is_running(self) -> bool:
        return bool(self.running())

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start every node that is not running (together: a quorum needs a majority to elect
        its controller) and wait until each of them lists all of them."""
        self._start_nodes([n for n in self.nodes if not n.is_running()], timeout)
        self.wait_ready(timeout, self.nodes)
        return self

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """(Re)start one node and wait until the cluster lists every running node again."""
        self._start_nodes([self.node(node_id)], timeout)
        self.wait_ready(timeout, self.running())

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every node at once (SIGKILL after ``timeout``): one after another, the last
        would wait for a quorum that is gone."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            for future in [pool.submit(n.stop, timeout) for n in self.nodes]:
                future.result()

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        self.node(node_id).stop(timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node: a crash (its data stays for a later start_node)."""
        self.node(node_id).kill()

    def wait_ready(self, timeout: float, nodes: Sequence[LocalKafka]) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            while not node.ready(timeout=2.0, brokers=len(nodes)):
                if not node.is_running():
                    raise BrokerStartError(
                        f"node {node.node_id} of the cluster in {self.data_dir} is not "
                        f"running.\n{node.log_tail()}"
                    )
                if time.monotonic() >= deadline:
                    raise BrokerStartError(
                        f"node {node.node_id} of the cluster in {self.data_dir} does not list "
                        f"{len(nodes)} brokers after {timeout:.0f}s.\n{node.log_tail()}"
                    )
                time.sleep(0.2)

    def _start_nodes(self, nodes: Sequence[LocalKafka], timeout: float) -> None:
        if not nodes:
            return
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            for future in [pool.submit(n.start, timeout) for n in nodes]:
                future.result()

    # ---- the controller quorum -------------------------------------------------------------

    def quorum_leader(self) -> int | None:
        """The node id of the active controller, as the newest epoch the running voters
        recorded (``quorum-state`` in their metadata log directory) says; None before any."""
        best: tuple[int, int] | None = None
        for node in self.running():
            try:
                state = json.loads(
                    (node.log_dir / "__cluster_metadata-0" / "quorum-state").read_text()
                )
            except (OSError, ValueError):
                continue
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader >= 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        return None if best is None else best[0]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A real single-node Apache Kafka broker (KRaft, broker + controller in one JVM), without Docker.

The broker comes from Maven Central (`spendbus/stack/broker/pom.xml`, fetched once into a cache folder by
:func:`~spendbus.stack.broker_jars.ensure_broker_jars`) and runs as a plain ``java -cp '<libs>/*' kafka.Kafka`` subprocess
managed by :class:`LocalKafka`. Everything binds to 127.0.0.1.

Layout of a broker's ``data_dir``::

    server.properties   written on every start (ports may be assigned on first start)
    state.json          ports, cluster id, version: lets another process re-attach / restart
    broker.pid          pid of the running JVM (removed by stop())
    broker.log          the JVM's stdout/stderr (appended across restarts)
    logs/server.log     log4j2 output, WARN by default (spendbus/stack/broker/log4j2.yaml)
    tmp/                the JVM's java.io.tmpdir (native libraries unpacked by compressors)
    kraft/              log.dirs: topic partitions and the __cluster_metadata log

Only the standard library is used, so this module can be imported before the virtualenv is
complete; readiness is probed with two raw Kafka protocol requests (broker_probe.py), the JVM
is handled as a process by broker_process.py, a SASL_SSL listener is set by broker_security.py.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.private_files import PRIVATE_UMASK
from spendbus.stack.broker_config import jvm_command, server_properties
from spendbus.stack.broker_jars import DEFAULT_INFRA_DIR, ensure_broker_jars, kafka_version
from spendbus.stack.broker_probe import broker_ready, free_ports
from spendbus.stack.broker_process import (
    START_BANNER,
    BrokerStartError,
    class_archive_path,
    file_lock,
    new_cluster_id,
    parent_death_signal_works,
    pid_alive,
    port_taken,
    proc_cmdline,
    promote_class_archive,
    set_parent_death_signal,
    tail_lines,
)
from spendbus.stack.broker_security import (
    SaslSslListener,
    sasl_ssl_properties,
    scram_format_args,
)
from spendbus.stack.private_home import open_private_log

__all__ = ["LocalKafka"]


# --------------------------------------------------------------------------------------------
# The broker
# --------------------------------------------------------------------------------------------


@dataclass
class LocalKafka:
    """One single-node KRaft Kafka broker whose whole state lives in ``data_dir``.

    ``port`` / ``controller_port`` of 0 mean "pick a free port on first start"; the chosen ports
    are saved in ``state.json`` and reused by every later start on the same data dir, so clients
    keep their bootstrap address across a broker restart. A ``LocalKafka(data_dir)`` built in
    another process re-attaches to a running broker (``is_running``, ``bootstrap``, ``stop``)
    through ``broker.pid`` and ``state.json``.

    ``stop_with_parent`` (default) ties the broker's life to the Python process that started it:
    it is stopped at interpreter exit, and when start() ran on the main thread Linux also SIGTERMs
    it if that process dies without cleaning up (kill -9). ``spendbus up`` passes False so the
    broker outlives the CLI; ``spendbus down`` then stops it from another process.
    """

    data_dir: Path
    port: int = 0
    controller_port: int = 0
    partitions_default: int = 1
    log_level: str = "WARN"
    heap_max: str = "512m"
    heap_min: str = "256m"
    stop_with_parent: bool = True
    cache_dir: Path | None = None
    infra_dir: Path = DEFAULT_INFRA_DIR
    java: str | None = None
    #: Extra JVM options appended after the defaults (later options win), e.g. ["-Xmx1g"].
    jvm_opts: Sequence[str] = ()
    #: Start the JVM from (and, the first time, record) a class-data-sharing archive kept next to
    #: the jars: markedly faster starts. See class_archive_path.
    class_archive: bool = True
    #: Extra/overriding server.properties entries, e.g. {"message.timestamp.after.max.ms": ...}.
    extra_config: Mapping[str, str] = field(default_factory=dict)
    #: A SASL_SSL listener with SCRAM users and deny-by-default ACLs (None: PLAINTEXT only).
    sasl_ssl: SaslSslListener | None = None
    #: its port; 0 = pick one on first start (kept in state.json like the others)
    sasl_ssl_port: int = 0
    #: this node's id in a cluster of several (spendbus/stack/cluster.py); 1 alone
    node_id: int = 1
    #: the controller quorum, node id -> controller port (every node of a LocalCluster is a
    #: voter); None: this node alone
    quorum: Mapping[int, int] | None = None
    #: the cluster id every node is formatted with (None: one made at the first start)
    cluster_id: str | None = None
    #: replicas of the internal topics (offsets, transactions) and the default of new topics;
    #: ``min_insync_replicas`` theirs. A cluster of N sets min(3, N) and RF - 1 from 3 on.
    replication: int = 1
    min_insync_replicas: int = 1

    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _atexit_registered: bool = field(default=False, init=False, repr=False)
    #: Size of logs/server.log when this object last launched the JVM: errors show what follows.
    _server_log_offset: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        state = self._read_state()
        stored_port = int(state.get("port", 0))
        stored_cport = int(state.get("controller_port", 0))
        # Re-attach / restart: adopt the ports this data dir was started with. A running broker's
        # ports win over the arguments, since that is where it actually listens.
        running = self.pid is not None
        if self.port == 0 or (running and stored_port):
            self.port = stored_port
        if self.controller_port == 0 or (running and stored_cport):
            self.controller_port = stored_cport
        stored_sport = int(state.get("sasl_ssl_port", 0))
        if self.sasl_ssl_port == 0 or (running and stored_sport):
            self.sasl_ssl_port = stored_sport

    # ---- paths -----------------------------------------------------------------------------

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def state_path(self) -> Path:
        return self.data_dir / "state.json"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_path(self) -> Path:
        """The JVM's stdout/stderr."""
        return self.data_dir / "broker.log"

    @property
    def server_log_path(self) -> Path:
        """log4j2's file (WARN and above unless log_level says otherwise)."""
        return self.data_dir / "logs" / "server.log"

    @property
    def log_dir(self) -> Path:
        """Kafka's log.dirs: partitions and the KRaft metadata log."""
        return self.data_dir / "kraft"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` for clients (aiokafka, faust ``kafka://`` + this)."""
        if self.port == 0:
            raise BrokerStartError(f"broker of {self.data_dir} has no port yet: start() it first")
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the SASL_SSL listener (``sasl_ssl`` must be set)."""
        if self.sasl_ssl is None or self.sasl_ssl_port == 0:
            raise BrokerStartError(f"broker of {self.data_dir} has no SASL_SSL listener (yet)")
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def pid(self) -> int | None:
        """Pid of the running broker JVM, None when it is not running."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        # Guard against pid reuse: the pid must be a kafka.Kafka JVM started on our properties.
        argv = proc_cmdline(pid)
        if argv is not None and not ("kafka.Kafka" in argv and str(self.properties_path) in argv):
            return None
        return pid

    def is_running(self) -> bool:
        return self.pid is not None

    def ready(self, timeout: float = 2.0, brokers: int = 1) -> bool:
        """True when the broker answers metadata with ``brokers`` registered (see broker_ready)."""
        return self.port != 0 and broker_ready("127.0.0.1", self.port, timeout, brokers)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LocalKafka:
        """Start the broker (formatting its storage on first use) and wait until it is ready.

        A no-op, apart from waiting for readiness, when the broker of this data dir is already
        running (in this or another process). Raises BrokerStartError with the tail of the
        broker's logs when the JVM exits or is not ready within ``timeout`` seconds; a JVM this
        call launched is then stopped, so a failed start leaves no half-started broker behind.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        launched = False
        with file_lock(self.data_dir / ".lock"):
            if not self.is_running():
                self._launch()
                launched = True
        try:
            self._wait_ready(timeout)
        except BrokerStartError:
            if launched:
                self.stop(timeout=10.0)
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the broker (a clean, controlled shutdown), SIGKILL it after ``timeout`` s.

        Works on a broker started by another process. Keeps data and ports for a later start().
        """
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the broker at once: a crash, for fault tests (the next start recovers logs)."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 60.0) -> LocalKafka:
        """stop() then start() on the same data dir and port."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of both broker logs (without stack frames), for error messages."""
        parts = []
        # The saved ports are reused on restart: one taken by another process is the usual cause.
        taken = [p for p in (self.port, self.controller_port) if p and port_taken(p)]
        if taken and not self.is_running():
            parts.append(
                f"hint: port(s) {taken} are taken by another process; free them, or delete "
                f"{self.state_path} to let the next start pick new ports."
            )
        # broker.log: only what the JVM printed since the last start (usually nothing).
        jvm_output = tail_lines(self.log_path, lines).rpartition(START_BANNER)[2]
        jvm_output = jvm_output.partition("\n")[2].strip()
        if jvm_output:
            parts.append(f"--- {self.log_path} ---\n{jvm_output}")
        server_log = tail_lines(self.server_log_path, lines, since=self._server_log_offset)
        if server_log:
            parts.append(f"--- {self.server_log_path} (last {lines} lines) ---\n{server_log}")
        return "\n".join(parts) or f"(nothing in the broker logs of {self.data_dir})"

    # ---- internals -------------------------------------------------------------------------

    def _read_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, **changes: Any) -> None:
        state = self._read_state() | changes
        tmp = self.state_path.with_suffix(".tmp")
        tmp.touch(mode=0o600)  # it may hold the broker's own password (sasl_ssl)
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.replace(self.state_path)

    def _server_properties(self) -> dict[str, str]:
        props = server_properties(
            node_id=self.node_id,
            port=self.port,
            controller_port=self.controller_port,
            quorum=self.quorum,
            log_dir=self.log_dir,
            partitions_default=self.partitions_default,
            replication=self.replication,
            min_insync_replicas=self.min_insync_replicas,
        )
        if self.sasl_ssl is not None:
            props.update(
                sasl_ssl_properties(
                    self.sasl_ssl,
                    port=self.port,
                    sasl_ssl_port=self.sasl_ssl_port,
                    controller_port=self.controller_port,
                    secret=self._broker_secret(),
                )
            )
        props.update({k: str(v) for k, v in self.extra_config.items()})
        return props

    def _broker_secret(self) -> str:
        """The broker's own password: made once, kept in state.json (the format used it)."""
        secret = self._read_state().get("broker_secret")
        if not secret:
            secret = secrets.token_urlsafe(24)
            self._write_state(broker_secret=secret)
        return str(secret)

    def _write_properties(self) -> None:
        lines = [
            "# Written by spendbus.stack.kafka.LocalKafka on every start; edits are overwritten.",
            *(f"{k}={v}" for k, v in self._server_properties().items()),
        ]
        # JAAS entries carry the broker's own password (sasl_ssl): owner-only
        self.properties_path.touch(mode=0o600)
        self.properties_path.chmod(0o600)
        self.properties_path.write_text("\n".join(lines) + "\n")

    def _java(self) -> str:
        if self.java:
            return self.java
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / "java").is_file():
            return str(Path(java_home) / "bin" / "java")
        found = shutil.which("java")
        if found is None:
            raise BrokerStartError(
                "java is not on PATH (Kafka 4.x needs Java 17+). Install a JDK or set JAVA_HOME, "
                "or set KAFKA_BOOTSTRAP to use an existing cluster."
            )
        return found

    def _jvm_args(self, libs: Path, cds: Sequence[str] = ()) -> list[str]:
        return jvm_command(
            self._java(),
            libs,
            cds=cds,
            heap_min=self.heap_min,
            heap_max=self.heap_max,
            infra_dir=self.infra_dir,
            data_dir=self.data_dir,
            log_level=self.log_level,
            jvm_opts=self.jvm_opts,
        )

    def _format_storage(self, libs: Path) -> None:
        """Format log.dirs once (what `kafka-storage.sh format` does); skipped when formatted."""
        if (self.log_dir / "meta.properties").is_file():
            return
        cluster_id = self.cluster_id or self._read_state().get("cluster_id") or new_cluster_id()
        self._write_state(cluster_id=cluster_id)
        cmd = [
            *self._jvm_args(libs, self._class_archive_opts(libs, record=False)),
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.properties_path),
        ]
        if self.sasl_ssl is not None:  # the StorageTool takes SCRAM credentials only in argv
            cmd += scram_format_args(self.sasl_ssl, self._broker_secret())
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            raise BrokerStartError(
                f"formatting the broker storage in {self.log_dir} failed "
                f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr).strip()}"
            )

    def _launch(self) -> None:
        libs = ensure_broker_jars(self.cache_dir, infra_dir=self.infra_dir)
        if (
            self.port == 0
            or self.controller_port == 0
            or (self.sasl_ssl and not self.sasl_ssl_port)
        ):
            picked = iter(free_ports(3))
            self.port = self.port or next(picked)
            self.controller_port = self.controller_port or next(picked)
            if self.sasl_ssl is not None:
                self.sasl_ssl_port = self.sasl_ssl_port or next(picked)
        if self.port == self.controller_port:
            raise BrokerStartError(f"port and controller_port are both {self.port}")
        (self.data_dir / "logs").mkdir(exist_ok=True)
        (self.data_dir / "tmp").mkdir(exist_ok=True)
        self._write_properties()
        self._settle_class_archive()  # one recorded by this data dir's previous JVM
        self._format_storage(libs)
        cds = self._class_archive_opts(libs, record=True)
        self._write_state(
            port=self.port,
            controller_port=self.controller_port,
            sasl_ssl_port=self.sasl_ssl_port,
            kafka_version=kafka_version(self.infra_dir),
            bootstrap=f"127.0.0.1:{self.port}",
            # What a stop() in another process needs to settle a recorded class archive.
            libs=str(libs),
            java=self._java(),
        )

        with contextlib.suppress(OSError):
            self._server_log_offset = self.server_log_path.stat().st_size
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open_private_log(self.log_path) as log:  # 0600
            log.write(
                f"\n{START_BANNER} {time.strftime('%Y-%m-%dT%H:%M:%S')} "
                f"bootstrap=127.0.0.1:{self.port} ===\n".encode()
            )
            log.flush()
            # Own session: a Ctrl-C aimed at the caller's terminal does not reach the JVM, which
            # is stopped in order by stop() (or by the parent-death signal below).
            self._proc = subprocess.Popen(
                [*self._jvm_args(libs, cds), "kafka.Kafka", str(self.properties_path)],
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=PRIVATE_UMASK,  # the topics' segments and server.log: 0600/0700
                # PR_SET_PDEATHSIG fires when the *thread* that forked exits; only the main
                # thread lives as long as the process, so it is used only from there.
                preexec_fn=(
                    set_parent_death_signal
                    if self.stop_with_parent and on_main_thread and parent_death_signal_works()
                    else None
                ),
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        if self.stop_with_parent and not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _class_archive_opts(self, libs: Path, *, record: bool) -> list[str]:
        """JVM options to start from the class archive, or (``record``) to record one at exit."""
        if not self.class_archive:
            return []
        final = class_archive_path(libs, self._java())
        if final.is_file():
            return [f"-XX:SharedArchiveFile={final}"]
        if not record:
            return []
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f"{final.stem}.{uuid.uuid4().hex[:12]}.partial")
        self._write_state(cds_partial=str(partial), cds_final=str(final))
        return [f"-XX:ArchiveClassesAtExit={partial}"]

    def _settle_class_archive(self) -> None:
        """Check and keep (or drop) the archive this data dir's last JVM recorded at its exit.

        Called only when that JVM is gone (after stop()/kill(), or before the next launch), so
        the file is complete or will never be.
        """
        state = self._read_state()
        partial, final, libs = state.get("cds_partial"), state.get("cds_final"), state.get("libs")
        if not (partial and final and libs):
            return
        self._write_state(cds_partial=None, cds_final=None)
        promote_class_archive(
            Path(partial), Path(final), state.get("java") or self._java(), Path(libs)
        )

    def _stop_at_exit(self) -> None:
        # Only the broker this object launched; never one re-attached from another process.
        if self._proc is not None and self._proc.poll() is None:
            self.stop(timeout=15.0)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.ready(timeout=min(2.0, max(0.2, deadline - time.monotonic()))):
                return
            if not self.is_running():
                code = self._proc.poll() if self._proc is not None else None
                raise BrokerStartError(
                    f"Kafka broker in {self.data_dir} exited during startup"
                    f"{'' if code is None else f' (exit code {code})'}.\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise BrokerStartError(
                    f"Kafka broker in {self.data_dir} (pid {self.pid}, bootstrap "
                    f"{self.bootstrap}) not ready after {timeout:.0f}s.\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if not self._wait_exit(pid, timeout) and sig != signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, 10.0)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)  # reap our child so it is not left a zombie
            self._proc = None
        self.pid_path.unlink(missing_ok=True)
        if self.pid is None:
            self._settle_class_archive()

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

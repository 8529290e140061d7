"""A real single-node Apache Kafka broker (KRaft, broker + controller in one JVM), without Docker.

The broker comes from Maven Central (`spendbus/stack/broker/pom.xml`, fetched once into a cache folder by
:func:`ensure_broker_jars`) and runs as a plain ``java -cp '<libs>/*' kafka.Kafka`` subprocess
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
complete; readiness is probed with two raw Kafka protocol requests (ApiVersions, Metadata).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import ctypes.util
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_INFRA_DIR",
    "BrokerFetchError",
    "BrokerStartError",
    "LocalKafka",
    "SaslSslListener",
    "broker_ready",
    "ensure_broker_jars",
    "free_port",
    "kafka_version",
]

#: Where pom.xml and log4j2.yaml live: package data beside this module, so an installed
#: wheel fetches and starts the broker as a checkout does.
DEFAULT_INFRA_DIR = Path(__file__).resolve().parent / "broker"

#: Written into the libs folder once every jar has been copied; holds the pom's hash and the jar
#: count, so an interrupted fetch, a deleted jar or an edited pom all trigger a new fetch.
_MARKER = ".spendbus-complete.json"

_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class BrokerStartError(RuntimeError):
    """The local broker could not be started, or did not become ready in time."""


class BrokerFetchError(BrokerStartError):
    """Maven could not fetch the broker jars (a start cannot happen without them)."""


# --------------------------------------------------------------------------------------------
# Fetching the broker
# --------------------------------------------------------------------------------------------


def kafka_version(infra_dir: Path = DEFAULT_INFRA_DIR) -> str:
    """The Kafka version pinned in ``infra_dir/pom.xml`` (property ``kafka.version``).

    The pom is the single place the version is written; the cache folder is named after it.
    """
    pom = infra_dir / "pom.xml"
    try:
        root = ET.parse(pom).getroot()
    except (OSError, ET.ParseError) as exc:
        raise BrokerFetchError(f"cannot read the broker pom {pom}: {exc}") from exc
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise BrokerFetchError(f"{pom} has no <properties><kafka.version>")
    return (node.text or "").strip()


def _default_cache_root() -> Path:
    # Fixed, like spendbus.settings' default: the CLI passes SPENDBUS_CACHE_DIR explicitly.
    return Path.home() / ".cache" / "spendbus"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the duration of the block.

    Serialises concurrent fetches into one cache and concurrent start()s on one data dir
    (e.g. two pytest processes); the kernel releases it if the holder dies.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _libs_complete(libs: Path, pom_digest: str, version: str) -> bool:
    try:
        marker = json.loads((libs / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("pom_sha256") != pom_digest:
        return False
    jars = list(libs.glob("*.jar"))
    return len(jars) == marker.get("jars") and (libs / f"kafka_2.13-{version}.jar").is_file()


def ensure_broker_jars(
    cache_dir: Path | None = None,
    *,
    infra_dir: Path = DEFAULT_INFRA_DIR,
    mvn: str | None = None,
    timeout: float = 900.0,
) -> Path:
    """Return a folder holding the broker and all its runtime jars, fetching them if needed.

    ``cache_dir`` is the spendbus cache root (default ``~/.cache/spendbus``); the jars go to ``<cache_dir>/kafka-<version>/libs``. Idempotent and
    quick once fetched: Maven runs only when that folder is missing or incomplete. The fetch goes
    to a temporary folder renamed into place at the end, so an interrupted fetch never looks
    complete.
    """
    version = kafka_version(infra_dir)
    pom = infra_dir / "pom.xml"
    pom_digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    base = (cache_dir or _default_cache_root()).expanduser().resolve() / f"kafka-{version}"
    libs = base / "libs"
    if _libs_complete(libs, pom_digest, version):
        return libs

    with _file_lock(base.parent / f"kafka-{version}.lock"):
        if _libs_complete(libs, pom_digest, version):  # fetched by someone else meanwhile
            return libs
        mvn_bin = mvn or shutil.which("mvn")
        if mvn_bin is None:
            raise BrokerFetchError(
                "Maven (mvn) is not on PATH: it is needed once to fetch the Kafka broker jars "
                f"into {libs}. Install Maven, or set KAFKA_BOOTSTRAP to use an existing cluster."
            )
        staging = base / f"libs.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn_bin,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BrokerFetchError(
                f"mvn did not finish in {timeout:.0f}s: {' '.join(cmd)}"
            ) from exc
        jars = sorted(staging.glob("*.jar")) if staging.is_dir() else []
        if proc.returncode != 0 or not (staging / f"kafka_2.13-{version}.jar").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            # Maven 3.8 colours some lines even in batch mode; keep the message plain.
            plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
            output = plain.strip().splitlines()[-40:]
            raise BrokerFetchError(
                f"mvn failed (exit {proc.returncode}) fetching Kafka {version}:\n"
                f"  {' '.join(cmd)}\n" + "\n".join(output)
            )
        (staging / _MARKER).write_text(
            json.dumps({"pom_sha256": pom_digest, "jars": len(jars), "version": version})
        )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        # A class archive is only valid for the exact jars it was recorded from.
        shutil.rmtree(base / "cds", ignore_errors=True)
    return libs


# --------------------------------------------------------------------------------------------
# Ports and the readiness probe
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    return _free_ports(1)[0]


def _free_ports(n: int) -> list[int]:
    # Hold all sockets open until every port is chosen, so the n ports are distinct.
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_API_METADATA = 3
_API_VERSIONS = 18
# Metadata v4..v8 share one request layout (v8 adds two booleans we do not send). Kafka 4.0
# removed v0-v3 (KIP-896), so v4 is the oldest that any 4.x broker still answers.
_METADATA_VERSION = 4


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """Send one request with a v1 header (non-flexible) and return the response body."""
    client_id = b"spendbus-probe"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    data = _recv_exact(sock, size)
    (got_corr,) = struct.unpack_from(">i", data, 0)
    if got_corr != corr:
        raise ConnectionError(f"correlation id mismatch ({got_corr} != {corr})")
    return data[4:]  # response header v0 is only the correlation id


def broker_ready(host: str, port: int, timeout: float = 2.0, brokers: int = 1) -> bool:
    """True when the broker at host:port answers ApiVersions and lists at least ``brokers``
    brokers (a node of a :class:`~spendbus.stack.cluster.LocalCluster` waits for all of them).

    A KRaft broker opens its listener before it has registered with the controller and been
    unfenced; Metadata lists only unfenced brokers, so a non-empty broker list means topics can
    be created and produced to. Works for any Kafka >= 4.0 (and 3.x, which still has v4).
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            body = _request(sock, _API_VERSIONS, 0, 1, b"")
            error_code, count = struct.unpack_from(">hi", body, 0)
            if error_code != 0:
                return False
            ranges = {
                key: (lo, hi)
                for key, lo, hi in (
                    struct.unpack_from(">hhh", body, 6 + 6 * i) for i in range(count)
                )
            }
            lo, hi = ranges.get(_API_METADATA, (0, -1))
            if not lo <= _METADATA_VERSION <= hi:
                # A future broker without Metadata v4: answering ApiVersions is the best we know.
                return True
            # topics = [] (brokers only), allow_auto_topic_creation = false
            body = _request(sock, _API_METADATA, _METADATA_VERSION, 2, struct.pack(">ib", 0, 0))
            _throttle_ms, n_brokers = struct.unpack_from(">ii", body, 0)
            return bool(n_brokers >= max(1, brokers))
    except (OSError, ConnectionError, struct.error):
        return False


# --------------------------------------------------------------------------------------------
# Process helpers
# --------------------------------------------------------------------------------------------


def _proc_cmdline(pid: int) -> list[str] | None:
    """The argv of pid from /proc, None when there is no such process or no /proc."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pid_alive(pid: int) -> bool:
    """True if pid exists and has not exited (a zombie, not yet reaped by its parent, has).

    Every thread is looked at, not only the leader: while a JVM exits, its main thread is
    already a zombie for a moment during which hundreds of other threads are still tearing down,
    and the parent cannot reap it yet.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True  # no /proc: trust kill(0)
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # that thread is gone
        # The state field follows the ")" that closes the command name (which may hold spaces).
        if stat[stat.rindex(")") + 2] not in "ZX":
            return True
    return False


_libc: Any = None


def _set_parent_death_signal() -> None:
    """preexec_fn: ask Linux to SIGTERM the broker when the thread that started it exits.

    That is what keeps a kill -9'd test run from leaving a JVM bound to its ports. No-op where
    prctl does not exist.
    """
    if _libc is not None:
        _libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _tail(path: Path, lines: int, since: int = 0) -> str:
    """The last ``lines`` lines of a log written after byte offset ``since``, without Java stack
    frames (the "Caused by" lines stay). A file now shorter than ``since`` was rolled: all counts.
    """
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            since = since if since <= size else 0
            fh.seek(max(since, size - 256 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [
        line
        for line in text.splitlines()
        if not line.lstrip().startswith("at ") and not line.lstrip().startswith("... ")
    ]
    return "\n".join(kept[-lines:])


def _port_taken(port: int) -> bool:
    """True when something (anything) is bound to 127.0.0.1:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


#: First words of the line the launcher appends to broker.log before each start.
_START_BANNER = "=== spendbus: starting broker"


def _new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (what Uuid.toString gives).

    Kafka's own generator also avoids ids starting with "-" (they read as CLI options).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


# --------------------------------------------------------------------------------------------
# Class-data sharing: a faster JVM start
# --------------------------------------------------------------------------------------------
#
# Most of a broker start on a small machine is the JVM loading and verifying ~6k classes. An
# AppCDS archive of those classes (JDK 13+ "dynamic archive") cuts a warm start by ~40 %
# (4.8 s -> 2.9 s here). The first broker started without an archive records one at its clean
# exit (-XX:ArchiveClassesAtExit) into a ".partial" file; once that JVM is gone the partial is
# checked by mapping it in a throwaway JVM (-Xshare:on) and only then renamed into place. The
# check matters: a truncated archive (JVM killed while writing it) crashes every JVM that maps it
# with SIGBUS, whereas a missing or mismatched one merely costs the speed-up.


def _class_archive_path(libs: Path, java: str) -> Path:
    """The archive for these jars and this JDK (an upgraded JDK gets a new one)."""
    real = Path(java).resolve()
    ident = [str(real)]
    for part in (real, real.parent.parent / "lib" / "server" / "libjvm.so"):
        with contextlib.suppress(OSError):
            st = part.stat()
            ident.append(f"{st.st_size}:{st.st_mtime_ns}")
    key = hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]
    return libs.parent / "cds" / f"broker-{key}.jsa"


def _promote_class_archive(partial: Path, final: Path, java: str, libs: Path) -> None:
    """Rename a recorded archive into place if a JVM can map it; delete it otherwise."""
    if not partial.is_file():
        return
    try:
        if not final.is_file():
            check = subprocess.run(
                [
                    java,
                    "-Xshare:on",  # fail (instead of silently not sharing) if it cannot be used
                    f"-XX:SharedArchiveFile={partial}",
                    f"-XX:ErrorFile={partial.parent / 'hs_err_check.log'}",
                    "-cp",
                    f"{libs}/*",
                    "kafka.tools.StorageTool",
                    "random-uuid",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                check=False,
            )
            if check.returncode == 0:
                os.replace(partial, final)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        partial.unlink(missing_ok=True)
        (partial.parent / "hs_err_check.log").unlink(missing_ok=True)
    # Partials of brokers that died without anyone settling them (e.g. their data dir was a
    # deleted tmp dir) would otherwise pile up at ~50 MB each.
    for stale in final.parent.glob("*.partial"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 24 * 3600:
                stale.unlink()


# --------------------------------------------------------------------------------------------
# A secured listener
# --------------------------------------------------------------------------------------------

#: the broker's own SCRAM user (inter-broker listener) and PLAIN user (controller listener)
BROKER_USER = "broker"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
_STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class SaslSslListener:
    """A SASL_SSL listener (SCRAM-SHA-512 and -256) beside the PLAINTEXT one, with Kafka's
    StandardAuthorizer denying whatever no ACL allows.

    ``users`` (name -> password) get SCRAM credentials for both mechanisms when the storage is
    formatted (``kafka-storage format --add-scram``), so they exist before the first client
    connects; the set is fixed from then on. ``super_users`` bypass the ACLs (an operator's
    admin); the broker's own user is always one. ``keystore`` is a PEM file holding the
    broker's private key (unencrypted PKCS#8) and certificate chain, ``truststore`` a PEM file
    with the CA: Kafka 4.x reads PEM stores directly.

    The PLAINTEXT listener stays for the readiness probe (ApiVersions and the broker list,
    which need no ACL); its principal, ``User:ANONYMOUS``, is not a super user, so the ACLs
    refuse it everything else. The controller listener authenticates the broker with PLAIN.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str]
    super_users: Sequence[str] = ("admin",)

    def __repr__(self) -> str:  # never the passwords
        return f"SaslSslListener(users={sorted(self.users)}, super_users={list(self.super_users)})"


def _jaas(module: str, user: str, password: str, **extra: str) -> str:
    options = " ".join(
        f'{k}="{v}"' for k, v in {"username": user, "password": password, **extra}.items()
    )
    return f"org.apache.kafka.common.security.{module} required {options};"


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
    #: the jars: ~40 % faster starts. See _class_archive_path.
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
        if not _pid_alive(pid):
            return None
        # Guard against pid reuse: the pid must be a kafka.Kafka JVM started on our properties.
        argv = _proc_cmdline(pid)
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
        with _file_lock(self.data_dir / ".lock"):
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
        taken = [p for p in (self.port, self.controller_port) if p and _port_taken(p)]
        if taken and not self.is_running():
            parts.append(
                f"hint: port(s) {taken} are taken by another process; free them, or delete "
                f"{self.state_path} to let the next start pick new ports."
            )
        # broker.log: only what the JVM printed since the last start (usually nothing).
        jvm_output = _tail(self.log_path, lines).rpartition(_START_BANNER)[2]
        jvm_output = jvm_output.partition("\n")[2].strip()
        if jvm_output:
            parts.append(f"--- {self.log_path} ---\n{jvm_output}")
        server_log = _tail(self.server_log_path, lines, since=self._server_log_offset)
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
        port, cport = self.port, self.controller_port
        quorum = self.quorum or {self.node_id: cport}
        voters = ",".join(f"{node}@127.0.0.1:{p}" for node, p in sorted(quorum.items()))
        rf, min_isr = str(self.replication), str(self.min_insync_replicas)
        props = {
            # KRaft combined mode: each JVM is a controller (a voter) and a broker.
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            # Static quorum: ourselves, or every node of a LocalCluster. Chosen over the dynamic quorum
            # (controller.quorum.bootstrap.servers + format --standalone) because the static
            # voter's endpoint is read from this file at each start instead of being frozen into
            # the metadata log at format time, so nothing else depends on the controller port.
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            # Topics are declared explicitly (infra topics, faust changelogs); a typo in a topic
            # name must fail instead of silently creating a new topic.
            "auto.create.topics.enable": "false",
            "num.partitions": str(self.partitions_default),
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
        if self.sasl_ssl is not None:
            props.update(self._sasl_ssl_properties(self.sasl_ssl))
        props.update({k: str(v) for k, v in self.extra_config.items()})
        return props

    def _broker_secret(self) -> str:
        """The broker's own password: made once, kept in state.json (the format used it)."""
        secret = self._read_state().get("broker_secret")
        if not secret:
            secret = secrets.token_urlsafe(24)
            self._write_state(broker_secret=secret)
        return str(secret)

    def _sasl_ssl_properties(self, listener: SaslSslListener) -> dict[str, str]:
        port, sport, cport = self.port, self.sasl_ssl_port, self.controller_port
        secret = self._broker_secret()
        scram = _jaas("scram.ScramLoginModule", BROKER_USER, secret)
        props = {
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sport},"
                f"CONTROLLER://127.0.0.1:{cport}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sport}",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
            ),
            # the broker's own connections authenticate too: SCRAM between brokers, PLAIN to
            # the controller (SCRAM credentials live in the metadata the controller serves)
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": _jaas(
                "plain.PlainLoginModule", BROKER_USER, secret, **{f"user_{BROKER_USER}": secret}
            ),
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
            **{
                f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config": scram
                for m in SCRAM_MECHANISMS
            },
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(listener.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(listener.truststore),
            "authorizer.class.name": _STANDARD_AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(
                f"User:{u}" for u in dict.fromkeys([BROKER_USER, *listener.super_users])
            ),
        }
        return props

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
        return [
            self._java(),
            *cds,
            f"-Xms{self.heap_min}",
            f"-Xmx{self.heap_max}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            # Die instead of limping on with a broken heap: a dead broker is an honest failure.
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.infra_dir / 'log4j2.yaml'}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            # lz4/snappy/zstd unpack their native libraries into java.io.tmpdir and leave them
            # behind when the JVM is killed: keep them in the data dir rather than in /tmp.
            f"-Djava.io.tmpdir={self.data_dir / 'tmp'}",
            f"-Dspendbus.kafka.loglevel={self.log_level}",
            *self.jvm_opts,
            "-cp",
            # The JVM expands "dir/*" to every jar in dir itself; no shell involved.
            f"{libs}/*",
        ]

    def _format_storage(self, libs: Path) -> None:
        """Format log.dirs once (what `kafka-storage.sh format` does); skipped when formatted."""
        if (self.log_dir / "meta.properties").is_file():
            return
        cluster_id = self.cluster_id or self._read_state().get("cluster_id") or _new_cluster_id()
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
            *self._scram_format_args(),
        ]
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            raise BrokerStartError(
                f"formatting the broker storage in {self.log_dir} failed "
                f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr).strip()}"
            )

    def _scram_format_args(self) -> list[str]:
        """``--add-scram`` for the broker's user and every listener user, both mechanisms.

        The StorageTool takes credentials only as arguments: this short-lived local JVM, on a
        test's own broker, is the one place spendbus passes a password in argv.
        """
        if self.sasl_ssl is None:
            return []
        users = {BROKER_USER: self._broker_secret(), **self.sasl_ssl.users}
        return [
            arg
            for name, password in users.items()
            for mechanism in SCRAM_MECHANISMS
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]

    def _launch(self) -> None:
        libs = ensure_broker_jars(self.cache_dir, infra_dir=self.infra_dir)
        if (
            self.port == 0
            or self.controller_port == 0
            or (self.sasl_ssl and not self.sasl_ssl_port)
        ):
            picked = iter(_free_ports(3))
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
        with self.log_path.open("ab") as log:
            log.write(
                f"\n{_START_BANNER} {time.strftime('%Y-%m-%dT%H:%M:%S')} "
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
                # PR_SET_PDEATHSIG fires when the *thread* that forked exits; only the main
                # thread lives as long as the process, so it is used only from there.
                preexec_fn=(
                    _set_parent_death_signal
                    if self.stop_with_parent and on_main_thread and _libc is not None
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
        final = _class_archive_path(libs, self._java())
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
        _promote_class_archive(
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
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

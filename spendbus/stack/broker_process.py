"""The broker's JVM as an operating-system process: pids, signals, logs, ports, cluster ids
and the class-data-sharing archive that makes a JVM start faster."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "START_BANNER",
    "BrokerStartError",
    "class_archive_path",
    "file_lock",
    "new_cluster_id",
    "parent_death_signal_works",
    "pid_alive",
    "port_taken",
    "proc_cmdline",
    "promote_class_archive",
    "set_parent_death_signal",
    "tail_lines",
]


class BrokerStartError(RuntimeError):
    """The local broker could not be started, or did not become ready in time."""


# --------------------------------------------------------------------------------------------
# Process helpers
# --------------------------------------------------------------------------------------------


def proc_cmdline(pid: int) -> list[str] | None:
    """The argv of pid from /proc, None when there is no such process or no /proc."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def pid_alive(pid: int) -> bool:
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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
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


_libc: Any = None


def set_parent_death_signal() -> None:
    """preexec_fn: ask Linux to SIGTERM the broker when the thread that started it exits.

    That is what keeps a kill -9'd test run from leaving a JVM bound to its ports. No-op where
    prctl does not exist.
    """
    if _libc is not None:
        _libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def parent_death_signal_works() -> bool:
    """Whether :func:`set_parent_death_signal` does anything here (Linux with a libc)."""
    return _libc is not None


def tail_lines(path: Path, lines: int, since: int = 0) -> str:
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


def port_taken(port: int) -> bool:
    """True when something (anything) is bound to 127.0.0.1:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


#: First words of the line the launcher appends to broker.log before each start.
START_BANNER = "=== spendbus: starting broker"


def new_cluster_id() -> str:
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
# AppCDS archive of those classes (JDK 13+ "dynamic archive") cuts a good part of a warm
# start (bench/records/comment_figures_2026-12-07.jsonl). The first broker started without an archive records one at its clean
# exit (-XX:ArchiveClassesAtExit) into a ".partial" file; once that JVM is gone the partial is
# checked by mapping it in a throwaway JVM (-Xshare:on) and only then renamed into place. The
# check matters: a truncated archive (JVM killed while writing it) crashes every JVM that maps it
# with SIGBUS, whereas a missing or mismatched one merely costs the speed-up.


def class_archive_path(libs: Path, java: str) -> Path:
    """The archive for these jars and this JDK (an upgraded JDK gets a new one)."""
    real = Path(java).resolve()
    ident = [str(real)]
    for part in (real, real.parent.parent / "lib" / "server" / "libjvm.so"):
        with contextlib.suppress(OSError):
            st = part.stat()
            ident.append(f"{st.st_size}:{st.st_mtime_ns}")
    key = hashlib.sha256("|".join(ident).encode()).hexdigest()[:16]
    return libs.parent / "cds" / f"broker-{key}.jsa"


def promote_class_archive(partial: Path, final: Path, java: str, libs: Path) -> None:
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

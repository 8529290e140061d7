"""The owner's side of an embedded store's engine process (``engine_host.py``): start it,
call it, kill it when a query outlives its limit, start it again on the next call.

:class:`EngineLink` is the process; :meth:`EngineLink.client` a session on it that
answers what the sink, the guard and the worker's own reads ask of a clickhouse-connect
client (``query``, ``command``, ``insert``, ``close``). A session whose settings hold
``max_execution_time`` has each call killed (the whole process, so every call in flight
fails as ``OperationalError``, which the sink retries) once it outlives that limit by
``kill_grace`` seconds: the engine checks the limit only between blocks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Final

import chdb
import clickhouse_connect
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from aggregator.sink import errors as sink_errors
from aggregator.sink.engine_wire import receive_frame, send_frame
from aggregator.sink.errors import SinkUnavailable

log = logging.getLogger(__name__)

#: what the engine may read besides the store: the system's libraries and time zones
SYSTEM_READ_ONLY: Final = (
    "/usr/lib",
    "/usr/lib64",
    "/lib",
    "/lib64",
    "/usr/share/zoneinfo",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    # the engine's own figures (its stack, memory and CPU limits), never its environ
    "/proc/self/maps",
    "/proc/self/stat",
    "/proc/self/statm",
    "/proc/self/status",
    "/proc/self/cgroup",
    "/proc/self/mountinfo",
    "/proc/meminfo",
    "/proc/cpuinfo",
    "/proc/stat",
    "/proc/loadavg",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
)
#: the engine process's script (run by path: engine_host.py says why)
ENGINE_HOST: Final = Path(__file__).resolve().parent / "engine_host.py"
#: the environment the engine's process gets: nothing secret, only what Python needs
PASSED_ENVIRONMENT: Final = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "SPENDBUS_PURE")


class EngineError(DatabaseError):
    """The engine's own error, raised again in the owner with its code."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class EngineKilled(OperationalError):
    """The engine's process was killed (a query past its limit) or ended while a call ran."""

    #: read by the guard (which names the limit) without importing this module
    killed = True


#: the project's packages the engine's process imports from (aggregator's sink, and what
#: it stands on)
SPENDBUS_PACKAGES: Final = ("aggregator", "runtime", "schemas")


def code_roots() -> list[str]:
    """The folders this process imported spendbus's packages from (their parents)."""
    return sorted(
        {
            str(Path(sys.modules[name].__file__ or "").resolve().parent.parent)
            for name in SPENDBUS_PACKAGES
        }
    )


def code_folders() -> list[Path]:
    """Where the engine process's code comes from: Python's own folders, the packages'
    and their compiled libraries (not the folder around them: it may hold .spendbus)."""
    paths = sysconfig.get_paths()
    folders = {Path(paths[name]) for name in ("stdlib", "platstdlib", "purelib", "platlib")} | {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
    }
    packages = [sys.modules[name] for name in SPENDBUS_PACKAGES]
    for module in (chdb, clickhouse_connect, *packages):
        package = Path(module.__file__ or "").resolve().parent
        folders.add(package)
        # the compiled groups' shared libraries sit beside the packages (setup.py)
        folders.update(package.parent.glob("*__mypyc.*.so"))
    return sorted(folders)


class _Running:
    """One started process: its socket and the calls waiting for its replies."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.alive = True
        self.pending: dict[int, Future[Any]] = {}
        self.lock = threading.Lock()
        self.sending = threading.Lock()

    def end(self, why: str) -> None:
        """No call waits on this process any more: each fails with EngineKilled."""
        with self.lock:
            self.alive = False
            pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(EngineKilled(why))


class EngineLink:
    """One engine process for the store at ``path`` (started on the first call)."""

    def __init__(
        self,
        dsn: str,
        path: str,
        spool_dir: str | None,
        *,
        kill_grace: float,
        require_wall: bool = True,
    ) -> None:
        self.dsn = dsn
        self.path = path
        self.spool_dir = spool_dir
        self.kill_grace = kill_grace
        self.require_wall = require_wall
        self.starts = 0
        self.kills = 0
        self.landlock_abi = 0
        self._lock = threading.Lock()
        self._running: _Running | None = None
        self._scratch: str | None = None
        self._ids = itertools.count(1)
        self._sessions = itertools.count(1)

    @property
    def pid(self) -> int | None:
        running = self._running
        if running is None or not running.alive or running.process.poll() is not None:
            return None
        return running.process.pid

    def client(self, **settings: Any) -> EngineClient:
        """A session of its own on the engine, with ``settings``."""
        return EngineClient(self, next(self._sessions), settings)

    # -- the process ---------------------------------------------------------------------

    def _current(self) -> _Running:
        with self._lock:
            running = self._running
            if running is None or not running.alive or running.process.poll() is not None:
                running = self._running = self._start()
            return running

    def _start(self) -> _Running:
        if self._running is not None:
            self._end(self._running, "restarting the engine's process")
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        ours, theirs = socket.socketpair()
        self._scratch = tempfile.mkdtemp(prefix="spendbus-engine-")
        environment = {k: os.environ[k] for k in PASSED_ENVIRONMENT if k in os.environ}
        environment["TMPDIR"] = self._scratch
        # the same code as this process's, wherever it was imported from (a checkout run
        # in place, a copy): the wall lets the engine's process read only these folders
        environment["PYTHONPATH"] = os.pathsep.join(
            [*code_roots(), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
        )
        try:
            process = subprocess.Popen(
                [sys.executable, str(ENGINE_HOST), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=environment,
            )
        finally:
            theirs.close()
        read_only = [str(p) for p in code_folders()] + list(SYSTEM_READ_ONLY)
        if self.spool_dir:
            read_only.append(self.spool_dir)
        Path(self.path).mkdir(mode=0o700, parents=True, exist_ok=True)
        config = {
            "dsn": self.dsn,
            "scratch": self._scratch,
            "read_write": [self.path, self._scratch],
            "read_only": read_only,
            "require_wall": self.require_wall,
        }
        try:
            send_frame(ours, ("config", config))
            answer = receive_frame(ours)
        except (EOFError, OSError) as exc:
            ours.close()
            _reap(process)
            raise SinkUnavailable(f"the engine's process did not start: {exc}") from exc
        if answer[0] != "ready":
            ours.close()
            _reap(process)
            raise sink_errors.SinkRejected(str(answer[1]))
        self.landlock_abi = int(answer[1])
        self.starts += 1
        running = _Running(process, ours)
        threading.Thread(
            target=self._read_replies, args=(running,), name="engine-replies", daemon=True
        ).start()
        return running

    def _read_replies(self, running: _Running) -> None:
        try:
            while True:
                _, call_id, ok, outcome = receive_frame(running.sock)
                with running.lock:
                    future = running.pending.pop(call_id, None)
                if future is None:
                    continue
                if ok:
                    future.set_result(outcome)
                else:
                    future.set_exception(_error(*outcome))
        except (EOFError, OSError):
            pass
        running.end("the engine's process ended")

    def _end(self, running: _Running, why: str) -> None:
        with contextlib.suppress(OSError):
            running.sock.shutdown(socket.SHUT_RDWR)
        _reap(running.process)
        running.end(why)

    def kill(self, why: str) -> None:
        """End the process now: every call in flight fails with EngineKilled."""
        running = self._running
        if running is None or not running.alive:
            return
        self.kills += 1
        log.warning("killing the engine's process (pid %d): %s", running.process.pid, why)
        self._end(running, why)

    def close(self) -> None:
        with self._lock:
            running, self._running = self._running, None
            if running is not None:
                self._end(running, "the store was closed")
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None

    # -- calls ---------------------------------------------------------------------------

    def call(
        self,
        session: int,
        settings: dict[str, Any],
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        running = self._current()
        future: Future[Any] = Future()
        call_id = next(self._ids)
        with running.lock:
            if not running.alive:
                raise EngineKilled("the engine's process ended")
            running.pending[call_id] = future
        try:
            with running.sending:
                send_frame(running.sock, ("call", call_id, session, settings, method, args, kwargs))
        except OSError as exc:
            running.end(f"the engine's process is gone: {exc}")
        limit = settings.get("max_execution_time")
        if not limit:
            return future.result()
        deadline = float(limit) + self.kill_grace
        try:
            return future.result(deadline)
        except FutureTimeout:
            self.kill(f"a query ran {deadline:g} s, past its limit of {limit} s")
            raise EngineKilled(
                f"killed after {deadline:g} s: the query outlived its time limit "
                f"(max_execution_time={limit})"
            ) from None

    def forget(self, session: int) -> None:
        """Close ``session``'s client in the engine's process (a fresh one on its next call)."""
        running = self._running
        if running is None or not running.alive:
            return
        try:
            with running.sending:
                send_frame(running.sock, ("close", session))
        except OSError:
            pass


def _reap(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


class EngineClient:
    """One session on the engine's process: the part of clickhouse-connect's ``Client``
    that the sink, the guard and the worker's reads use."""

    def __init__(self, link: EngineLink, session: int, settings: dict[str, Any]) -> None:
        self.link = link
        self.session = session
        self.settings = dict(settings)

    def query(self, query: str, parameters: Any = None, **kwargs: Any) -> EngineResult:
        if parameters is not None:
            kwargs["parameters"] = parameters
        names, rows = self.link.call(self.session, self.settings, "query", (query,), kwargs)
        return EngineResult(names, rows)

    def command(self, cmd: str, **kwargs: Any) -> Any:
        return self.link.call(self.session, self.settings, "command", (cmd,), kwargs)

    def insert(self, table: str, data: Any, **kwargs: Any) -> int:
        rows: int = self.link.call(self.session, self.settings, "insert", (table, data), kwargs)
        return rows

    def close(self) -> None:
        self.link.forget(self.session)


class EngineResult:
    """A query's answer: its column names and rows."""

    def __init__(self, column_names: list[str], result_rows: list[tuple[Any, ...]]) -> None:
        self.column_names = tuple(column_names)
        self.result_rows = result_rows


def _error(kind: str, message: str, code: int | None) -> Exception:
    if kind == "engine":
        return EngineError(message, code)
    cls = getattr(sink_errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, sink_errors.SinkError):
        return cls(message) if cls is not sink_errors.DataPathInUse else SinkUnavailable(message)
    return EngineError(message, code)


__all__ = ["EngineClient", "EngineError", "EngineKilled", "EngineLink", "EngineResult"]

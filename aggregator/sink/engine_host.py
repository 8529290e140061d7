"""The engine's process: an embedded store's ClickHouse engine, walled in, answering its
owner's calls (``python -m aggregator.sink.engine_host <fd>``).

The worker (or its sink process) owns an embedded store; its engine runs here, in a
process of its own (``engine_link.py`` starts, restarts and kills it), so that:

- **nothing reaches a file outside the store.** Before the engine starts a thread, the
  process takes away its own access to every other file (``landlock.py``): it may read
  and write the store and a scratch folder, read the folder the sink's container files
  are written in and the code it runs, and open nothing else. A statement that got past
  /sql's guard still cannot read ``keys.secret``, ``/proc/self/environ`` (its
  environment holds nothing secret anyway: the owner starts it with a bare one) or any
  other file, nor write one outside the store.
- **a query can be killed.** The engine checks its time limit between blocks; a query
  that outlives it anyway is ended by killing this process. The owner's sink retries its
  batch on the next one (inserts are idempotent by their deduplication tokens).
- **analyst queries run beside the sink's inserts**, each call on a thread of its own.

It ends when its socket does (its owner gone, even by kill -9).
"""

from __future__ import annotations

# Nothing of the engine before the wall: importing chdb starts the engine's threads,
# and a thread started before landlock.restrict() is not walled in. So this file runs as
# a script (engine_link.py starts ``python <this file> <fd>``, never ``-m``, which would
# import the package, and chdb with it, first) and loads its two siblings by path.
import contextlib
import importlib.util
import os
import socket
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

HERE: Final = Path(__file__).resolve().parent
#: calls answered at once (the sink's insert, an analyst query, the publisher's read...)
THREADS: Final = 8


def sibling(name: str) -> ModuleType:
    """``aggregator/sink/<name>.py`` loaded by path, without the package (and chdb)."""
    spec = importlib.util.spec_from_file_location(f"_engine_host_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EngineHost:
    """The sessions of one store, each a client with its own settings, opened on demand."""

    def __init__(self, sock: socket.socket, dsn: str, wire: ModuleType) -> None:
        from aggregator.sink.store import open_client  # past the wall: chdb starts here

        self.sock = sock
        self.dsn = dsn
        self.wire = wire
        self.open_client = open_client
        self._sending = threading.Lock()
        self._sessions: dict[int, Client] = {}
        self._opening = threading.Lock()

    def send(self, message: Any) -> None:
        with self._sending:
            self.wire.send_frame(self.sock, message)

    def session(self, number: int, settings: dict[str, Any]) -> Client:
        with self._opening:
            client = self._sessions.get(number)
            if client is None:
                client = self._sessions[number] = self.open_client(self.dsn, **settings)
            return client

    def close(self, number: int) -> None:
        with self._opening:
            client = self._sessions.pop(number, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def answer(
        self,
        call_id: int,
        number: int,
        settings: dict[str, Any],
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        from aggregator.sink.errors import SinkError

        try:
            client = self.session(number, settings)
            if method == "query":
                result = client.query(*args, **kwargs)
                outcome: Any = (list(result.column_names), [tuple(r) for r in result.result_rows])
            elif method == "command":
                outcome = client.command(*args, **kwargs)
            elif method == "insert":
                outcome = client.insert(*args, **kwargs).written_rows
            else:
                raise ValueError(f"no call {method!r}")
            reply: tuple[Any, ...] = ("reply", call_id, True, outcome)
        except SinkError as exc:
            reply = ("reply", call_id, False, (type(exc).__name__, str(exc), None))
        except Exception as exc:
            reply = ("reply", call_id, False, ("engine", str(exc), getattr(exc, "code", None)))
        try:
            self.send(reply)
        except (OSError, ValueError):  # the owner is gone: so is this process, soon
            os._exit(0)


def main(fd: int) -> None:
    # the project's packages themselves (light: no engine, no thread), found before the wall
    # where the owner's PYTHONPATH says, so that every later import comes from their
    # folders, which the wall leaves readable (a listing of the folder around them is not)
    import aggregator.sink  # noqa: F401
    import runtime  # noqa: F401  (the sink's face stands on it)
    import schemas  # noqa: F401

    wire, landlock = sibling("engine_wire"), sibling("landlock")
    sock = socket.socket(fileno=fd)
    config = wire.receive_frame(sock)[1]
    tempfile.tempdir = config["scratch"]  # clickhouse-connect's chdb inserts write one
    try:
        abi = landlock.restrict(
            [Path(p) for p in config["read_write"]], [Path(p) for p in config["read_only"]]
        )
    except landlock.LandlockUnavailable as exc:
        if config["require_wall"]:
            wire.send_frame(sock, ("failed", f"cannot wall the engine in: {exc}"))
            return
        abi = 0
    host = EngineHost(sock, config["dsn"], wire)
    wire.send_frame(sock, ("ready", abi))
    pool = ThreadPoolExecutor(THREADS, thread_name_prefix="engine-call")
    while True:
        try:
            message = wire.receive_frame(sock)
        except (EOFError, OSError):
            os._exit(0)  # the owner is gone: end now, whatever is running
        if message[0] == "call":
            pool.submit(host.answer, *message[1:])
        elif message[0] == "close":
            pool.submit(host.close, message[1])


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == HERE:
        del sys.path[0]  # this folder's modules are not top-level names
    main(int(sys.argv[1]))

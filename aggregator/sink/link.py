"""The worker's side of its sink process: start it, restart it if it dies, stop it, and
reach the store through it.

The sink process (``aggregator/sink/process.py``) owns the store, so everything of the
worker that reads or writes it goes through :class:`SinkLink`, which has the calls of
:class:`~aggregator.sink.writer.ClickHouseWriter` the worker uses: ``open``,
``read`` (the alert publisher, the raises' audit), ``insert_until_done`` (the audit) and
``query`` (``/sql``, vetted and run read-only in the sink process). While the process is
down (restarting) a call raises ``SinkUnavailable``: ``/sql`` answers 503, the publisher
and the audit try again, as they do while ClickHouse is away. The sink's figures on
``/stats`` and ``/metrics`` (rows, skipped, failures, batches, the sink group's lag) come
from it, sent after each batch it committed and every second: a page never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.sink.errors import SinkUnavailable
from aggregator.sink.wire import error_from, receive, send

log = logging.getLogger(__name__)

#: first pause before a dead sink process is started again, and the longest
RESTART_SECONDS: Final = 1.0
MAX_RESTART_SECONDS: Final = 30.0
#: a process that ran this long before dying restarts after the first pause again
STABLE_SECONDS: Final = 60.0
#: how long a clean stop may take (the stage's consumer leaves its group) before SIGKILL
STOP_SECONDS: Final = 20.0


class SinkLink:
    """One sink process at a time for this worker, and the calls that reach it."""

    def __init__(self, config: AggregatorConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        #: set once a sink process reports its stage subscribed (the worker starts after)
        self.started = asyncio.Event()
        #: how many times a sink process was started
        self.starts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._out: asyncio.StreamWriter | None = None
        self._sending = asyncio.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        self._stopping = False
        #: the current process's last figures (None: none yet from this process)
        self._figures: dict[str, Any] | None = None
        self._lag: dict[str, int] = {}

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sink process; return once its stage has subscribed (restarted
        meanwhile if it died)."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name="sink-supervisor")
        await self.started.wait()

    async def stop(self) -> None:
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(SinkUnavailable):
                await asyncio.wait_for(self._call("stop"), STOP_SECONDS)
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except TimeoutError:
                log.warning("the sink process did not stop in %.0fs: killed", STOP_SECONDS)
                process.kill()
                await process.wait()
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)

    @property
    def pid(self) -> int | None:
        """The running sink process's pid (None while there is none)."""
        process = self._process
        return None if process is None or process.returncode is not None else process.pid

    async def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            # forked from the event loop's thread: PR_SET_PDEATHSIG follows the thread
            # that made the child, and this one lives as long as the worker
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "aggregator.sink.process",
                str(theirs.fileno()),
                str(os.getpid()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.starts += 1
        self._figures = None
        reader, out = await asyncio.open_unix_connection(sock=ours)
        self._out = out
        async with self._sending:
            await send(out, ("config", self.config))  # secrets travel here, never in argv
        self._reading = asyncio.create_task(self._replies(reader), name="sink-replies")

    async def _supervise(self) -> None:
        pause = RESTART_SECONDS
        while True:
            process = self._process
            began = time.monotonic()
            code = None if process is None else await process.wait()
            if self._stopping:
                return
            pause = RESTART_SECONDS if time.monotonic() - began > STABLE_SECONDS else pause
            log.error("the sink process exited (%s); starting it again in %.0fs", code, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_RESTART_SECONDS)
            if self._stopping:
                return
            try:
                await self._spawn()
            except OSError as exc:  # could not start it: the next round tries again
                log.error("the sink process could not be started: %s", exc)
                self._process = None

    async def _replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await receive(reader)
                if message[0] == "started":
                    self.started.set()
                    continue
                if message[0] == "figures":
                    self._absorb(message[1])
                    continue
                _, call_id, ok, payload = message
                waiting = self._waiting.pop(call_id, None)
                if waiting is None or waiting.done():
                    continue
                if ok:
                    waiting.set_result(payload)
                else:
                    waiting.set_exception(error_from(payload))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._out = None
            waiting_calls, self._waiting = self._waiting, {}
            for future in waiting_calls.values():
                if not future.done():
                    future.set_exception(SinkUnavailable("the sink process exited"))

    async def _call(self, method: str, *args: Any) -> Any:
        out = self._out
        if out is None:
            raise SinkUnavailable("the sink process is not running (it is being restarted)")
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            async with self._sending:
                await send(out, ("call", call_id, method, args))
        except ConnectionError:
            self._waiting.pop(call_id, None)
            raise SinkUnavailable("the sink process exited") from None
        try:
            return await future
        finally:
            self._waiting.pop(call_id, None)

    # --- the store, through the sink process -------------------------------------------
    async def open(self) -> None:
        """Wait until the store is open (its schema applied), across restarts."""
        while True:
            try:
                await self._call("open")
                return
            except SinkUnavailable:
                await asyncio.sleep(RESTART_SECONDS)

    async def read(self, sql: str) -> list[Sequence[Any]]:
        """Rows of the worker's own query (never an analyst's: those go through query)."""
        rows: list[Sequence[Any]] = await self._call("read", sql)
        return rows

    async def insert_until_done(
        self, table: str, columns: Sequence[str], rows: list[list[Any]]
    ) -> None:
        await self._call("insert", table, tuple(columns), rows)

    async def query(self, sql: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        """An analyst's query, vetted and run read-only (QueryRefused when refused)."""
        answer: tuple[list[str], list[tuple[Any, ...]]] = await self._call("query", sql)
        return answer

    # --- figures -----------------------------------------------------------------------
    def _absorb(self, now: dict[str, Any]) -> None:
        """The sink process's figures into the worker's metrics (each report carries its
        totals and the batches since its previous one)."""
        self.metrics.absorb_sink_figures(now, self._figures)
        self._figures = now
        self._lag = now["lag"]

    def lag(self) -> dict[str, int]:
        """The sink group's lag as of the last figures."""
        return dict(self._lag)

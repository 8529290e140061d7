"""The sink process: a worker's sink stage in an OS process of its own, owning the store.

On a machine of few cores the sink's Python work (reading usage.priced, the headers and
fences of each record, the container files) shared one interpreter lock with the counting
stage; in a process of its own it runs beside it (``sink_process`` on: not the default,
aggregator/README.md, "The sink process"). The worker starts it
(``aggregator/sink/link.py``: ``python -m aggregator.sink.process <fd> <worker pid>``, the
config sent on the socketpair ``fd``, never on the command line) and restarts it if it
dies. It runs what the worker ran: :class:`~aggregator.sink.stage.SinkStage` on a
:class:`~aggregator.sink.writer.ClickHouseWriter`, the same consumer group, client
id, fences, tokens and commit-after-insert (aggregator/sink/README.md). Being the one
process that opens the store (an embedded engine is one process's), it also answers the
worker's reads, inserts and analyst queries (``aggregator/sink/wire.py``).

It dies with its worker: the kernel sends it SIGKILL when the worker dies
(``PR_SET_PDEATHSIG``), and the end of the socketpair (the worker gone) ends it at once
too, as a kill -9 of the worker always ended its sink: nothing past the last commit was
acknowledged, so the next sink reads it again and the fences skip what was stored.
It runs niced (:data:`NICENESS`): on a machine short of cores the fold comes first and the
sink takes the rest. A ``stop`` call (the worker stopping) or SIGTERM stops the stage cleanly; SIGINT (a
terminal's Ctrl-C reaching the whole process group) is left to the worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aggregator.config import AggregatorConfig
from aggregator.metrics import Metrics
from aggregator.sink.stage import SinkStage
from aggregator.sink.wire import error_fields, receive, send
from aggregator.sink.writer import ClickHouseWriter
from runtime.http_log import install_log_redaction

log = logging.getLogger(__name__)

#: prctl(2) option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG: Final = 1
#: the exit status of a sink process whose stage failed (the worker restarts it)
STAGE_FAILED: Final = 70
#: the figures go to the worker after each batch committed, and at least this often
REPORT_SECONDS: Final = 1.0
#: the whole process runs niced, as the engine's insert threads already were
#: (sink/clickhouse.py, os_thread_priority): where the cores are short, the counting
#: stage, whose verdicts the enforcers wait for, and the broker come first
NICENESS: Final = 10


@dataclass
class _ReportingMetrics(Metrics):
    """The sink's metrics, calling ``on_sink_batch`` once a batch is stored and committed
    (its figures then go to the worker at once)."""

    on_sink_batch: Callable[[], None] = lambda: None

    def record_sink_batch(self, records: int, ms: float) -> None:
        super().record_sink_batch(records, ms)
        self.on_sink_batch()


class SinkServer:
    """The sink stage and the store's calls, answered on the worker's socket."""

    def __init__(self, config: AggregatorConfig, out: asyncio.StreamWriter) -> None:
        self.config = config
        self.metrics = _ReportingMetrics(on_sink_batch=self._batch_committed)
        self._reported_batches = 0
        spool = config.data_dir / "sink"
        spool.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.writer = ClickHouseWriter(
            config.clickhouse_dsn or "",
            self.metrics,
            config.clickhouse_access,
            spool_dir=str(spool),
            engine_process=config.engine_process,
        )
        self.stage = SinkStage(config, config.topics, self.writer, self.metrics)
        self.out = out
        self._sending = asyncio.Lock()
        self.stopping = asyncio.Event()
        self._answering: set[asyncio.Task[None]] = set()

    async def tell(self, message: Any) -> None:
        async with self._sending:
            await send(self.out, message)

    async def run(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        self.stage.on_crash = self._stage_failed
        calls = asyncio.create_task(self._calls(reader), name="sink-calls")
        reports = asyncio.create_task(self._report_every_second(), name="sink-figures")
        starting = asyncio.create_task(self._start(), name="sink-start")
        await self.stopping.wait()
        starting.cancel()  # a stop while the store is still away
        await asyncio.gather(starting, return_exceptions=True)
        await self.stage.stop()
        await self.report()
        calls.cancel()
        reports.cancel()

    async def _start(self) -> None:
        await self.stage.start()  # opens the store first (retried while it is away)
        await self.tell(("started",))

    async def report(self) -> None:
        """Send the worker the sink's figures: totals, the batches since the last report,
        the sink group's lag."""
        figures = self.metrics.sink_figures(self._reported_batches)
        self._reported_batches = figures["batches"]
        await self.tell(("figures", {**figures, "lag": self.stage.lag()}))

    async def _report_every_second(self) -> None:
        # between batches too: failures while ClickHouse is away, the lag
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            await self.report()

    def _batch_committed(self) -> None:
        task = asyncio.create_task(self.report())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _calls(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                message = await receive(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                # the worker is gone (killed, most likely): end as it did, at once
                os._exit(0)
            _, call_id, method, args = message
            task = asyncio.create_task(self._answer(call_id, method, args))
            self._answering.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._answering.discard)

    async def _answer(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            result = await self._do(method, args)
        except Exception as exc:  # the worker raises it again (sink_wire.error_from)
            await self.tell(("reply", call_id, False, error_fields(exc)))
        else:
            await self.tell(("reply", call_id, True, result))

    async def _do(self, method: str, args: tuple[Any, ...]) -> Any:
        if method == "open":
            await self.writer.open()
            return None
        if method == "read":
            return await self.writer.read(*args)
        if method == "insert":
            return await self.writer.insert_until_done(*args)
        if method == "query":
            return await self.writer.query(*args)
        if method == "stop":
            self.stopping.set()
            return None
        raise ValueError(f"unknown sink process call {method!r}")

    async def _stage_failed(self, exc: BaseException) -> None:
        # nothing past the last commit was acknowledged: the next sink process re-reads it
        log.critical("sink stage failed, the sink process exits (the worker restarts it): %r", exc)
        logging.shutdown()
        os._exit(STAGE_FAILED)


def die_with_parent(parent: int) -> None:
    """SIGKILL when the worker dies (Linux); gone already: exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the socket's end still ends this process
        pass
    if os.getppid() != parent:
        os._exit(0)


async def serve(sock: socket.socket) -> None:
    reader, out = await asyncio.open_unix_connection(sock=sock)
    kind, config = await receive(reader)
    if kind != "config" or not isinstance(config, AggregatorConfig):
        raise SystemExit("the sink process expects its config first")
    install_log_redaction()  # as the worker's (runtime/http_log.py)
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(config.log_level)
    await SinkServer(config, out).run(reader)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m aggregator.sink.process <socket fd> <worker pid>", file=sys.stderr)
        return 2
    fd, parent = int(argv[1]), int(argv[2])
    die_with_parent(parent)
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when its sink stops
    asyncio.run(serve(socket.socket(fileno=fd)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

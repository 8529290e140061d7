"""UsagePublisher: the one way a Python proxy publishes UsageEvents.

``publish()`` validates and encodes the event, writes it to the spool and
returns; the :class:`~ingest.publisher.sender.Sender` publishes it in the
background. ``flush()`` waits until the broker acknowledged everything
published so far. See ``ingest/publisher/README.md`` for the guarantees.

Lifecycle (one transition table)::

    new ──start()──► running ──stop()──► stopping ──► stopped
     └───────────────stop()─────────────────────────────┘
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple

from prometheus_client import CollectorRegistry

from ingest.errors import PublisherClosed, PublishTimeout, SpoolFull
from ingest.publisher.config import PublisherConfig
from ingest.publisher.metrics import PublisherMetrics
from ingest.publisher.sender import Sender
from ingest.publisher.spool import Spool, frame
from schemas.avro_schemas import expanded_schemas
from schemas.codec import USAGE_EVENT
from schemas.errors import InvalidRecord
from schemas.ids import MAX_ID_LENGTH
from schemas.records import UsageEvent
from schemas.topics import usage_raw_key
from schemas.usage import validate_usage_event

log = logging.getLogger(__name__)

State = Literal["new", "running", "stopping", "stopped"]

#: the legal lifecycle transitions
_TRANSITIONS: Final[dict[State, frozenset[State]]] = {
    "new": frozenset({"running", "stopped"}),
    "running": frozenset({"stopping"}),
    "stopping": frozenset({"stopped"}),
    "stopped": frozenset(),
}

#: events appended to the spool per write (one write() per group)
_WRITE_GROUP: Final = 4096
#: one warning per this many seconds while the spool stays full
_FULL_LOG_INTERVAL_S: Final = 5.0
DEFAULT_MAX_RECORD_BYTES: Final = 256 * 1024

_FIELDS: Final = frozenset(f["name"] for f in expanded_schemas()["UsageEvent"]["fields"])
_OPTIONAL_TEXT: Final = ("estimate_reason", "decision_budget_id", "request_id")
_INT32_MAX: Final = 2**31 - 1
#: org_id -> Kafka key: a proxy sees few orgs, and each event needs its key
_KEYS: dict[str, bytes] = {}
_KEY_CACHE_SIZE: Final = 4096


class PreparedEvent(NamedTuple):
    """A validated event as it will be published: the Kafka key and the encoded value.

    A NamedTuple, not a frozen dataclass: one is built per event, and a frozen
    dataclass's ``__init__`` costs about a microsecond more.
    """

    event_id: str
    key: bytes
    value: bytes


def prepare(
    event: UsageEvent, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> PreparedEvent:
    """Validate and encode one UsageEvent; raise InvalidRecord naming the field at fault.

    The key is the canonical org_id. The bytes returned are the bytes that are
    spooled and sent, on every attempt.
    """
    if not isinstance(event, dict):
        raise InvalidRecord("<event>", "a UsageEvent must be a dict")
    validate_usage_event(event)
    event_id: str = event["event_id"]
    if not _FIELDS.issuperset(event):  # no set built on the common path
        unknown = event.keys() - _FIELDS
        raise InvalidRecord(sorted(unknown)[0], "not a UsageEvent field", record_id=event_id)
    _check_remaining_fields(event, event_id)
    try:
        value = USAGE_EVENT.encode(event)
    except Exception as exc:  # fastavro: ValueError, TypeError, OverflowError...
        raise InvalidRecord(
            "<event>", f"cannot be encoded: {type(exc).__name__}: {exc}", record_id=event_id
        ) from None
    if len(value) > max_record_bytes:
        raise InvalidRecord(
            "<event>",
            f"encoded size {len(value)} bytes exceeds {max_record_bytes} (too many tags or groups?)",
            record_id=event_id,
        )
    org_id = event["org_id"]
    key = _KEYS.get(org_id) if type(org_id) is str else None
    if key is None:
        key = usage_raw_key(org_id)
        if type(org_id) is str:
            if len(_KEYS) >= _KEY_CACHE_SIZE:
                _KEYS.clear()
            _KEYS[org_id] = key
    return PreparedEvent(event_id, key, value)


def _check_remaining_fields(event: UsageEvent, event_id: str) -> None:
    """The fields :func:`validate_usage_event` leaves to the encoder, checked with their names."""
    if type(event.get("stream", False)) is not bool:
        raise InvalidRecord("stream", "must be true or false", record_id=event_id)
    decision = event.get("decision", "allowed")
    if not isinstance(decision, str) or not decision or len(decision) > MAX_ID_LENGTH:
        raise InvalidRecord("decision", "must be a non-empty string", record_id=event_id)
    for name in _OPTIONAL_TEXT:
        value = event.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidRecord(name, "must be null or a string", record_id=event_id)
    latency = event.get("latency_ms")
    if latency is not None and (type(latency) is not int or not 0 <= latency <= _INT32_MAX):
        raise InvalidRecord(
            "latency_ms", f"must be null or an integer 0..{_INT32_MAX}", record_id=event_id
        )


class UsagePublisher:
    """Publishes UsageEvents to ``usage.raw`` through a crash-safe, bounded spool.

    Usage::

        async with UsagePublisher(config) as publisher:
            await publisher.publish(new_usage_event(...))

    ``publish`` returns once the event is in the spool (and, with
    ``fsync="always"``, on disk); the broker's acknowledgement comes later, and
    ``flush()`` waits for it. Events left unsent at ``stop()`` stay in the
    spool and go first at the next ``start()`` on the same ``spool_dir``.
    """

    def __init__(
        self, config: PublisherConfig, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.config = config
        self.metrics = PublisherMetrics(registry if registry is not None else CollectorRegistry())
        self._state: State = "new"
        self._spool: Spool | None = None
        self._sender: Sender | None = None
        self._flush_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._room: asyncio.Event | None = None
        self._synced = 0
        self._sync_task: asyncio.Future[None] | None = None
        self._fsync_loop_task: asyncio.Task[None] | None = None
        self._last_full_log = 0.0
        self._full_since_log = 0
        #: events spooled (a plain int on the hot path, read by the metric at scrape time)
        self._spooled = 0
        self.metrics.spooled_from(lambda: self._spooled)

    # -- lifecycle -------------------------------------------------------------------------------

    def _move(self, to: State) -> None:
        if to not in _TRANSITIONS[self._state]:
            raise PublisherClosed(f"publisher is {self._state}: cannot become {to}")
        self._state = to

    @property
    def state(self) -> State:
        return self._state

    async def start(self) -> None:
        """Open the spool and start the background sender. Needs no broker."""
        self._move("running")
        try:
            spool = Spool.open(self.config.spool_dir, segment_bytes=self.config.segment_bytes)
        except BaseException:
            self._state = "stopped"
            raise
        self._spool = spool
        self._synced = spool.write_end
        self._room = asyncio.Event()
        metrics = self.metrics
        metrics.spool_bytes.set_function(lambda: spool.pending_bytes)
        metrics.spool_disk_bytes.set_function(lambda: spool.disk_bytes)
        metrics.spool_recovered_bytes.inc(spool.recovery.truncated_bytes)
        if spool.recovery.pending_bytes:
            log.info(
                "spool %s: %d bytes from a previous run will be sent first",
                self.config.spool_dir,
                spool.recovery.pending_bytes,
            )
        self._sender = Sender(self.config, spool, metrics, self._on_ack)
        self._sender.start()
        if self.config.fsync == "interval":
            self._fsync_loop_task = asyncio.create_task(self._fsync_loop())

    async def stop(self, timeout: float = 5.0) -> None:
        """Send what can be sent within ``timeout`` seconds, then close; the rest stays spooled."""
        if self._state == "new":
            self._move("stopped")
            return
        if self._state != "running":
            return
        self._move("stopping")
        assert self._spool is not None and self._sender is not None
        spool = self._spool
        try:
            await self._drain(timeout)
        except PublishTimeout:
            log.warning(
                "stopping with %d bytes not acknowledged: they stay in %s for the next start",
                spool.pending_bytes,
                self.config.spool_dir,
            )
        try:
            await self._sender.close()
            if self._fsync_loop_task is not None:
                self._fsync_loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._fsync_loop_task
            if self._sync_task is not None:
                with contextlib.suppress(Exception):
                    await self._sync_task
            if self.config.fsync != "never":
                spool.sync()
        finally:
            while self._flush_waiters:
                _, waiter = self._flush_waiters.popleft()
                if not waiter.done():  # a flush() awaits it (timed-out waiters are cancelled)
                    waiter.set_exception(
                        PublisherClosed(
                            "publisher stopped before the broker acknowledged every event "
                            "(they stay spooled for the next start)"
                        )
                    )
            spool.close()
            self._move("stopped")
            if self._room is not None:
                self._room.set()  # publishers waiting for room see the publisher closed

    async def __aenter__(self) -> UsagePublisher:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- publishing ------------------------------------------------------------------------------

    def prepare(self, event: UsageEvent) -> PreparedEvent:
        """:func:`prepare` with this publisher's limits, counting rejections."""
        try:
            return prepare(event, max_record_bytes=self.config.max_record_bytes)
        except InvalidRecord as exc:
            self.metrics.rejected(exc.field)
            raise

    async def publish(self, event: UsageEvent) -> None:
        """Validate, encode and spool one event (InvalidRecord if it breaks the contract).

        Returns once the event is in the spool; a valid event is never lost from
        then on. When the spool is full: policy ``block`` waits up to
        ``spool_full_timeout_s`` then raises SpoolFull; ``drop_newest`` drops it,
        logged and counted.
        """
        prepared = self.prepare(event)
        spool = self._running_spool()
        data = frame(prepared.key, prepared.value)
        if spool.pending_bytes + len(data) > self.config.spool_max_bytes:
            if not await self._reserve(len(data), 1):
                return
            spool = self._running_spool()  # stop() may have run while waiting for room
        # the common path, kept short: one write(), a counter, a wake-up
        spool.append(data)
        self._spooled += 1
        self._sender.notify()  # type: ignore[union-attr]  # a running spool has its sender
        if self.config.fsync == "always":
            await self._sync_upto(spool.write_end)
        elif not self._spooled % _WRITE_GROUP:
            # a caller publishing in a tight loop never waits: give the sender its turn
            await asyncio.sleep(0)

    async def publish_many(self, events: Iterable[UsageEvent]) -> int:
        """Validate every event first (InvalidRecord: none is published), then spool them.

        Returns how many were spooled (fewer than given only under ``drop_newest``).
        """
        limit = self.config.max_record_bytes
        prepared = []
        try:
            for event in events:
                prepared.append(prepare(event, max_record_bytes=limit))
        except InvalidRecord as exc:  # what self.prepare counts, without a call per event
            self.metrics.rejected(exc.field)
            raise
        return await self.publish_prepared(prepared)

    async def publish_prepared(self, events: Sequence[PreparedEvent]) -> int:
        """Spool events already checked by :meth:`prepare`, in order; returns how many."""
        spool = self._running_spool()
        sender = self._sender
        assert sender is not None
        spooled = 0
        for start in range(0, len(events), _WRITE_GROUP):
            group = events[start : start + _WRITE_GROUP]
            frames = b"".join([frame(e.key, e.value) for e in group])
            if spool.pending_bytes + len(frames) > self.config.spool_max_bytes:
                if not await self._reserve(len(frames), len(group)):
                    continue
                spool = self._running_spool()  # stop() may have run while waiting for room
            spool.append(frames)
            spooled += len(group)
            self._spooled += len(group)
            sender.notify()
        if spooled and self.config.fsync == "always":
            await self._sync_upto(spool.write_end)
        elif spooled:
            # a batch never waits otherwise: yield so the sender ships it while the caller
            # prepares the next one (the broker works on it meanwhile, in its own process)
            await asyncio.sleep(0)
        return spooled

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the broker acknowledged every event published before this call.

        Raises PublishTimeout after ``timeout`` seconds (the events stay spooled
        and keep being sent).
        """
        spool = self._spool
        if spool is None:
            raise PublisherClosed("publisher not started")
        target = spool.write_end
        if spool.acked >= target:
            return
        if self._state not in ("running", "stopping"):
            raise PublisherClosed("publisher stopped before the broker acknowledged every event")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, waiter))
        if self._sender is not None:
            self._sender.send_now(target)  # a flush does not wait for the linger
        try:
            await asyncio.wait_for(waiter, timeout)  # cancels the waiter on timeout
        except TimeoutError:
            raise PublishTimeout(
                f"the broker did not acknowledge within {timeout}s "
                f"({spool.pending_bytes} bytes spooled; they keep being sent)"
            ) from None

    async def _drain(self, timeout: float) -> None:
        """flush(), cut short when the broker is known to be unreachable (nothing to wait for)."""
        assert self._sender is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if not self._sender.reachable or remaining <= 0:
                if self.spooled_bytes:
                    raise PublishTimeout("the broker is unreachable")
                return
            try:
                await self.flush(min(remaining, 0.1))
                return
            except PublishTimeout:
                continue

    # -- status ----------------------------------------------------------------------------------

    @property
    def spooled_bytes(self) -> int:
        """Bytes published and not yet acknowledged by the broker."""
        return self._spool.pending_bytes if self._spool is not None else 0

    @property
    def connected(self) -> bool:
        return self._sender is not None and self._sender.connected

    def status(self) -> dict[str, Any]:
        return {
            "state": self._state,
            "kafka_connected": self.connected,
            "last_error": self._sender.last_error if self._sender is not None else None,
            "spool_bytes": self.spooled_bytes,
            "spool_segments": self._spool.segment_count if self._spool is not None else 0,
        }

    # -- internals -------------------------------------------------------------------------------

    def _running_spool(self) -> Spool:
        if self._state != "running" or self._spool is None:
            raise PublisherClosed(f"publisher is {self._state}: publish needs a running publisher")
        return self._spool

    async def _reserve(self, nbytes: int, nevents: int) -> bool:
        """Room for ``nbytes`` in a full spool, per the policy: True to write, False if dropped."""
        spool = self._running_spool()
        limit = self.config.spool_max_bytes
        metrics = self.metrics
        if self.config.spool_full_policy == "drop_newest":
            metrics.spool_full.labels("dropped").inc()
            metrics.dropped.inc(nevents)
            self._log_full(f"dropped {nevents} newest events (policy drop_newest)", nevents)
            return False
        if nbytes > limit:
            metrics.spool_full.labels("refused").inc()
            raise SpoolFull(f"{nbytes} bytes of events exceed the whole spool ({limit} bytes)")
        room = self._room
        assert room is not None
        self._log_full(f"waiting up to {self.config.spool_full_timeout_s}s for room", nevents)
        deadline = time.monotonic() + self.config.spool_full_timeout_s
        while spool.pending_bytes + nbytes > limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                metrics.spool_full.labels("refused").inc()
                log.error(
                    "spool full (%d of %d bytes): %d events refused with SpoolFull",
                    spool.pending_bytes,
                    limit,
                    nevents,
                )
                raise SpoolFull(
                    f"spool full ({spool.pending_bytes} of {limit} bytes, Kafka "
                    f"{'reachable' if self.connected else 'unreachable'}) for "
                    f"{self.config.spool_full_timeout_s}s"
                )
            room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), remaining)
            spool = self._running_spool()
        metrics.spool_full.labels("waited").inc()
        return True

    def _log_full(self, what: str, nevents: int) -> None:
        """Log spool-full episodes, at most once per interval (every event is counted)."""
        self._full_since_log += nevents
        now = time.monotonic()
        if now - self._last_full_log >= _FULL_LOG_INTERVAL_S:
            assert self._spool is not None
            log.warning(
                "spool full (%d of %d bytes, Kafka %s): %s; %d events hit the limit since the "
                "last warning",
                self._spool.pending_bytes,
                self.config.spool_max_bytes,
                "reachable" if self.connected else "unreachable",
                what,
                self._full_since_log,
            )
            self._last_full_log = now
            self._full_since_log = 0

    def _on_ack(self) -> None:
        """The sender advanced the acknowledged position: release flushers and blocked publishers."""
        spool = self._spool
        assert spool is not None
        acked = spool.acked
        waiters = self._flush_waiters
        while waiters and waiters[0][0] <= acked:
            _, waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if self._room is not None:
            self._room.set()

    async def _sync_upto(self, end: int) -> None:
        """Group commit: wait until the spool is fsynced up to ``end``; one fsync serves many."""
        while self._synced < end:
            if self._sync_task is None or self._sync_task.done():
                self._sync_task = asyncio.ensure_future(self._fsync_once())
            await asyncio.shield(self._sync_task)

    async def _fsync_once(self) -> None:
        spool = self._spool
        assert spool is not None
        target = spool.write_end
        fd = spool.sync_fd()  # earlier segments were fsynced when they were sealed
        await asyncio.get_running_loop().run_in_executor(None, _fsync_and_close, fd)
        self._synced = max(self._synced, target)

    async def _fsync_loop(self) -> None:
        interval = self.config.fsync_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            spool = self._spool
            if spool is not None and self._synced < spool.write_end:
                try:
                    await self._sync_upto(spool.write_end)
                except OSError as exc:
                    log.error("spool fsync failed: %s", exc)


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

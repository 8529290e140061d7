"""The ClickHouse sink: PricedUsage records into ``usage_events``, verdicts into ``budget_state``
(their columns and rows: ``rows.py``).

Delivery is at-least-once (a batch may come again after a crash, a rebalance
or a failed write); the sink makes it exactly-once in ClickHouse with two
mechanisms, both keyed by the event's usage.raw position (source_partition,
source_offset):

- **Offset fences.** For each (source_partition, month of occurred_at) the
  highest source_offset stored. A partition's fences are read from
  ``usage_events`` (through its ``fences`` projection) the first time a batch
  holds that partition, and advanced after each successful insert; a row at or
  below its fence is already stored and is skipped. Records of one
  source_partition arrive in offset order, so a redelivered batch is a re-read
  of a suffix and is skipped exactly up to what was stored. Fences are per
  month because the table is partitioned by month: one INSERT writes one part
  per month, each committed on its own, so a crash can leave one month of an
  insert stored and another not; within one (partition, month), rows are
  stored as whole parts in offset order, so its max offset is an exact fence.
- **Insert tokens.** Each INSERT carries an ``insert_deduplication_token``
  derived from its (partition, offset) list. An insert that raised is kept as
  *pending* and is the first thing the next write sends, identical, with the
  same token: ClickHouse drops what it already committed (in usage_events and,
  by the token, in the rollup views) and adds the rest. An insert can raise
  after committing (a view failing after the table part was written, an HTTP
  timeout), so the fences alone would leave the rollups short.

Flush order (aggregator/sink/README.md, enforced by tests): 1. insert rows,
2. advance the fences, 3. only then may the caller commit the Kafka offsets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from clickhouse_connect.driver._chdbclient import ChdbClient
from clickhouse_connect.driver.client import Client

from aggregator.sink.avro_rows import ContainerFile, insert_select
from aggregator.sink.batch import FenceKey, Item, avro_items, fresh, runs, tops_token_rows
from aggregator.sink.errors import SinkRejected, translate
from aggregator.sink.rows import (
    USAGE_COLUMN_NAMES,
    USAGE_COLUMN_TYPES,
    USAGE_COLUMNS,
    VERDICT_COLUMN_NAMES,
    VERDICT_COLUMN_TYPES,
    VERDICT_COLUMNS,
    Row,
    month_of,
    rows_from_priced,
    rows_from_verdicts,
)
from schemas.codec import PRICED_USAGE, VERDICT
from schemas.errors import DecodeError
from schemas.records import PricedUsage, Verdict
from schemas.topics import store_row_value

log = logging.getLogger(__name__)

USAGE_TABLE: Final = "usage_events"
VERDICT_TABLE: Final = "budget_state"
#: rows per INSERT at most: well below max_insert_block_size, so ClickHouse
#: writes each INSERT as one block (one part per month), never split further
MAX_ROWS_PER_INSERT: Final = 100_000

_OCCURRED_AT: Final = USAGE_COLUMN_NAMES.index("occurred_at")
_PARTITION: Final = USAGE_COLUMN_NAMES.index("source_partition")
_OFFSET: Final = USAGE_COLUMN_NAMES.index("source_offset")

#: settings of every usage_events INSERT besides its token: synchronous (the
#: insert has landed when the call returns), deduplicated down the views too, and written
#: by one stream (one block: one part per month, what the fences rest on)
_INSERT_SETTINGS: Final[dict[str, int | str]] = {
    "max_insert_threads": 1,
    # the engine's threads run an insert niced (Linux): the counting stage, whose verdicts
    # enforcers wait for, and the broker come first on a shared machine
    "os_thread_priority": 10,
    "async_insert": 0,
    "insert_deduplicate": 1,
    "deduplicate_blocks_in_dependent_materialized_views": 1,
}
_FENCE_QUERY: Final = (
    "SELECT source_partition, toYYYYMM(occurred_at) AS month, max(source_offset) "
    "FROM {table}{where} GROUP BY source_partition, month"
)


_PRICED_HEADER: Final = PRICED_USAGE.header
_VERDICT_HEADER: Final = VERDICT.header


#: one row to store (aggregator/sink/batch.py Item): its (partition, month) fence key, its
#: source offset, the row as a tuple (USAGE_COLUMNS order) or, for the engine to decode,
#: its PricedUsage message, and its position as STORE_ROW bytes (the token is made of them)
_Item = Item


class PricedMessage(Protocol):
    """What the sink reads of a Kafka record (aiokafka's ConsumerRecord has it)."""

    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class _Insert:
    """One INSERT: its rows (tuples, or messages the engine decodes when ``avro``), the
    (partition, month) -> max offset they carry, and its deduplication token."""

    rows: list[Any]
    tops: dict[FenceKey, int]
    token: str
    avro: bool

    @classmethod
    def of(cls, items: Sequence[_Item], table: str, *, avro: bool) -> _Insert:
        tops, token, rows = tops_token_rows(items, table)
        return cls(rows=rows, tops=tops, token=token, avro=avro)

    def decoded(self) -> _Insert:
        """The same INSERT (same token) with its messages decoded into tuples."""
        if not self.avro:
            return self
        try:
            rows = rows_from_priced([PRICED_USAGE.decode(m) for m in self.rows])
        except DecodeError as exc:
            raise SinkRejected(f"a usage.priced record does not decode: {exc}") from exc
        return _Insert(rows=rows, tops=self.tops, token=self.token, avro=False)

    @property
    def partitions(self) -> set[int]:
        return {partition for partition, _ in self.tops}


def engine_reads_local_files(client: Client) -> bool:
    """Does ``client`` run the engine in this process (chdb), so that an INSERT can read a
    file this process wrote? A server's ``file()`` reads its own disk (and user_files only)."""
    return isinstance(client, ChdbClient)


class ClickHouseSink:
    """Writes PricedUsage batches into usage_events exactly once, and verdicts into budget_state.

    Synchronous and serialised by a lock: the sink stage (``aggregator/sink/stage.py``)
    calls ``write_messages`` through ``asyncio.to_thread`` with the usage.priced records
    of one batch, retries the same batch on SinkUnavailable, and commits its offsets only
    after ``write_messages`` returned. On partition revocation it calls ``forget``.

    ``avro_inserts`` (default: when the engine runs in this process) lets records with the
    store-row header go to the engine as Avro bytes (``avro_rows.py``); ``spool_dir`` is
    where their container files are written for the engine to read.
    """

    def __init__(
        self,
        client: Client,
        *,
        table: str = USAGE_TABLE,
        verdict_table: str = VERDICT_TABLE,
        max_rows_per_insert: int = MAX_ROWS_PER_INSERT,
        avro_inserts: bool | None = None,
        spool_dir: str | None = None,
    ) -> None:
        if not 0 < max_rows_per_insert <= MAX_ROWS_PER_INSERT:
            raise ValueError(f"max_rows_per_insert must be in 1..{MAX_ROWS_PER_INSERT}")
        self.client = client
        self.table = table
        self.verdict_table = verdict_table
        self.max_rows_per_insert = max_rows_per_insert
        self.avro_inserts = (
            engine_reads_local_files(client) if avro_inserts is None else avro_inserts
        )
        self.spool_dir = spool_dir
        self._fences: dict[FenceKey, int] = {}
        self._loaded: set[int] = set()
        self._pending: _Insert | None = None
        self._lock = threading.RLock()

    # -- fences ---------------------------------------------------------------------

    @property
    def fences(self) -> dict[FenceKey, int]:
        """A copy of the fences: (source_partition, YYYYMM) -> highest source_offset stored."""
        with self._lock:
            return dict(self._fences)

    @property
    def pending(self) -> int:
        """Rows of a failed insert that the next write sends first (0 when none)."""
        pending = self._pending
        return 0 if pending is None else len(pending.rows)

    def load_fences(self, partitions: Iterable[int] | None = None) -> None:
        """Read the fences of ``partitions`` (every partition stored when None) from ClickHouse."""
        with self._lock:
            self._load_fences(None if partitions is None else set(partitions))

    def forget(self, partitions: Iterable[int] | None = None) -> None:
        """Drop what the sink knows of ``partitions`` (all when None): call on revocation.

        Another worker may write them meanwhile, so their fences are read again
        from ClickHouse the next time a batch holds them. A pending insert
        touching them is dropped too (the new owner writes those rows); its
        other partitions are re-read as well, as it may have been committed.
        """
        with self._lock:
            gone = set(self._loaded) if partitions is None else set(partitions)
            pending = self._pending
            if pending is not None and pending.partitions & gone:
                log.warning(
                    "dropping a failed insert of %d rows on revocation of partitions %s; "
                    "if it had reached usage_events but not the rollups, rebuild them "
                    "(infra/clickhouse/README.md)",
                    len(pending.rows),
                    sorted(pending.partitions & gone),
                )
                gone |= pending.partitions
                self._pending = None
            self._loaded -= gone
            for key in [k for k in self._fences if k[0] in gone]:
                del self._fences[key]

    def _load_fences(self, partitions: set[int] | None) -> None:
        where = ""
        if partitions is not None:
            if not partitions:
                return
            listed = ",".join(str(int(p)) for p in sorted(partitions))
            where = f" WHERE source_partition IN ({listed})"
        try:
            result = self.client.query(_FENCE_QUERY.format(table=self.table, where=where))
        except Exception as exc:
            raise translate(exc, f"reading the fences of {self.table}") from exc
        if partitions is None:
            self._fences.clear()
        else:
            for key in [k for k in self._fences if k[0] in partitions]:
                del self._fences[key]
        for partition, month, offset in result.result_rows:
            self._fences[(int(partition), int(month))] = int(offset)
        # a partition with nothing stored yet is loaded too: it has no fence
        self._loaded |= partitions or {partition for partition, _ in self._fences}

    # -- usage_events ---------------------------------------------------------------

    def write(self, records: Iterable[PricedUsage]) -> int:
        """Store a batch of PricedUsage records; returns the number of rows inserted.

        Rows already stored (at or below their fence) and repeats within the
        batch are skipped. Raises SinkUnavailable (retriable: call again with
        the same batch) or SinkRejected; in both cases nothing may be
        acknowledged to Kafka.
        """
        return self.write_rows(rows_from_priced(records))

    def write_rows(self, rows: Sequence[Row]) -> int:
        """``write`` for rows already built by :func:`rows_from_priced`."""
        return self._write([_row_item(row) for row in rows])

    def write_messages(self, messages: Sequence[PricedMessage]) -> int:
        """``write`` for usage.priced records as read from Kafka, in their order.

        A record with the store-row header is fenced by it and, with ``avro_inserts``,
        stored from its bytes by the engine; any other is decoded here (SinkRejected when
        it does not decode: a record of usage.priced that no reader can store).
        """
        scanned = avro_items(messages, _PRICED_HEADER) if self.avro_inserts else None
        if scanned is not None and None not in scanned:  # the usual batch: all from bytes
            return self._write(scanned, [True] * len(scanned))  # type: ignore[arg-type]  # no None left: checked above
        items: list[_Item] = []
        kinds: list[bool] = []
        for n, message in enumerate(messages):
            item = None if scanned is None else scanned[n]
            if item is not None:
                items.append(item)
                kinds.append(True)
                continue
            try:
                record = PRICED_USAGE.decode(message.value)  # type: ignore[arg-type]  # a null value is refused by decode
            except DecodeError as exc:
                raise SinkRejected(f"a usage.priced record does not decode: {exc}") from exc
            items.append(_row_item(rows_from_priced((record,))[0]))
            kinds.append(False)
        return self._write(items, kinds)

    def _write(self, items: Sequence[_Item], kinds: Sequence[bool] | None = None) -> int:
        with self._lock:
            unseen = {key[0] for key, _, _, _ in items} - self._loaded
            if unseen:
                self._load_fences(unseen)
            written = 0
            # a failed insert goes first, identical: the token makes it land once
            if self._pending is not None:
                written += self._insert(self._pending)
            new, new_kinds = fresh(items, kinds, self._fences)
            for run, avro in runs(new, new_kinds, self.max_rows_per_insert):
                written += self._insert(_Insert.of(run, self.table, avro=avro))
            return written

    def _insert(self, insert: _Insert) -> int:
        """The flush steps for one INSERT, in the order README.md gives."""
        # Step 1: insert the rows. On failure keep them as pending and leave
        # the fences where they were: the caller retries, nothing is acknowledged.
        try:
            self._send(insert)
        except SinkRejected as exc:
            if not insert.avro:
                self._pending = insert
                raise
            # the engine refused the bytes: the same rows decoded here, under the same token
            log.warning(
                "the engine refused %d Avro rows (%s); inserting them decoded",
                len(insert.rows),
                exc,
            )
            return self._insert(insert.decoded())
        except Exception:
            self._pending = insert
            raise
        # Step 2: only now advance the fences (and forget the pending insert).
        self._pending = None
        for key, offset in insert.tops.items():
            if offset > self._fences.get(key, -1):
                self._fences[key] = offset
        # Step 3 is the caller's: acknowledge/commit the Kafka offsets after we return.
        return len(insert.rows)

    def _send(self, insert: _Insert) -> None:
        settings: dict[str, int | str] = {
            **_INSERT_SETTINGS,
            "insert_deduplication_token": insert.token,
        }
        doing = f"inserting {len(insert.rows)} rows into {self.table}"
        try:
            if insert.avro:
                with ContainerFile(insert.rows, self.spool_dir) as path:
                    self.client.command(
                        insert_select(self.table, USAGE_COLUMNS, path, settings=settings)
                    )
            else:
                self.client.insert(
                    self.table,
                    insert.rows,
                    column_names=USAGE_COLUMN_NAMES,
                    column_type_names=USAGE_COLUMN_TYPES,
                    settings=settings,
                )
        except Exception as exc:
            raise translate(exc, doing) from exc

    # -- budget_state ---------------------------------------------------------------

    def write_verdict_messages(self, messages: Sequence[PricedMessage]) -> int:
        """``write_verdicts`` for budget.verdicts records as read from Kafka: with
        ``avro_inserts``, a batch of current Verdict bodies is decoded by the engine (a
        verdict is stored as it was sent, nothing to canonicalise). A tombstone (a pruned
        counter: aggregator/counting/pruning.py) stores nothing: budget_state keeps the
        states the counter had."""
        messages = [m for m in messages if m.value is not None]
        values = [m.value for m in messages]
        if self.avro_inserts and values and all(_is_current_verdict(v) for v in values):
            doing = f"inserting {len(values)} rows into {self.verdict_table}"
            try:
                with ContainerFile(values, self.spool_dir, "Verdict") as path:  # type: ignore[arg-type]  # current verdicts are bytes: checked above
                    self.client.command(
                        insert_select(
                            self.verdict_table,
                            VERDICT_COLUMNS,
                            path,
                            "Verdict",
                            settings={"async_insert": 0},
                        )
                    )
                return len(values)
            except Exception as exc:
                error = translate(exc, doing)
                if not isinstance(error, SinkRejected):
                    raise error from exc
                log.warning(
                    "the engine refused %d Avro verdicts (%s); inserting them decoded",
                    len(values),
                    error,
                )
        try:
            records = [VERDICT.decode(m.value) for m in messages]  # type: ignore[arg-type]  # tombstones were left out above
        except DecodeError as exc:
            raise SinkRejected(f"a budget.verdicts record does not decode: {exc}") from exc
        return self.write_verdicts(records)

    def write_verdicts(self, records: Iterable[Verdict]) -> int:
        """Store a batch of Verdict records; returns the number of rows inserted.

        No fence is needed: a verdict written twice has the same seq and values,
        and every budget_state query takes argMax(..., seq).
        """
        rows = rows_from_verdicts(records)
        if not rows:
            return 0
        try:
            self.client.insert(
                self.verdict_table,
                rows,
                column_names=VERDICT_COLUMN_NAMES,
                column_type_names=VERDICT_COLUMN_TYPES,
                settings={"async_insert": 0},
            )
        except Exception as exc:
            raise translate(exc, f"inserting {len(rows)} rows into {self.verdict_table}") from exc
        return len(rows)


def _is_current_verdict(value: bytes | None) -> bool:
    return value is not None and value.startswith(_VERDICT_HEADER)


def _row_item(row: Row) -> _Item:
    partition, offset, month = row[_PARTITION], row[_OFFSET], month_of(row[_OCCURRED_AT])
    return ((partition, month), offset, row, store_row_value(partition, offset, month))

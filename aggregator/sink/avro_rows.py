"""Rows the engine reads itself: PricedUsage (or Verdict) bodies as one Avro container.

The cheapest way into ``usage_events`` that stays exact (bench/bench_insert_formats.py:
well ahead of Python rows, the ids being canonical already) is to hand the engine the Avro bytes
the counting stage wrote and let it decode them: no fastavro decode, no Python tuples, no
Native serialisation. A batch of bodies written with the current PricedUsage schema
becomes one Avro object-container file (the schema, then one block holding the bodies as
they are) that ``INSERT ... SELECT ... FROM file(<path>, 'Avro', <structure>)`` reads,
naming the event's nested fields by path (``event.secret_id``).

Only bodies whose record carries ``schemas.topics.STORE_ROW_HEADER`` come this way: the
counting stage sets it when the event's ids are canonical, i.e. when the body is the row
as stored. The others are decoded and canonicalised in Python (``rows_from_priced``).

The container is built here, not by fastavro's ``writer``: that one takes records and
would encode them again, which is the cost this path avoids. fastavro writes the header
(schema, codec, sync marker); a block is two Avro longs (count, byte size), the bodies,
and the sync marker again (Avro 1.11 specification, "Object Container Files").
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Final

from fastavro import parse_schema, schemaless_writer, writer

from aggregator.sink.batch import bodies
from schemas.avro_schemas import expanded_schemas
from schemas.codec import HEADER_LEN

#: the sync marker of every container this module writes (any 16 bytes will do; fixed, so
#: the same bodies always make the same file)
SYNC_MARKER: Final = b"spendbus-sink-v1"
_LONG: Final = parse_schema("long")


@cache
def _container_header(schema_name: str) -> bytes:
    head = io.BytesIO()
    writer(head, parse_schema(expanded_schemas()[schema_name]), [], sync_marker=SYNC_MARKER)
    return head.getvalue()


def _long(value: int) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, _LONG, value)
    return out.getvalue()


def container(messages: Sequence[bytes], schema_name: str = "PricedUsage") -> bytes:
    """One Avro object-container file of ``messages``, single-object encoded, every one
    written with the current ``schema_name`` schema (the caller checks their header)."""
    parts, size = bodies(messages, HEADER_LEN)
    return b"".join(
        (_container_header(schema_name), _long(len(parts)), _long(size), *parts, SYNC_MARKER)
    )


@cache
def _sources(schema_name: str) -> dict[str, str]:
    """Column name -> the container's column holding it: a field by its name, a field of
    a nested record by its path (PricedUsage's ``event.secret_id``)."""
    fields = expanded_schemas()[schema_name]["fields"]
    sources: dict[str, str] = {}
    for field in fields:
        kind = field["type"]
        if isinstance(kind, dict) and kind.get("type") == "record":
            for nested in kind["fields"]:
                sources.setdefault(nested["name"], f"{field['name']}.{nested['name']}")
    sources.update((field["name"], field["name"]) for field in fields)
    return sources


def insert_select(
    table: str,
    columns: Sequence[tuple[str, str]],
    path: str,
    schema_name: str = "PricedUsage",
    settings: Mapping[str, int | str] | None = None,
) -> str:
    """``INSERT INTO table (columns) SETTINGS ... SELECT ... FROM file(path, 'Avro',
    structure)``: each column is the ``schema_name`` field of its name, or a nested
    record's (``event.<name>``), read as its column type (``columns`` are (name, ClickHouse
    type) pairs).

    The insert's ``settings`` are part of the statement: passed to clickhouse-connect's
    chdb client instead, each call reads the session's settings, SETs every one and SETs
    them back, a dozen engine queries whose CPU every INSERT paid (issue 19).

    The structure names every field by its path and type, so the engine infers nothing
    and reads the nested fields straight into columns: a select of 40 subcolumns of an
    inferred ``event`` tuple cost every INSERT an inference before its first row (issue 19). A
    ``LowCardinality`` column is read as its plain type and cast in the select, once per
    column: read straight into ``LowCardinality``, Avro's enums and strings cost more than
    the whole parse otherwise does (bench/bench_sink.py)."""
    sources = _sources(schema_name)
    fields = []
    exprs = []
    for name, kind in columns:
        if name not in sources:
            raise ValueError(f"{table} column {name!r} is no {schema_name} field")
        plain = _without_low_cardinality(kind)
        fields.append(f"`{sources[name]}` {plain}")
        read = (
            f"`{sources[name]}`" if plain == kind else f"CAST(`{sources[name]}`, {_quoted(kind)})"
        )
        exprs.append(f"{read} AS `{name}`")
    clause = ""
    if settings:
        clause = (
            "SETTINGS "
            + ", ".join(
                f"{name} = {_quoted(value) if isinstance(value, str) else int(value)}"
                for name, value in settings.items()
            )
            + " "
        )
    return (
        f"INSERT INTO {table} ({', '.join(f'`{name}`' for name, _ in columns)}) {clause}"
        f"SELECT {', '.join(exprs)} FROM file({_quoted(path)}, 'Avro', {_quoted(', '.join(fields))})"
    )


def _without_low_cardinality(kind: str) -> str:
    """``LowCardinality(T)`` -> ``T``; any other type as it is."""
    if kind.startswith("LowCardinality(") and kind.endswith(")"):
        return kind[len("LowCardinality(") : -1]
    return kind


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ContainerFile:
    """A container written to a private file (0600, removed on exit) for the engine to read.

    One file a batch: the engine parses files in parallel, but the insert after the parse
    runs in one stream (``max_insert_threads=1``: one part a month) and takes most of the
    time, so more files measured no faster (bench/bench_sink.py, issue 19)."""

    def __init__(
        self,
        messages: Sequence[bytes],
        directory: str | None = None,
        schema_name: str = "PricedUsage",
    ) -> None:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed here, removed in __exit__)
            prefix=f"{schema_name.lower()}-", suffix=".avro", dir=directory, delete=False
        )
        try:
            handle.write(container(messages, schema_name))
        finally:
            handle.close()
        self.path = handle.name

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

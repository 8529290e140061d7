"""Publish UsageEvents from a JSON-lines file (backfills, imports, tests).

Two passes over the file, so memory stays bounded whatever its size:

1. **validate** every line (JSON, then ``usage_event_from_json``, then the
   publisher's encoding checks). Errors name the line number and the field.
   By default, any invalid line stops everything *before anything is
   published*. With ``skip_invalid`` the invalid lines are written to
   ``<name>.rejected.jsonl`` beside the file (one JSON object per line:
   ``line``, ``event_id``, ``field``, ``reason``, ``raw``) and the valid ones go on.
2. **publish** the valid lines in order, with a progress bar, then wait for the
   broker's acknowledgement and report a summary.

Every line must carry its ``event_id``: running the same file twice publishes
the same ids again, which the aggregator counts once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ingest.errors import IngestError, reason_of
from ingest.publisher import PreparedEvent, UsagePublisher, prepare
from schemas.errors import InvalidRecord
from schemas.usage import usage_event_from_json

#: a line longer than this is refused without being parsed
MAX_LINE_BYTES: Final = 1024 * 1024
#: events per publish call
BATCH: Final = 2000
#: invalid lines kept in memory for the report (all of them go to the rejects file)
KEEP_ERRORS: Final = 1000


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    event_id: str | None
    field: str
    reason: str
    raw: str

    def describe(self) -> str:
        where = f"line {self.line}" + (f" (event {self.event_id})" if self.event_id else "")
        return f"{where}: field {self.field!r}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "event_id": self.event_id,
            "field": self.field,
            "reason": self.reason,
            "raw": self.raw,
        }


@dataclass
class JsonlReport:
    path: Path
    lines: int = 0
    valid: int = 0
    rejected: int = 0
    published: int = 0
    seconds: float = 0.0
    rejects_path: Path | None = None
    #: the first KEEP_ERRORS invalid lines
    errors: list[LineError] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "lines": self.lines,
            "valid": self.valid,
            "rejected": self.rejected,
            "published": self.published,
            "seconds": round(self.seconds, 3),
            "rejects_file": str(self.rejects_path) if self.rejects_path else None,
        }


class InvalidLines(IngestError):
    """The file has invalid lines and ``skip_invalid`` was not given: nothing was published."""

    def __init__(self, report: JsonlReport) -> None:
        first = report.errors[0].describe() if report.errors else "?"
        super().__init__(
            f"{report.path}: {report.rejected} invalid line(s) of {report.lines}; nothing "
            f"published (first: {first}); fix them or pass --skip-invalid"
        )
        self.report = report


def rejects_path_for(path: Path) -> Path:
    """``events.jsonl`` -> ``events.rejected.jsonl``, beside it."""
    stem = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name
    return path.with_name(f"{stem}.rejected.jsonl")


def _lines(handle: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) for each non-blank line; bytes None for an over-long line."""
    number = 0
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of it
                raw = handle.readline(MAX_LINE_BYTES)
            yield number, None
            continue
        if raw.strip():
            yield number, raw


def read_events(
    path: Path, *, max_record_bytes: int | None = None
) -> Iterator[PreparedEvent | LineError]:
    """Each non-blank line of ``path``, checked: a PreparedEvent or the LineError saying why not."""
    limits = {} if max_record_bytes is None else {"max_record_bytes": max_record_bytes}
    with path.open("rb") as handle:
        for number, raw in _lines(handle):
            if raw is None:
                yield LineError(number, None, "<line>", f"longer than {MAX_LINE_BYTES} bytes", "")
                continue
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                yield LineError(number, None, "<json>", f"invalid JSON: {exc}", text)
                continue
            try:
                yield prepare(usage_event_from_json(obj), **limits)
            except InvalidRecord as exc:
                event_id = exc.record_id
                if event_id is None and isinstance(obj, dict):
                    candidate = obj.get("event_id")
                    event_id = candidate if isinstance(candidate, str) else None
                yield LineError(number, event_id, exc.field, reason_of(exc), text)


def validate_file(
    path: Path, *, skip_invalid: bool, max_record_bytes: int | None = None
) -> JsonlReport:
    """Pass 1: count valid and invalid lines; with ``skip_invalid``, write the rejects file."""
    report = JsonlReport(path)
    rejects = None
    target = rejects_path_for(path)
    try:
        for item in read_events(path, max_record_bytes=max_record_bytes):
            report.lines += 1
            if isinstance(item, PreparedEvent):
                report.valid += 1
                continue
            report.rejected += 1
            if len(report.errors) < KEEP_ERRORS:
                report.errors.append(item)
            if skip_invalid:
                if rejects is None:
                    rejects = target.open("w", encoding="utf-8")
                    report.rejects_path = target
                rejects.write(json.dumps(item.to_json(), ensure_ascii=False) + "\n")
    finally:
        if rejects is not None:
            rejects.close()
    if skip_invalid and rejects is None:
        target.unlink(missing_ok=True)  # no stale rejects from an earlier run
    return report


async def ingest_file(
    path: Path,
    publisher: UsagePublisher,
    *,
    skip_invalid: bool = False,
    ack_timeout_s: float = 60.0,
    console: Console | None = None,
) -> JsonlReport:
    """Validate ``path`` then publish its valid events; waits for the broker's acknowledgement.

    Raises InvalidLines (nothing published) when a line is invalid and not
    ``skip_invalid``; PublishTimeout when the broker did not acknowledge within
    ``ack_timeout_s`` (the events stay spooled and are sent at the next start).
    """
    console = console or Console(stderr=True)
    started = time.monotonic()
    limit = publisher.config.max_record_bytes
    report = validate_file(path, skip_invalid=skip_invalid, max_record_bytes=limit)
    if report.rejected and not skip_invalid:
        raise InvalidLines(report)
    progress = Progress(
        TextColumn("publishing {task.fields[name]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task("publish", total=report.valid, name=path.name)
        batch: list[PreparedEvent] = []
        for item in read_events(path, max_record_bytes=limit):
            if isinstance(item, LineError):
                continue  # counted and written by pass 1
            batch.append(item)
            if len(batch) >= BATCH:
                report.published += await publisher.publish_prepared(batch)
                progress.advance(task, len(batch))
                batch = []
        if batch:
            report.published += await publisher.publish_prepared(batch)
            progress.advance(task, len(batch))
    await publisher.flush(ack_timeout_s)
    report.seconds = time.monotonic() - started
    return report


__all__ = [
    "InvalidLines",
    "JsonlReport",
    "LineError",
    "ingest_file",
    "read_events",
    "rejects_path_for",
    "validate_file",
]

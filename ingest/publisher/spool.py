"""The on-disk spool: an append-only, CRC-checked, bounded log of encoded UsageEvents.

Every event a publisher accepts is written here first (write-ahead) and read
back by the sender, in order, to be published; the spool forgets an event only
once the broker acknowledged it.

Directory layout::

    LOCK                     flock()ed by the owning process (released when it dies, even by kill -9)
    cursor                   the acknowledged position: u64 LE offset + u32 LE crc32 of those 8 bytes
    <base:020d>.seg          segments, named by the logical offset of their first frame

A segment is an 8-byte header (``SBSPOOL`` + format version 1), then frames
(spool_frames.py: a length, a CRC and the record's key and value).

Offsets are *logical*: they count frame bytes only, across segments, so a
segment holds ``[base, next segment's base)`` and "bytes not yet acknowledged"
is ``write_end - acked``.

Crash safety, step by step:

1. ``append`` writes whole frames with one ``write()`` into the page cache: once it
   returns, a crash of the process loses nothing. Surviving a crash of the
   machine needs ``sync()`` (fsync); when it runs is the publisher's fsync policy.
2. A crash may tear the last frame (or leave zeroes past the data on some file
   systems). On open, the last segment is scanned from the acknowledged position
   (or its start), the first frame whose length or CRC does not check out marks
   the end, and the file is truncated there (the torn event was never
   acknowledged to its caller as durable, see the publisher's README).
3. The cursor is overwritten in place by one ``pwrite()`` of its 12 bytes (the
   file stays open: no temporary file and rename on the event loop ten times a
   second). A crash of the process cannot tear a single small write; a power loss
   could, and a torn cursor fails its CRC, which means starting from the oldest
   segment. It is not fsynced either: a stale or lost cursor only makes the sender
   publish again events the broker already has, under the same event ids (the
   aggregator dedupes by event_id). A cursor ahead of the data (power loss ate unsynced segment data that
   had been acknowledged anyway) is clamped to the end.
4. A segment is deleted only when it is sealed and every frame in it is below the
   cursor that was just written.

A frame that fails its CRC inside a sealed segment is disk corruption, not a crash:
the rest of that segment is skipped, logged and counted (``corrupt_bytes``).
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ingest.errors import SpoolError, SpoolLocked
from ingest.publisher.spool_frames import SpooledRecord, frame, frames_of, scan_frames

log = logging.getLogger(__name__)

SEGMENT_MAGIC: Final = b"SBSPOOL\x01"
HEADER_LEN: Final = len(SEGMENT_MAGIC)
CURSOR: Final = struct.Struct("<QI")
SEGMENT_SUFFIX: Final = ".seg"
#: the names of the segments this spool writes (``<base:020d>.seg``)
_SEGMENT_NAME: Final = re.compile(r"[0-9]{20}\.seg")
#: what a ``*.seg`` file that is not a segment is renamed to end with (out of the way)
FOREIGN_SUFFIX: Final = ".foreign"
#: spool files hold user ids: readable and writable by their owner only
FILE_MODE: Final = 0o600


@dataclass
class _Segment:
    base: int
    path: Path
    fd: int
    #: file size in bytes, header included
    size: int

    @property
    def data_bytes(self) -> int:
        return self.size - HEADER_LEN


@dataclass(frozen=True)
class Recovery:
    """What :meth:`Spool.open` found and repaired."""

    truncated_bytes: int
    segments: int
    pending_bytes: int
    #: ``*.seg`` files that are not this spool's segments (skipped, never read or deleted)
    foreign_files: tuple[str, ...] = ()


class Spool:
    """A bounded, append-only log of (key, value) records on local disk.

    Not thread-safe; meant for one asyncio loop. One ``Spool`` per directory
    and process (enforced with a lock file). See the module docstring for the
    format and the crash guarantees.
    """

    def __init__(self, directory: Path, *, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._lock_fd: int | None = None
        self._cursor_fd: int | None = None
        self.write_end = 0
        self.acked = 0
        #: acked position last written to the cursor file
        self.persisted = 0
        self.corrupt_bytes = 0
        self.recovery = Recovery(0, 0, 0)
        self._foreign: list[str] = []
        #: frames at or past this offset were written by this process (from memory, whole):
        #: reading them back skips the CRC check; older ones are checked
        self._trusted_from = 0

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, *, segment_bytes: int) -> Spool:
        spool = cls(directory, segment_bytes=segment_bytes)
        try:
            spool._open()
        except BaseException:
            spool.close()
            raise
        return spool

    def _open(self) -> None:
        try:
            # the records hold user ids: the owner's only (an older spool's too)
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._private(self.directory, 0o700)
            self._lock_fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, FILE_MODE)
            os.fchmod(self._lock_fd, FILE_MODE)
        except OSError as exc:
            raise SpoolError(f"cannot open spool directory {self.directory}: {exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SpoolLocked(
                f"spool {self.directory} is in use by another publisher (one per directory)"
            ) from None
        (self.directory / "cursor.tmp").unlink(missing_ok=True)  # left by an older version
        for path in self._segment_paths():
            self._open_segment(path)
        cursor = self._read_cursor()
        truncated = self._recover_tail(cursor)
        if self._segments:
            last = self._segments[-1]
            self.write_end = last.base + last.data_bytes
            first_base = self._segments[0].base
        else:
            self.write_end = cursor if cursor is not None else 0
            first_base = self.write_end
        acked = first_base if cursor is None else cursor
        if acked > self.write_end:
            log.warning(
                "spool %s: cursor %d is past the end of the data %d (unsynced data lost in a "
                "machine crash had been acknowledged already); clamped",
                self.directory,
                acked,
                self.write_end,
            )
            acked = self.write_end
        if acked < first_base:
            log.warning(
                "spool %s: cursor %d points before the oldest segment %d; resuming there",
                self.directory,
                acked,
                first_base,
            )
            acked = first_base
        self.acked = self.persisted = acked
        self._cursor_fd = os.open(self.directory / "cursor", os.O_RDWR | os.O_CREAT, FILE_MODE)
        os.fchmod(self._cursor_fd, FILE_MODE)
        self._release_below(acked)
        if not self._segments:
            self._new_segment(self.write_end)
        self.recovery = Recovery(
            truncated, len(self._segments), self.write_end - self.acked, tuple(self._foreign)
        )
        self._trusted_from = self.write_end

    def _private(self, path: Path, mode: int) -> None:
        """Take group and other access away from ``path`` (warn when it cannot be done)."""
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(mode)
        except OSError as exc:
            log.warning(
                "spool %s: cannot make %s private to its owner: %s", self.directory, path, exc
            )

    def _segment_paths(self) -> list[Path]:
        """This spool's segments, oldest first. Another ``*.seg`` (a stray copy, a name this
        spool never writes, a directory) is skipped with a warning, never read nor deleted."""
        found: list[Path] = []
        for path in self.directory.iterdir():
            if not path.name.endswith(SEGMENT_SUFFIX):
                continue
            if _SEGMENT_NAME.fullmatch(path.name) is None or not path.is_file():
                self._skip_foreign(path, "not a segment name this spool writes")
                continue
            found.append(path)
        return sorted(found, key=lambda p: int(p.name[: -len(SEGMENT_SUFFIX)]))

    def _skip_foreign(self, path: Path, why: str) -> None:
        self._foreign.append(path.name)
        log.warning(
            "spool %s: %s skipped (%s); it is left as it is", self.directory, path.name, why
        )

    def _open_segment(self, path: Path) -> None:
        base = int(path.name[: -len(SEGMENT_SUFFIX)])
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        size = os.fstat(fd).st_size
        header = os.pread(fd, HEADER_LEN, 0)
        if header != SEGMENT_MAGIC:
            os.close(fd)
            if size <= HEADER_LEN and SEGMENT_MAGIC.startswith(header):
                # created but never written (crash while rolling): nothing in it
                path.unlink()
                return
            # not ours: moved out of the way of a segment this spool may create at that base
            aside = path.with_name(path.name + FOREIGN_SUFFIX)
            path.rename(aside)
            self._skip_foreign(path, f"bad header {header!r}; renamed {aside.name}")
            return
        os.fchmod(fd, FILE_MODE)
        if self._segments and base != self._segments[-1].base + self._segments[-1].data_bytes:
            last = self._segments[-1]
            # a sealed segment shorter than its successor's base says: bytes are missing
            # (disk corruption or hand editing). Read what is there and skip the gap.
            log.error(
                "spool %s: gap between %s (ends at %d) and %s; the missing bytes are skipped",
                self.directory,
                last.path.name,
                last.base + last.data_bytes,
                path.name,
            )
        self._segments.append(_Segment(base, path, fd, size))
        self._bases.append(base)

    def _read_cursor(self) -> int | None:
        try:
            raw = (self.directory / "cursor").read_bytes()
        except FileNotFoundError:
            return None
        if not raw:  # created, never written: nothing was acknowledged yet
            return None
        if len(raw) == CURSOR.size:
            offset, crc = CURSOR.unpack(raw)
            if zlib.crc32(raw[:8]) == crc:
                return int(offset)
        log.warning(
            "spool %s: unreadable cursor file; every spooled event is sent again "
            "(same event ids, deduplicated downstream)",
            self.directory,
        )
        return None

    def _recover_tail(self, cursor: int | None) -> int:
        """Truncate the last segment after its last whole, CRC-valid frame; bytes removed."""
        if not self._segments:
            return 0
        last = self._segments[-1]
        start = last.base
        if cursor is not None and last.base <= cursor <= last.base + last.data_bytes:
            start = cursor  # frames below the cursor were read (and checked) before the crash
        pos = start
        end = last.base + last.data_bytes
        while pos < end:
            used, bad = self._scan_at(last, pos, end, 1 << 20, None)
            pos += used
            if bad or not used:
                break
        if pos < end:
            torn = end - pos
            log.warning(
                "spool %s: torn or corrupt tail in %s: %d bytes after offset %d truncated",
                self.directory,
                last.path.name,
                torn,
                pos,
            )
            os.ftruncate(last.fd, HEADER_LEN + pos - last.base)
            os.fsync(last.fd)
            last.size = HEADER_LEN + pos - last.base
            return torn
        return 0

    # -- writing ---------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Bytes written and not acknowledged yet."""
        return self.write_end - self.acked

    @property
    def disk_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def _new_segment(self, base: int) -> _Segment:
        path = self.directory / f"{base:020d}{SEGMENT_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.write(fd, SEGMENT_MAGIC)
        segment = _Segment(base, path, fd, HEADER_LEN)
        self._segments.append(segment)
        self._bases.append(base)
        _fsync_dir(self.directory)
        return segment

    def append(self, frames: bytes) -> int:
        """Write whole frames (from :func:`frame`) in one write; returns the new end offset.

        The caller checks the bound first. On a failed write (disk full...) the
        segment is cut back to its previous size and SpoolError is raised: the
        frames are not in the spool.
        """
        if not frames:
            return self.write_end
        active = self._segments[-1]
        if active.data_bytes > 0 and active.data_bytes + len(frames) > self.segment_bytes:
            try:
                os.fsync(active.fd)  # a sealed segment is complete on disk before the next begins
                active = self._new_segment(self.write_end)
            except OSError as exc:
                raise SpoolError(f"spool {self.directory}: cannot start a segment: {exc}") from None
        view = memoryview(frames)
        written = 0
        try:
            while written < len(view):
                written += os.write(active.fd, view[written:])
        except OSError as exc:
            if written:
                os.ftruncate(active.fd, active.size)
            if exc.errno == errno.ENOSPC:
                raise SpoolError(f"spool {self.directory}: disk full") from None
            raise SpoolError(f"spool {self.directory}: write failed: {exc}") from None
        active.size += written
        self.write_end += written
        return self.write_end

    def sync_fd(self) -> int:
        """A duplicate of the active segment's descriptor, to fsync off the event loop.

        The caller closes it. (A duplicate, so that the segment may be closed meanwhile.)
        """
        return os.dup(self._segments[-1].fd)

    def sync(self) -> None:
        os.fsync(self._segments[-1].fd)

    # -- reading ---------------------------------------------------------------------------------

    def read(self, pos: int, max_bytes: int) -> tuple[list[SpooledRecord], int]:
        """Records from logical offset ``pos``, about ``max_bytes`` of them; and the next offset.

        Returns no records only at the end of the data, or past a corrupt stretch
        (then the next offset is past it).
        """
        records: list[SpooledRecord] = []
        while not records and pos < self.write_end:
            index = bisect.bisect_right(self._bases, pos) - 1
            if index < 0:  # below the oldest segment (not after open): resume at the oldest
                pos = self._bases[0]
                continue
            segment = self._segments[index]
            seg_end = segment.base + segment.data_bytes
            if pos >= seg_end:
                # past this segment's data: the next segment (a gap only after corruption)
                pos = self._segments[index + 1].base
                continue
            used, bad = self._scan_at(
                segment, pos, seg_end, max_bytes, records, pos >= self._trusted_from
            )
            pos += used
            if bad or not used:
                # a bad frame or a frame cut short inside written data: disk corruption
                skipped = seg_end - pos
                self.corrupt_bytes += skipped
                log.error(
                    "spool %s: corrupt frame at offset %d in %s: %d bytes skipped",
                    self.directory,
                    pos,
                    segment.path.name,
                    skipped,
                )
                pos = seg_end
        return records, pos

    @staticmethod
    def _scan_at(
        segment: _Segment,
        pos: int,
        end: int,
        want: int,
        out: list[SpooledRecord] | None,
        trusted: bool = False,
    ) -> tuple[int, bool]:
        """Scan whole frames of ``segment`` from logical ``pos`` (below ``end``), about ``want`` bytes."""
        want = min(want, end - pos)
        while True:
            buf = os.pread(segment.fd, want, HEADER_LEN + pos - segment.base)
            used, bad = scan_frames(buf, out, trusted)
            if used or bad or want >= end - pos:
                return used, bad
            want = min(want * 2, end - pos)  # one frame larger than ``want``: read it whole

    # -- acknowledging ---------------------------------------------------------------------------

    def ack(self, offset: int) -> None:
        """Everything below ``offset`` was acknowledged by the broker (in memory only)."""
        if offset > self.acked:
            self.acked = offset

    def persist(self) -> int:
        """Write the cursor file, then delete segments wholly below it; returns bytes freed on disk."""
        if self.acked == self.persisted:
            return 0
        offset = self.acked
        if self._cursor_fd is None:
            raise SpoolError(f"spool {self.directory} is closed")
        raw = struct.pack("<Q", offset)
        os.pwrite(self._cursor_fd, raw + struct.pack("<I", zlib.crc32(raw)), 0)
        self.persisted = offset
        return self._release_below(offset)

    def _release_below(self, offset: int) -> int:
        freed = 0
        while len(self._segments) > 1 and self._segments[1].base <= offset:
            segment = self._segments.pop(0)
            self._bases.pop(0)
            os.close(segment.fd)
            segment.path.unlink(missing_ok=True)
            freed += segment.size
        return freed

    def close(self) -> None:
        """Write the cursor, close the files and release the lock (idempotent)."""
        if self._segments and self._cursor_fd is not None:  # None: opening failed
            try:
                self.persist()
            except OSError as exc:  # the data is safe; only a resend would follow
                log.warning("spool %s: cannot write the cursor on close: %s", self.directory, exc)
        for segment in self._segments:
            os.close(segment.fd)
        self._segments.clear()
        if self._cursor_fd is not None:
            os.close(self._cursor_fd)
            self._cursor_fd = None
        self._bases.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# frame and frames_of stay importable from here: the publisher frames its events through it
__all__: Sequence[str] = ["Recovery", "Spool", "SpooledRecord", "frame", "frames_of"]

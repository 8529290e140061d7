"""The spool's frames: one (key, value) record each, written whole and checked on reading.

::

    u32 LE payload length | u32 LE crc32(payload) | payload
    payload = u16 LE key length | key (the Kafka key: org_id) | value (the Avro-encoded UsageEvent)

spool.py lays them end to end in its segments; the publisher frames each event it accepts.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Final

FRAME_HEAD: Final = struct.Struct("<II")
KEY_LEN: Final = struct.Struct("<H")
#: a frame longer than this is garbage (an encoded UsageEvent is far smaller)
MAX_FRAME: Final = 16 * 1024 * 1024

_FRAME_KEY_HEAD: Final = struct.Struct("<IIH")

#: one record read back: (key, value)
SpooledRecord = tuple[bytes, bytes]


def frame(
    key: bytes,
    value: bytes,
    _key_len: Callable[[int], bytes] = KEY_LEN.pack,
    _head: Callable[[int, int], bytes] = FRAME_HEAD.pack,
    _crc32: Callable[[bytes], int] = zlib.crc32,
) -> bytes:
    """The bytes of one spool frame holding ``key`` and ``value``."""
    payload = b"".join((_key_len(len(key)), key, value))
    return _head(len(payload), _crc32(payload)) + payload


def scan_frames(
    buf: bytes, out: list[SpooledRecord] | None = None, trusted: bool = False
) -> tuple[int, bool]:
    """Walk whole frames in ``buf``; returns (bytes of whole valid frames, hit a bad frame).

    With ``out``, appends each record's (key, value). ``trusted`` skips the CRC
    (frames this process wrote itself). A frame cut by the end of ``buf`` stops
    the walk without being bad.
    """
    size = len(buf)
    pos = 0
    unpack = _FRAME_KEY_HEAD.unpack_from
    crc32 = zlib.crc32
    while pos + 10 <= size:
        length, crc, key_len = unpack(buf, pos)
        if length < 2 or length > MAX_FRAME or key_len > length - 2:
            return pos, True
        end = pos + 8 + length
        if end > size:
            return pos, False
        if not trusted and crc32(memoryview(buf)[pos + 8 : end]) != crc:
            return pos, True
        if out is not None:
            key_end = pos + 10 + key_len
            out.append((buf[pos + 10 : key_end], buf[key_end:end]))
        pos = end
    if pos + 8 <= size:  # a header too short for its key length field: a bad length
        (length,) = struct.unpack_from("<I", buf, pos)
        if length < 2 or length > MAX_FRAME:
            return pos, True
    return pos, False


def frames_of(records: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"".join(frame(k, v) for k, v in records)


__all__: Sequence[str] = ["MAX_FRAME", "SpooledRecord", "frame", "frames_of", "scan_frames"]

"""AWS event-stream framing (``application/vnd.amazon.eventstream``), incremental.

One message::

    total length    u32 big-endian   (the whole message, these 4 bytes included)
    headers length  u32
    prelude CRC     u32              CRC32 of the 8 bytes above
    headers         name length u8, name, value type u8, value (see _HEADER_TYPES)
    payload         total - headers - 16 bytes
    message CRC     u32              CRC32 of everything before it

Both CRCs are checked; a mismatch, an impossible length or a message larger
than the limit raises :class:`EventStreamError`: after it the stream cannot be
re-synchronised, so the tap stops reading. :func:`encode_message` builds
messages (tests and benchmarks use it).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from .base import FRAME_LIMIT

HeaderValue = bool | int | bytes | str | uuid.UUID
OnMessage = Callable[[dict[str, HeaderValue], bytes], None]
OnMessages = Callable[[list[tuple[dict[str, HeaderValue], bytes]]], None]

_PRELUDE = struct.Struct(">III")
_U32 = struct.Struct(">I")


class EventStreamError(Exception):
    """The event stream is corrupt or exceeds the bounds; reading stops."""


class EventStreamDecoder:
    """Calls ``on_message(headers, payload)`` for each complete, verified message.

    The headers dict may be shared between messages: treat it as read-only.
    """

    def __init__(
        self,
        on_message: OnMessage,
        *,
        max_message: int = FRAME_LIMIT,
        on_messages: OnMessages | None = None,
    ) -> None:
        self.on_message = on_message
        #: Receives the verified messages of one ``feed`` together, in order.
        self.on_messages = on_messages
        self.max_message = max_message
        self.messages = 0
        self._buf = bytearray()
        self._headers: dict[bytes, dict[str, HeaderValue]] = {}
        self._need = 0  # length of the pending message, once its prelude is in
        self._last_raw = b""
        self._last_headers: dict[str, HeaderValue] = {}

    @property
    def pending(self) -> int:
        """Bytes of an unfinished message (non-zero at the end: truncated)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            if len(buf) + len(data) < self._need:  # still inside one message
                buf += data
                return
            buf += data
            data = bytes(buf)
            buf.clear()
        on_messages = self.on_messages
        if on_messages is None:
            self._read(data, None)
            return
        batch: list[tuple[dict[str, HeaderValue], bytes]] = []
        try:
            self._read(data, batch)
        finally:  # what was verified before a corrupt message is read, as one by one
            if batch:
                on_messages(batch)

    def _read(self, data: bytes, batch: list[tuple[dict[str, HeaderValue], bytes]] | None) -> None:
        buf = self._buf
        off = 0
        n = len(data)
        crc32 = zlib.crc32
        headers_cache = self._headers
        # the header bytes of the last message and their dict: consecutive messages
        # mostly share them, compared in place (no slice, no hash)
        last_raw = self._last_raw
        last_headers = self._last_headers
        while n - off >= 12:
            total: int
            headers_len: int
            prelude_crc: int
            total, headers_len, prelude_crc = _PRELUDE.unpack_from(data, off)
            if crc32(data[off : off + 8]) != prelude_crc:
                raise EventStreamError("event-stream prelude CRC mismatch")
            if total < 16 or headers_len > total - 16:
                raise EventStreamError(f"event-stream message length {total} is impossible")
            if total > self.max_message:
                raise EventStreamError(
                    f"event-stream message of {total} bytes exceeds {self.max_message}"
                )
            end = off + total
            if end > n:
                self._need = total
                break
            message_crc: int = _U32.unpack_from(data, end - 4)[0]
            if crc32(data[off : end - 4]) != message_crc:
                raise EventStreamError("event-stream message CRC mismatch")
            at = off + 12
            if headers_len == len(last_raw) and data.startswith(last_raw, at):
                headers = last_headers
            else:
                raw = data[at : at + headers_len]
                cached = headers_cache.get(raw)
                if cached is None:
                    cached = parse_headers(raw)
                    if len(headers_cache) < 32:  # the same few header sets repeat
                        headers_cache[raw] = cached
                headers = last_headers = cached
                last_raw = raw
            off = end
            self.messages += 1
            if batch is not None:
                batch.append((headers, data[at + headers_len : end - 4]))
            else:
                self.on_message(headers, data[at + headers_len : end - 4])
        self._last_raw = last_raw
        self._last_headers = last_headers
        if off < n:
            buf += data[off:] if off else data
        if n - off < 12:
            self._need = 0


def parse_headers(raw: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    i, n = 0, len(raw)
    try:
        while i < n:
            name_len = raw[i]
            name = raw[i + 1 : i + 1 + name_len].decode("utf-8")
            i += 1 + name_len
            kind = raw[i]
            i += 1
            value: HeaderValue
            if kind == 0:
                value = True
            elif kind == 1:
                value = False
            elif kind in _INT_SIZES:
                size = _INT_SIZES[kind]
                if i + size > n:
                    raise IndexError
                value = int.from_bytes(raw[i : i + size], "big", signed=True)
                i += size
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", raw, i)
                if i + 2 + length > n:
                    raise IndexError
                chunk = raw[i + 2 : i + 2 + length]
                value = chunk.decode("utf-8") if kind == 7 else chunk
                i += 2 + length
            elif kind == 9:
                if i + 16 > n:
                    raise IndexError
                value = uuid.UUID(bytes=raw[i : i + 16])
                i += 16
            else:
                raise EventStreamError(f"event-stream header type {kind} is unknown")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(
            f"event-stream headers are malformed ({type(exc).__name__})"
        ) from None
    return headers


#: Integer header types: byte, short, int, long, timestamp (ms since epoch).
_INT_SIZES = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8}


def encode_message(headers: Mapping[str, HeaderValue], payload: bytes) -> bytes:
    """One event-stream message with correct CRCs (strings, bytes, bools, int32)."""
    raw = bytearray()
    for name, value in headers.items():
        encoded = name.encode()
        raw += bytes([len(encoded)]) + encoded
        if isinstance(value, bool):
            raw += b"\x00" if value else b"\x01"
        elif isinstance(value, int):
            raw += b"\x04" + value.to_bytes(4, "big", signed=True)
        elif isinstance(value, bytes):
            raw += b"\x06" + struct.pack(">H", len(value)) + value
        elif isinstance(value, uuid.UUID):
            raw += b"\x09" + value.bytes
        else:
            text = value.encode()
            raw += b"\x07" + struct.pack(">H", len(text)) + text
    total = 16 + len(raw) + len(payload)
    prelude = struct.pack(">II", total, len(raw))
    message = prelude + _U32.pack(zlib.crc32(prelude)) + bytes(raw) + payload
    return message + _U32.pack(zlib.crc32(message))


def message_kind(headers: Mapping[str, Any]) -> tuple[str, str]:
    """``(message type, event or exception type)`` of a message's headers."""
    kind = headers.get(":message-type")
    kind = kind if isinstance(kind, str) else ""
    if kind == "exception":
        name = headers.get(":exception-type")
    elif kind == "error":
        name = headers.get(":error-code")
    else:
        name = headers.get(":event-type")
    return kind, name if isinstance(name, str) else ""

"""AWS event-stream messages (Bedrock's streams): string headers, both CRC32s."""

from __future__ import annotations

import struct
import zlib

_U32 = struct.Struct(">I")


def event_stream_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message with string headers and both CRC32s."""
    raw = bytearray()
    for name, value in headers.items():
        key = name.encode()
        text = value.encode()
        raw += bytes([len(key)]) + key + b"\x07" + struct.pack(">H", len(text)) + text
    total = 16 + len(raw) + len(payload)
    prelude = struct.pack(">II", total, len(raw))
    message = prelude + _U32.pack(zlib.crc32(prelude)) + bytes(raw) + payload
    return message + _U32.pack(zlib.crc32(message))

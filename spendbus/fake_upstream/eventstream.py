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


def decode_message(message: bytes) -> tuple[dict[str, str], bytes]:
    """(headers, payload) of one message :func:`event_stream_message` wrote (string
    headers only; the CRCs are not checked: the fake reads its own messages)."""
    total, headers_length = struct.unpack(">II", message[:8])
    raw = message[12 : 12 + headers_length]
    headers: dict[str, str] = {}
    i = 0
    while i < len(raw):
        length = raw[i]
        name = raw[i + 1 : i + 1 + length].decode()
        i += 1 + length
        if raw[i] != 7:
            raise ValueError(f"header {name!r} is not a string")
        (size,) = struct.unpack(">H", raw[i + 1 : i + 3])
        headers[name] = raw[i + 3 : i + 3 + size].decode()
        i += 3 + size
    return headers, message[12 + headers_length : total - 4]

"""AWS event-stream framing: CRCs, headers, bounds."""

from __future__ import annotations

import contextlib
import struct
import uuid
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.taps.eventstream import (
    EventStreamDecoder,
    EventStreamError,
    encode_message,
    parse_headers,
)


def decode(data: bytes, **kwargs: Any) -> list[tuple[dict[str, Any], bytes]]:
    out: list[tuple[dict[str, Any], bytes]] = []
    EventStreamDecoder(lambda h, p: out.append((dict(h), p)), **kwargs).feed(data)
    return out


def test_round_trip_and_split_anywhere() -> None:
    messages = [
        encode_message({":event-type": "contentBlockDelta", ":message-type": "event"}, b'{"a":1}'),
        encode_message({":message-type": "event", "flag": True, "n": -5}, b""),
        encode_message({"bin": b"\x00\x01"}, b"x" * 300),
    ]
    stream = b"".join(messages)
    want = decode(stream)
    assert [p for _, p in want] == [b'{"a":1}', b"", b"x" * 300]
    assert want[1][0] == {":message-type": "event", "flag": True, "n": -5}
    for i in range(len(stream) + 1):
        got: list[Any] = []

        def collect(headers: Any, payload: bytes, got: list[Any] = got) -> None:
            got.append((dict(headers), payload))

        decoder = EventStreamDecoder(collect)
        decoder.feed(stream[:i])
        decoder.feed(stream[i:])
        assert got == want and decoder.pending == 0


def test_consecutive_messages_with_headers_of_the_same_length() -> None:
    """The decoder reuses the last message's headers when the next one's header bytes are
    the same: headers of the same length but other bytes are read anew, in one feed
    (batched) or one by one, and a repeated header set keeps its one dict."""
    sets = [
        {":event-type": "abcd", ":message-type": "event"},
        {":event-type": "abcd", ":message-type": "event"},
        {":event-type": "wxyz", ":message-type": "event"},
        {":event-type": "abcd", ":message-type": "error"},
        {":event-type": "abcd", ":message-type": "event"},
    ]
    stream = b"".join(encode_message(h, str(i).encode()) for i, h in enumerate(sets))
    assert decode(stream) == [(h, str(i).encode()) for i, h in enumerate(sets)]
    batches: list[list[tuple[dict[str, Any], bytes]]] = []
    EventStreamDecoder(lambda h, p: None, on_messages=batches.append).feed(stream)
    (batch,) = batches
    assert [(dict(h), p) for h, p in batch] == [(h, str(i).encode()) for i, h in enumerate(sets)]
    assert batch[0][0] is batch[1][0] is batch[4][0]
    one_by_one = EventStreamDecoder(lambda h, p: None)
    seen: list[Any] = []
    one_by_one.on_message = lambda h, p: seen.append(dict(h))
    for i in range(0, len(stream), 7):
        one_by_one.feed(stream[i : i + 7])
    assert seen == sets


def test_wrong_prelude_crc() -> None:
    message = bytearray(encode_message({"a": "b"}, b"{}"))
    message[9] ^= 0xFF
    with pytest.raises(EventStreamError, match="prelude CRC"):
        decode(bytes(message))


def test_wrong_message_crc() -> None:
    message = bytearray(encode_message({"a": "b"}, b"{}"))
    message[-1] ^= 0x01
    with pytest.raises(EventStreamError, match="message CRC"):
        decode(bytes(message))


def test_impossible_and_oversized_lengths() -> None:
    def prelude(total: int, headers: int) -> bytes:
        head = struct.pack(">II", total, headers)
        return head + struct.pack(">I", zlib.crc32(head))

    with pytest.raises(EventStreamError, match="impossible"):
        decode(prelude(8, 0))
    with pytest.raises(EventStreamError, match="impossible"):
        decode(prelude(20, 10))
    with pytest.raises(EventStreamError, match="exceeds"):
        decode(prelude(10_000_000, 0))


def test_truncated_message_is_pending() -> None:
    message = encode_message({"a": "b"}, b"{}")
    decoder = EventStreamDecoder(lambda h, p: None)
    decoder.feed(message[:-3])
    assert decoder.pending == len(message) - 3


def test_header_types() -> None:
    raw = b"".join(
        [
            b"\x01a\x00",
            b"\x01b\x01",
            b"\x01c\x02\xff",
            b"\x01d\x03\x00\x02",
            b"\x01e\x05" + (7).to_bytes(8, "big"),
            b"\x01f\x08" + (1000).to_bytes(8, "big"),
            b"\x01g\x09" + uuid.UUID(int=1).bytes,
        ]
    )
    assert parse_headers(raw) == {
        "a": True,
        "b": False,
        "c": -1,
        "d": 2,
        "e": 7,
        "f": 1000,
        "g": uuid.UUID(int=1),
    }
    with pytest.raises(EventStreamError, match="unknown"):
        parse_headers(b"\x01a\x0a")
    with pytest.raises(EventStreamError, match="malformed"):
        parse_headers(b"\x01a\x07\x00\x09ab")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_raises_only_event_stream_errors(data: bytes) -> None:
    with contextlib.suppress(EventStreamError):
        decode(data)

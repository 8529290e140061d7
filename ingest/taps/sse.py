"""Incremental parser of ``text/event-stream`` (the WHATWG SSE format).

Chunks may split anywhere: inside a line, inside a CRLF, inside a UTF-8
character. Lines end with LF, CRLF or CR; an event ends at a blank line; field
values lose one leading space; ``:`` lines are comments; ``data`` lines are
joined with LF; an event without ``data`` is not dispatched. Bytes are never
decoded here: field names are compared as bytes and data goes to the handler
(which parses it as JSON) as bytes.

Cost: a chunk holding exactly one event (what upstreams flush) is read by a few
``find``/compare calls in ``feed``; other chunks are split at blank lines in one
call, and the only Python work per event is telling its (usually one or two)
lines apart. Bytes of an unfinished event are kept in a list of parts and
joined once when it ends.

Memory: an event larger than ``limit`` is not kept; the parser switches to
streaming its ``data`` to a sink from ``open_large(name)`` (a JSON path scanner
in practice) and returns to normal parsing at the blank line that ends it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import repeat
from typing import Protocol


class LargeEventSink(Protocol):
    def feed(self, data: bytes) -> None: ...

    def close(self, name: bytes, ended: bool) -> None:
        """``ended`` is False when the stream stopped inside the event."""


OnEvent = Callable[[bytes, bytes], None]
OnEvents = Callable[[list[tuple[bytes, bytes]]], None]
OnDatas = Callable[[list[bytes]], None]
OpenLarge = Callable[[bytes], LargeEventSink]

_AT_START, _FIELD, _DATA_SPACE, _DATA, _EVENT, _SKIP = range(6)
_MAX_FIELD = 64
#: UTF-8's byte-order mark: skipped once at the start of a stream (the SSE spec)
_BOM = b"\xef\xbb\xbf"
_MAX_NAME = 256
#: One whole event of the two shapes upstreams send: an optional `event: NAME` line
#: (a non-empty name), one `data: DATA` line, a blank line; LF line ends (`.` is any
#: byte but LF). See ``_simple_events``.
_SIMPLE_EVENT = re.compile(rb"(?:event: (.+)\n)?data: (.*)\n\n")
#: The same with CRLF line ends (Gemini's). `.` also matches CR: a name or data
#: holding one (a lone CR ends a line) is refused.
_SIMPLE_EVENT_CRLF = re.compile(rb"(?:event: (.+)\r\n)?data: (.*)\r\n\r\n")


class _Large:
    """State of an event being streamed because it exceeds the limit."""

    __slots__ = ("data_started", "field", "name", "sink", "state")

    def __init__(self) -> None:
        self.state = _AT_START
        self.field = bytearray()
        self.name = b""
        self.data_started = False
        self.sink: LargeEventSink | None = None


def _strip1(value: bytes) -> bytes:
    return value[1:] if value[:1] == b" " else value


def _simple_events(buf: bytes, end: int) -> list[tuple[bytes, bytes]] | None:
    """``buf[:end]`` as ``(name, data)`` events when it is nothing but whole simple
    events back to back (what upstreams send), else None (the general path reads it).

    One findall reads them; they tile ``buf[:end]`` exactly (no byte skipped between
    or around them) when their lengths add up to ``end``, as matches never overlap.
    Then each event is read as the general path reads it: the value after `field: `.
    """
    events = _SIMPLE_EVENT.findall(buf, 0, end)
    if not events:
        return None
    names, datas = zip(*events, strict=True)
    named = len(names) - names.count(b"")
    # `data: ` + DATA + 2 LF per event, `event: ` + NAME + LF per named event
    size = sum(map(len, datas)) + 8 * len(datas) + sum(map(len, names)) + 8 * named
    return events if size == end else None


def _simple_events_crlf(buf: bytes) -> list[tuple[bytes, bytes]] | None:
    """:func:`_simple_events` of the whole of ``buf``, with CRLF line ends."""
    events = _SIMPLE_EVENT_CRLF.findall(buf)
    if not events:
        return None
    names, datas = zip(*events, strict=True)
    named = len(names) - names.count(b"")
    size = sum(map(len, datas)) + 10 * len(datas) + sum(map(len, names)) + 9 * named
    if size != len(buf):
        return None
    # tiled, the only CRs left to rule out are inside names and data (find is memchr)
    if b"".join(datas).find(b"\r") >= 0 or b"".join(names).find(b"\r") >= 0:
        return None
    return events


def _data_only(buf: bytes, end: int, crlf: bool) -> list[bytes] | None:
    """The DATA of the events of ``buf[:end]`` when they are ``data: DATA`` lines only (no
    names: OpenAI chat, Gemini): ``buf`` starts with `data: ` and ``buf[:end]`` ends with
    the blank line. One ``split`` at the line ends and blank lines between them, no regex;
    each is one line when no DATA holds a CR or LF (find is memchr; ``count`` would not be)."""
    datas = (buf if end == len(buf) else buf[:end]).split(
        b"\r\n\r\ndata: " if crlf else b"\n\ndata: "
    )
    datas[0] = datas[0][6:]
    datas[-1] = datas[-1][: -4 if crlf else -2]
    joined = b"".join(datas)
    if joined.find(b"\n") >= 0 or joined.find(b"\r") >= 0:
        return None
    return datas


class SSEParser:
    """Calls ``on_event(name, data)`` per event (``name`` b"" when absent)."""

    def __init__(
        self,
        on_event: OnEvent,
        open_large: OpenLarge,
        *,
        limit: int,
        on_events: OnEvents | None = None,
        on_datas: OnDatas | None = None,
    ) -> None:
        self.on_event = on_event
        #: Receives runs of whole simple events at once (see ``_feed_normal``).
        self.on_events = on_events
        #: Receives the data of runs of events without names (``data:`` lines only);
        #: ``on_events`` gets them (with b"" names) when this is None.
        self.on_datas = on_datas
        self.open_large = open_large
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._cr = False
        self._first = True
        #: the first bytes of the stream while they may still be a split BOM
        self._bom_part = b""
        self._large: _Large | None = None

    def feed(self, data: bytes) -> None:
        # The chunk upstreams flush: exactly one whole event, `data:` (LF or CRLF line ends)
        # or `event:` then `data:` (LF), nothing pending before it. Read here without the
        # general machinery; it gives what the general path would (test_taps_sse checks).
        if self._bom_part:  # the stream began with a piece of a BOM: the rest comes first
            data = self._bom_part + data
            self._bom_part = b""
        elif not self._parts and self._large is None and not self._cr and len(data) <= self.limit:
            # Whole events with CRLF line ends, many at once (see _feed_normal), read
            # before the line ends are rewritten to LF (a copy of every byte).
            if (
                data[-4:] == b"\r\n\r\n"
                and self.on_events is not None
                and data[:3] != _BOM  # a BOM is skipped only by the general path
            ):
                if data.startswith(b"data: "):  # no names (Gemini): split, no regex
                    datas = _data_only(data, len(data), True)
                    if datas is not None:
                        self._first = False
                        self._emit_datas(datas)
                        return
                else:
                    events = _simple_events_crlf(data)
                    if events is not None:
                        self._first = False
                        self.on_events(events)
                        return
            if data[-2:] == b"\n\n" and b"\r" not in data:
                end = len(data) - 2
                nl = data.find(b"\n")
                if nl == end:
                    if data[:5] == b"data:":
                        self._first = False
                        self.on_event(b"", data[6 if data[5:6] == b" " else 5 : end])
                        return
                elif (
                    data[:6] == b"event:"
                    and data.startswith(b"data:", nl + 1)
                    and data.find(b"\n", nl + 1) == end
                ):
                    self._first = False
                    at = nl + (7 if data[nl + 6 : nl + 7] == b" " else 6)
                    self.on_event(data[7 if data[6:7] == b" " else 6 : nl], data[at:end])
                    return
            elif (
                data[-4:] == b"\r\n\r\n"
                and data[:5] == b"data:"
                and data.find(b"\r") == len(data) - 4
                and data.find(b"\n") == len(data) - 3
            ):
                self._first = False
                self.on_event(b"", data[6 if data[5:6] == b" " else 5 : -4])
                return
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            if data[-1:] == b"\r":  # maybe the first half of a CRLF
                self._cr = True
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._first and data:
            if len(data) < 3 and _BOM.startswith(data):  # a BOM split across chunks
                self._bom_part = data
                return
            if data.startswith(_BOM):
                data = data[3:]
            self._first = False
        while data:
            data = self._feed_large(data) if self._large is not None else self._feed_normal(data)

    def close(self, *, complete: bool) -> None:
        """End of the stream. ``complete`` (a normal end) dispatches an event
        that lacks its final blank line; after a cut it is dropped."""
        if self._bom_part:  # the stream held nothing but those bytes
            part, self._bom_part = self._bom_part, b""
            self._first = False
            self.feed(part)
        if self._cr:
            self._cr = False
            self.feed(b"\n")
        large = self._large
        if large is not None:
            self._large = None
            if large.sink is not None:
                large.sink.close(large.name, complete)
            return
        if self._parts and complete:
            block = b"".join(self._parts).rstrip(b"\n")  # parts never start with LF
            if len(block) > self.limit:
                self._large_block(block)
            elif block:
                self._dispatch(block)
        self._parts = []
        self._size = 0

    # -- normal mode ---------------------------------------------------------
    # An event is "large" when its block (its lines, without the blank lines
    # before it, which are no-ops, and without the blank line that ends it)
    # exceeds ``limit``, however the bytes were chunked: a pending block is
    # switched to streaming once it holds more than ``limit + 1`` bytes (the
    # block plus at most the first LF of its end).

    def _feed_normal(self, data: bytes) -> bytes:
        parts = self._parts
        if parts:
            if b"\n\n" not in data and not (data[:1] == b"\n" and parts[-1][-1:] == b"\n"):
                parts.append(data)
                self._size += len(data)
                if self._size > self.limit + 1:
                    return self._go_large()
                return b""
            buf = b"".join(parts) + data
            parts.clear()
            self._size = 0
        else:
            buf = data
        # Many whole events of the usual shapes (what a held batch of chunks is): one
        # regex match checks them all and one findall reads their names and data.
        if self.on_events is not None:
            end = buf.rfind(b"\n\n") + 2
            if 2 < end <= self.limit:
                if buf.startswith(b"data: "):  # no names (OpenAI chat): split, no regex
                    datas = _data_only(buf, end, False)
                    if datas is not None:
                        self._emit_datas(datas)
                        buf = buf[end:]
                else:
                    events = _simple_events(buf, end)
                    if events is not None:
                        self.on_events(events)
                        buf = buf[end:]
        # Events end at a blank line: split finds them all in one C call (pending parts
        # never hold a whole "\n\n", so nothing is found twice). An empty block is the
        # no-op between blank lines; a block may start with LF (a blank line before it).
        blocks = buf.split(b"\n\n")
        rest = blocks.pop()  # after the last blank line: the start of the next event
        on_event = self.on_event
        limit = self.limit
        for block in blocks:
            if not block:
                continue
            if len(block) > limit:
                block = block.lstrip(b"\n")
                if len(block) > limit:
                    self._large_block(block)
                else:
                    self._dispatch(block)
            # Inline fast paths: one `data:` line (OpenAI chat, Gemini), or
            # `event:` then `data:` (Anthropic, Responses); else _dispatch.
            elif block[:5] == b"data:":
                if b"\n" in block:
                    self._dispatch(block)
                else:
                    on_event(b"", block[6 if block[5:6] == b" " else 5 :])
            elif block[:6] == b"event:":
                nl = block.find(b"\n")
                if nl > 0 and block.startswith(b"data:", nl + 1) and block.find(b"\n", nl + 1) < 0:
                    at = nl + (7 if block[nl + 6 : nl + 7] == b" " else 6)
                    on_event(block[7 if block[6:7] == b" " else 6 : nl], block[at:])
                else:
                    self._dispatch(block)
            else:
                self._dispatch(block)
        if rest:
            if rest[:1] == b"\n":
                rest = rest.lstrip(b"\n")
            if rest:
                parts.append(rest)
                self._size = len(rest)
                if self._size > limit + 1:
                    return self._go_large()
        return b""

    def _emit_datas(self, datas: list[bytes]) -> None:
        if self.on_datas is not None:
            self.on_datas(datas)
        elif self.on_events is not None:
            self.on_events(list(zip(repeat(b""), datas)))

    def _large_block(self, block: bytes) -> None:
        """A complete event larger than the limit (``block`` does not start
        with LF): stream it like a pending one."""
        self._large = _Large()
        self._feed_large(block + b"\n\n")

    def _dispatch(self, block: bytes) -> None:
        """The general case: any number of lines, comments, fields."""
        name = b""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if not line or line[:1] == b":":
                continue
            field, colon, value = line.partition(b":")
            if colon:
                value = _strip1(value)
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value
        if data:
            self.on_event(name, data[0] if len(data) == 1 else b"\n".join(data))

    # -- large-event mode ----------------------------------------------------
    def _go_large(self) -> bytes:
        """Switch to streaming the pending event; returns its bytes to re-read."""
        pending = b"".join(self._parts)
        self._parts = []
        self._size = 0
        self._large = _Large()
        return pending

    def _feed_large(self, data: bytes) -> bytes:
        """Streams ``data`` of a large event; returns what follows its end."""
        large = self._large
        assert large is not None
        i, n = 0, len(data)
        while i < n:
            state = large.state
            if state == _AT_START:
                if data[i] == 0x0A:  # blank line: the event ends
                    self._large = None
                    if large.sink is not None:
                        large.sink.close(large.name, True)
                    return data[i + 1 :]
                large.state = _FIELD
                large.field.clear()
            elif state == _FIELD:
                colon = data.find(b":", i)
                nl = data.find(b"\n", i)
                j = colon if colon >= 0 and (nl < 0 or colon < nl) else nl
                if j < 0:
                    large.field += data[i:]
                    if len(large.field) > _MAX_FIELD:
                        large.state = _SKIP
                    return b""
                large.field += data[i:j]
                field = bytes(large.field)
                i = j + 1
                if data[j] == 0x3A:  # `field:`
                    if field == b"data":
                        self._data_line(large)
                        large.state = _DATA_SPACE
                    elif field == b"event":
                        large.field.clear()
                        large.state = _EVENT
                    else:
                        large.state = _SKIP
                else:  # a line without a colon: the whole line names the field
                    if field == b"data":
                        self._data_line(large)
                    elif field == b"event":
                        large.name = b""
                    large.state = _AT_START
            elif state == _DATA_SPACE:
                if data[i] == 0x20:
                    i += 1
                large.state = _DATA
            elif state == _DATA:
                nl = data.find(b"\n", i)
                end = n if nl < 0 else nl
                if end > i and large.sink is not None:
                    large.sink.feed(data[i:end])
                if nl < 0:
                    return b""
                large.state = _AT_START
                i = nl + 1
            elif state == _EVENT:
                nl = data.find(b"\n", i)
                end = n if nl < 0 else nl
                if len(large.field) < _MAX_NAME:
                    large.field += data[i:end][: _MAX_NAME - len(large.field)]
                if nl < 0:
                    return b""
                large.name = _strip1(bytes(large.field))
                large.state = _AT_START
                i = nl + 1
            else:  # _SKIP: the rest of an ignored line
                nl = data.find(b"\n", i)
                if nl < 0:
                    return b""
                large.state = _AT_START
                i = nl + 1
        return b""

    def _data_line(self, large: _Large) -> None:
        if large.sink is None:
            large.sink = self.open_large(large.name)
        elif large.data_started:
            large.sink.feed(b"\n")
        large.data_started = True

"""Streamed usage the client did not ask for: asked upstream, hidden from the client.

OpenAI Chat Completions reports a stream's usage only when the request sets
``stream_options.include_usage``, which the client controls: without it, every
streamed chat call would be estimated. So the gateway sets it upstream
(:func:`asking_for_usage`) and hands the client the stream it would have had
without it (:class:`HiddenUsage`): with ``include_usage`` OpenAI adds one chunk
before ``[DONE]`` whose ``choices`` is empty and whose ``usage`` is set, and a
``"usage": null`` member to every other chunk; the first is dropped, the second
removed from the chunk's JSON text, every other byte passes as it came. The tap reads
the upstream's stream, usage included.

Why this way: a client that did not ask for usage may index ``choices[0]`` of every
chunk (an empty ``choices`` would break it) or compare what it receives; estimating
instead would charge every such stream up to its cap. The rewrite is structural:
an event is changed only when it is one ``data:`` line holding a JSON object whose
top-level ``usage`` is null (parsed), and the member is cut only where the rest then
parses to that same object without it (so a ``"usage": null`` a model writes in its
text, or in a nested object, is never cut); the usage chunk is read member by member
(usage given once, an object, ``choices`` empty). An event that is not
that shape passes unchanged; an unfinished event is held (up to
:data:`MAX_HELD_EVENT`, then everything passes unchanged from there on).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Final

from ingest.taps import ContentDecoder, ContentDecodingError, json_loads

#: the longest event held while waiting for its end; past it the rest passes as it comes
MAX_HELD_EVENT: Final = 1 << 20

_scan_value: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # typeshed omits the C scanner's scan_once
_scan_string: Any = json.decoder.scanstring  # type: ignore[attr-defined]  # typeshed omits json.decoder.scanstring
_NULL_USAGE = re.compile(r'"usage"[ \t\n\r]*:[ \t\n\r]*null')
#: an event ends at a blank line: two line ends (CRLF, LF or CR) in a row
_EVENT_END = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r(?=[^\n]))")


def asking_for_usage(body: bytes, request: Any) -> bytes | None:
    """``body`` with ``stream_options.include_usage`` set (``request`` is its parsed
    object), or None when it cannot be set without guessing. A body without
    ``stream_options`` keeps its bytes, the member added before its closing brace;
    otherwise the object is written again with the option set."""
    if not isinstance(request, dict):
        return None
    options = request.get("stream_options")
    if options is None and "stream_options" not in request:
        end = body.rstrip().rfind(b"}")
        if end <= 0 or not body[:end].strip().rstrip(b"{").strip():
            return None  # an empty object would not be streamed: nothing to add to
        return body[:end] + b',"stream_options":{"include_usage":true}' + body[end:]
    if options is not None and not isinstance(options, dict):
        return None  # the provider refuses it: the client's error, not ours to mend
    rewritten = {**request, "stream_options": {**(options or {}), "include_usage": True}}
    return json.dumps(rewritten, ensure_ascii=False, separators=(",", ":")).encode()


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON whitespace."""
    if i < len(text) and text[i] not in " \t\n\r":
        return i  # compact JSON: no call
    match = _WHITESPACE.match(text, i)
    return i if match is None else match.end()


def _members(text: str) -> list[tuple[str, int, int, Any]] | None:
    """The members of the JSON object ``text`` (name, start, end, value), or None when
    ``text`` is not exactly one object."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        return None
    i = _skip(text, i + 1)
    members: list[tuple[str, int, int, Any]] = []
    if text[i : i + 1] == "}":
        end = i + 1
    else:
        while True:
            start = i
            if text[i : i + 1] != '"':
                return None
            name, i = _scan_string(text, i + 1)
            i = _skip(text, i)
            if text[i : i + 1] != ":":
                return None
            i = _skip(text, i + 1)
            value, i = _scan_value(text, i)
            members.append((name, start, i, value))
            i = _skip(text, i)
            if text[i : i + 1] == ",":
                i = _skip(text, i + 1)
                continue
            if text[i : i + 1] != "}":
                return None
            end = i + 1
            break
    if text[end:].strip(" \t\n\r"):
        return None
    return members


def hidden_usage(payload: bytes) -> bytes | None:
    """What the client gets of one chunk's JSON: None to drop it (the usage chunk),
    else the chunk without its ``"usage": null`` member (unchanged when it has none)."""
    try:
        obj = json_loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return payload
    if type(obj) is not dict or "usage" not in obj:
        return payload
    if obj["usage"] is not None:
        return _usage_chunk(payload)
    try:
        return _without_null_usage(payload.decode(), obj)
    except UnicodeDecodeError:  # json_loads read it: cannot happen, never mind
        return payload


def _usage_chunk(payload: bytes) -> bytes | None:
    """None for the usage chunk (``choices`` empty, null or absent; usage given once, an
    object), else the payload (once a stream: read member by member)."""
    try:
        members = _members(payload.decode())
    except (ValueError, RecursionError, StopIteration):
        return payload
    if members is None:
        return payload
    usage = [m[3] for m in members if m[0] == "usage"]
    choices = [m[3] for m in members if m[0] == "choices"]
    if len(usage) == 1 and isinstance(usage[0], dict) and all(not c for c in choices):
        return None
    return payload


def _without_null_usage(text: str, obj: dict[str, Any]) -> bytes:
    """``text`` without its top-level ``"usage": null`` member. Each place the name
    appears is cut out with its comma, and the cut kept only when the rest parses to the
    object without that member: text inside a string or a nested object, or the name
    given twice, never matches, so what a model writes is never cut."""
    expected = {k: v for k, v in obj.items() if k != "usage"}
    at = text.find('"usage"')
    while at >= 0:
        member = _NULL_USAGE.match(text, at)
        if member is not None:
            after = _skip(text, member.end())
            candidate = None
            if text[after : after + 1] == ",":  # up to the next member
                candidate = text[:at] + text[_skip(text, after + 1) :]
            elif text[after : after + 1] == "}":  # the last: from the comma before it
                before = text[:at].rstrip(" \t\n\r")
                if before.endswith(","):
                    candidate = before[:-1].rstrip(" \t\n\r") + text[member.end() :]
                elif before.endswith("{"):
                    candidate = text[:at] + text[member.end() :]
            if candidate is not None:
                encoded = candidate.encode()
                try:
                    if json_loads(encoded) == expected:
                        return encoded
                except (ValueError, RecursionError):
                    pass
        at = text.find('"usage"', at + 1)
    return text.encode()


def _event(event: bytes) -> bytes:
    """One whole event (its blank line included) as the client gets it."""
    body = event.rstrip(b"\r\n")
    if not body.startswith(b"data:") or b"\n" in body or b"\r" in body:
        return event  # comments, named events, several lines: not a chunk we added to
    lead = 6 if body[5:6] == b" " else 5
    payload = body[lead:]
    shown = hidden_usage(payload)
    if shown is None:
        return b""
    if shown is payload:
        return event
    return body[:lead] + shown + event[len(body) :]


class HiddenUsage:
    """The client's copy of a stream for which the gateway asked usage upstream.

    ``feed`` takes the upstream's chunks and returns the bytes to write (possibly
    none yet: an event is held until its end). ``encoding`` is the response's
    Content-Encoding: asked for identity, an upstream that encodes anyway is decoded
    for the client (``decoded``: drop Content-Encoding and Content-Length)."""

    def __init__(self, encoding: str | None) -> None:
        self._held = bytearray()
        self._out = bytearray()
        self._passing = False
        self._decoder: ContentDecoder | None = None
        self.decoded = False
        try:
            decoder = ContentDecoder(encoding, self._push)
        except ContentDecodingError:
            self._passing = True  # unknown encoding: nothing can be read, pass it on
            return
        if not decoder.identity:
            self._decoder = decoder
            self.decoded = True

    def feed(self, chunk: bytes) -> bytes:
        if self._passing:
            return chunk
        if self._decoder is not None:
            try:
                self._decoder.feed(chunk)
            except ContentDecodingError:
                self._passing = True  # corrupt: what was decoded goes, the rest cannot
                return self._take()
        else:
            self._push(chunk)
        return self._take()

    def finish(self) -> bytes:
        """What is left at the end: an unfinished event, as it came."""
        if self._decoder is not None and not self._passing:
            with contextlib.suppress(ContentDecodingError):  # a cut body: what it gave is out
                self._decoder.close()
        self._out += self._held
        self._held.clear()
        return self._take()

    def _take(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def _push(self, data: bytes) -> None:
        if self._passing:
            self._out += data
            return
        held = self._held
        held += data
        start = 0
        for end in _EVENT_END.finditer(held):
            self._out += _event(bytes(held[start : end.end()]))
            start = end.end()
        del held[:start]
        if len(held) > MAX_HELD_EVENT:
            self._passing = True
            self._out += held
            held.clear()

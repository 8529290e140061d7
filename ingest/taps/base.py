"""What the stages of a tap share: memory limits, the handler interface, helpers.

A tap (tap.py) is a pipeline of three stages, each bounded in memory:

    raw bytes --decode.py--> decoded pieces --framing--> events --handler--> state
                 (gzip, br..)                 (sse.py, eventstream.py,        (one per
                                               jsonscan.py for bodies)         provider)

and ``Tap.finish`` turns the handler's state into one ``TapResult`` (usage.py):
reported usage, or an estimate from estimate.py with the reason.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, final

import msgspec

from schemas.billed_units import valid_service_tier, valid_unit_name

from .estimate import EstimatorConfig, Observed
from .fastjson import SHALLOW_SIZE, loads, shallow
from .repeats import TooManyReadings, has_repeats, loads_keeping_repeats, readings
from .request import RequestInfo
from .shapes import LARGE
from .usage import InvalidUsage, TapResult, Usage, usage_max

Cut = Literal["client_disconnected", "upstream_cut"]
CUTS: frozenset[str] = frozenset({"client_disconnected", "upstream_cut"})

#: Bytes of one SSE event, non-streamed body or realtime message parsed whole;
#: anything larger is scanned incrementally for the paths that carry usage.
WHOLE_PARSE_LIMIT = 256 * 1024
#: Bytes of fed chunks held before they are read together (tap.py, ``Tap.feed``).
HOLD_LIMIT = 16 * 1024
#: Chunks held at most (a chunk of a few bytes costs ~40 bytes of bookkeeping).
HOLD_CHUNKS = 256
#: Bytes of one captured JSON value (a usage object, a model name...).
CAPTURE_LIMIT = 64 * 1024
#: Bytes of one AWS event-stream frame (real Converse frames are < 1 KiB).
FRAME_LIMIT = 512 * 1024
#: Bytes of decoded output produced per decompression step.
DECODE_PIECE = 64 * 1024
#: Problems kept per response (the first one is the estimate's reason).
MAX_PROBLEMS = 8
#: Formats streamed as AWS event-stream messages (the others stream SSE).
EVENT_STREAM_FORMATS: frozenset[str] = frozenset({"bedrock-converse", "bedrock-invoke"})

Path = tuple[str, ...]


@final
class Shortcuts:
    """Whether the hot path's shortcuts are taken (always, but in the tests that compare
    them with the general path: test_taps_fastpaths). Off, a tap reads each chunk as it
    comes (nothing held), the SSE parser and the event-stream decoder hand events over one
    by one, and no event is decoded into a narrow shape. A flag read at run time, as the
    compiled modules bind their own functions early (monkeypatching them would not reach
    the calls between them)."""

    def __init__(self) -> None:
        self.enabled = True


SHORTCUTS: Final = Shortcuts()


def describe_error(obj: Any) -> str | None:
    """A one-line description of an error object of any provider, or None."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, str) and err:
        return clip(err)
    if isinstance(err, dict):
        kind = err.get("type") or err.get("status") or err.get("code")
        message = err.get("message")
        parts = [str(p) for p in (kind, message) if isinstance(p, (str, int)) and p != ""]
        return clip(": ".join(parts)) if parts else "error"
    if obj.get("type") == "error" or "message" in obj or "Message" in obj:
        message = obj.get("message", obj.get("Message"))
        if isinstance(message, str):
            return clip(message)
    return None


def clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def text_len(value: Any) -> int:
    """Characters of a text delta (0 when the field is not a string)."""
    return len(value) if isinstance(value, str) else 0


#: the end of an object key written with a \\u escape (a key that reads as a name the
#: tap looks for but whose bytes are not that name in quotes): a ``\\uXXXX`` escape, the
#: rest of the string without another escape, the closing quote, then the colon
_ESCAPED_KEY: Final = re.compile(rb'\\u[0-9a-fA-F]{4}[^"\\]*"[ \t\r\n]*:')


def may_repeat(data: bytes | bytearray, keys: tuple[bytes, ...]) -> bool:
    """Whether an object of the JSON document ``data`` could give one of ``keys`` (each a
    name in quotes, as it is written) twice: one of them occurs twice in the bytes, or
    some object key is written with a ``\\u`` escape. Never False for a document that
    repeats one of them (such a key's bytes are its name in quotes, unless escaped);
    text that merely mentions them costs only the structural read that decides
    (``Handler.each_reading``, repeats.py). Not a reading of the document: a test of
    whether its structure must be read key by key."""
    for key in keys:
        if data.count(key) > 1:
            return True
    return b"\\u" in data and _ESCAPED_KEY.search(data) is not None


def shape_decoder(shape: type[msgspec.Struct]) -> Callable[[bytes | str], Any]:
    """A decoder of ``shape`` (shapes.py), for :func:`read_shape`."""
    return msgspec.json.Decoder(shape).decode


def read_shape(decode: Callable[[bytes | str], Any], data: bytes) -> Any:
    """The event as ``shape`` (only its fields are built; the rest is skipped), or None.

    For the common event of a stream, instead of a dict of every field. It is used only
    where json would accept the whole document: valid UTF-8 (msgspec does not check the
    UTF-8 of strings it skips, so text that is not ASCII is decoded strictly first, as
    json does) and not deeper than 512 levels. Anything else, or an event that does not
    fit the shape (a missing field, another type), gives None: the caller reads it with
    :func:`loads`, so what the event means never depends on this shortcut.
    """
    if shallow(data) and SHORTCUTS.enabled:
        try:
            return decode(data if data.isascii() else data.decode("utf-8"))
        except Exception:  # not this shape, not UTF-8 or not JSON: the general path decides
            return None
    return None


def read_shaped_run(
    decode: Callable[[bytes], Any],
    payloads: list[bytes],
    on_shaped: Callable[[list[Any], list[bytes]], None],
    on_other: Callable[[bytes], None],
) -> None:
    """:func:`read_shape` over many payloads of one kind at once, in stream order.

    The payloads that fit the shape go to ``on_shaped`` together (decoded by one
    ``map`` in C, no Python per payload; with the payloads they were decoded from), so
    ``on_shaped`` must only add up what it reads: it is called for runs of them, the
    others between. Those that do not fit
    (or are not ASCII, where read_shape decodes strictly first, or could nest deeper
    than msgspec's limit) go to ``on_other`` one by one, in their place: a run that
    fails is halved until the payload that failed is found. The effect is
    :func:`read_shape` on each payload in turn (test_taps_fastpaths holds them equal).
    """
    longest = 0
    for payload in payloads:  # a native loop; one isascii over them all below
        if len(payload) > longest:
            longest = len(payload)
    if longest > SHALLOW_SIZE or not SHORTCUTS.enabled or not b"".join(payloads).isascii():
        for payload in payloads:
            on_other(payload)
        return
    _read_run(decode, payloads, on_shaped, on_other)


def _read_run(
    decode: Callable[[bytes], Any],
    payloads: list[bytes],
    on_shaped: Callable[[list[Any], list[bytes]], None],
    on_other: Callable[[bytes], None],
) -> None:
    try:
        shaped = list(map(decode, payloads))
    except Exception:  # one of them does not fit: find it, keeping the order
        if len(payloads) == 1:
            on_other(payloads[0])
            return
        half = len(payloads) // 2
        _read_run(decode, payloads[:half], on_shaped, on_other)
        _read_run(decode, payloads[half:], on_shaped, on_other)
        return
    on_shaped(shaped, payloads)


class RecentPayloads:
    """The last few ``data:`` payloads of a stream, bounded in count and bytes.

    Providers that report usage in the last chunk(s) (OpenAI chat, Gemini) need
    only those parsed: the chunks are kept raw here and parsed once at the end.
    """

    __slots__ = ("_bytes", "_items", "max_bytes", "max_items")

    def __init__(self, max_items: int = 4, max_bytes: int = 128 * 1024) -> None:
        self._items: deque[bytes] = deque()
        self._bytes = 0
        self.max_items = max_items
        self.max_bytes = max_bytes

    def push(self, data: bytes) -> list[bytes] | None:
        """Keeps ``data``; returns the payloads it pushed out (oldest first), or None: a
        caller that must see every payload of some kind reads those."""
        items = self._items
        items.append(data)
        self._bytes += len(data)
        out: list[bytes] | None = None
        while len(items) > self.max_items or (self._bytes > self.max_bytes and len(items) > 1):
            old = items.popleft()
            self._bytes -= len(old)
            if out is None:
                out = [old]
            else:
                out.append(old)
        return out

    def drain(self) -> list[bytes]:
        """The kept payloads, oldest first; empties the ring."""
        items = list(self._items)
        self._items.clear()
        self._bytes = 0
        return items


class Handler(ABC):
    """The provider-specific half of a tap: what is read where.

    The framing stage calls ``on_event`` (SSE events, bedrock frames) or
    ``on_body`` (a non-streamed body). Events and bodies larger than
    ``WHOLE_PARSE_LIMIT`` are never parsed whole: the framing stage scans them
    for ``large_event_paths``/``body_paths`` and hands over a sparse object
    holding just those paths (values above ``CAPTURE_LIMIT`` replaced by
    ``LARGE``). Handlers record what they saw; ``final_usage`` decides at the
    end whether the usage is complete.
    """

    fmt: ClassVar[str]
    #: Paths (object keys, "*" for any array element) read from large bodies.
    body_paths: ClassVar[frozenset[Path]] = frozenset()
    #: The keys (as written: the name in quotes) a document carrying usage gives at most
    #: once: its usage and the counts in it (an object on the way to the usage given
    #: twice gives the usage twice). One of them twice (or a key with a ``\\u`` escape)
    #: and the document is read for repeated keys (``each_reading``).
    repeat_keys: ClassVar[tuple[bytes, ...]] = ()

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        self.request = request
        self.config = config
        self.model: str | None = None
        #: a serving model the provider documented as relabelling the call (Anthropic's
        #: server-side fallback, for a request that allowed it): priced as served
        self.relabelled_to: str | None = None
        self.delta_events = 0
        self.text_chars = 0
        self.reasoning_chars = 0
        self.partial: Usage | None = None
        #: the field-wise maximum of every usage report read (``report``), None before one
        self.reported: Usage | None = None
        self.problems: list[str] = []
        self.upstream_error: str | None = None
        #: billed units beyond tokens the response counted, and the tier that served it
        self.units: dict[str, int] = {}
        self.service_tier: str | None = None
        #: charges billed apart from the response's own, each at its model
        self.charges: list[TapResult] = []
        #: False once the tap knows the body is one JSON document.
        self.streaming = True
        self.parse_deltas = config.delta_text == "parsed"

    # -- recording -------------------------------------------------------
    def problem(self, reason: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(reason)

    def error(self, description: str | None) -> None:
        if self.upstream_error is None and description:
            self.upstream_error = clip(description)

    def set_service_tier(self, value: Any) -> None:
        if valid_service_tier(value):
            self.service_tier = value

    def count_units(self, counts: dict[str, int]) -> None:
        """Unit counts a usage report gives: each unit is charged the most any report of
        the response gave (reports are cumulative, so that is the latest, and a report
        with a lower count lowers nothing); zero counts are left out."""
        units = self.units
        for name, n in counts.items():
            if n and n > units.get(name, 0) and valid_unit_name(name):
                units[name] = n

    def set_model(self, value: Any) -> None:
        if isinstance(value, str) and value:
            self.model = value[:200]

    def parse(self, data: bytes | bytearray) -> Any:
        value, problem = loads(data)
        if problem is not None:
            self.problem(problem)
        return value

    def parse_each(self, data: bytes | bytearray, keys: tuple[bytes, ...]) -> list[Any]:
        """``parse(data)`` as every reading of its repeated keys (``each_reading``): one
        value, but where ``may_repeat(data, keys)`` and an object of it does repeat a
        key. Unreadable: ``[None]`` (the problem recorded)."""
        value, problem = loads(data)
        if problem is not None:
            self.problem(problem)
            return [None]
        if not may_repeat(data, keys):
            return [value]
        return self.each_reading(data, value)

    def each_reading(self, data: bytes | bytearray, value: Any) -> list[Any]:
        """``value`` (``data`` parsed) read every way its repeated keys allow
        (repeats.py): ``[value]`` when no object of ``data`` repeats a key. Each reading
        is read as the document; their usage is charged field by field at its maximum.
        Too many ways is ``invalid_usage`` (the last-wins value is still read)."""
        full, problem = loads_keeping_repeats(data)
        if problem is not None:  # json read it once already: only its own limits differ
            return [value]
        return self.readings_of(full, value)

    def readings_of(self, full: Any, value: Any) -> list[Any]:
        """The readings of ``full`` (read keeping its repeats: repeats.py), or ``[value]``
        when nothing in it repeats a key."""
        try:
            if not has_repeats(full):
                return [value]
            return readings(full)
        except TooManyReadings:
            self.problem("invalid_usage: the answer repeats keys in more ways than are read")
        except RecursionError:
            self.problem("unreadable: JSON nested too deeply")
        return [value]

    def read_delta_run(
        self,
        run: list[bytes],
        decoder: Any,
        shaped: Callable[[list[Any], list[bytes]], None],
        other: Callable[[bytes], None],
    ) -> None:
        """A run of the format's common delta event: read by one map of its shape
        (``read_shaped_run``: ``shaped`` gets the fitting ones, ``other`` the rest, in
        order), or only counted by its bytes when deltas are not parsed."""
        if not self.parse_deltas:
            self.delta_events += len(run)
            self.text_chars += sum(map(len, run))
            return
        read_shaped_run(decoder, run, shaped, other)

    def report(self, raw: Any) -> Usage | None:
        """One usage report of the response, read as it comes (an invalid one is
        ``invalid_usage``). The call is charged the field-wise maximum of its reports
        (``reported``): reports are cumulative, so that is the latest, and a repeated or
        later report with lower or zero counts lowers nothing. Maxima of the normalised
        counts, not of the provider's fields (a larger ``cached_tokens`` alone would
        lower OpenAI's input)."""
        try:
            usage = self.usage_from(raw)
        except InvalidUsage as exc:
            self.problem(f"invalid_usage: {exc}")
            return None
        seen = self.reported
        self.reported = usage if seen is None else usage_max(seen, usage)
        return usage

    # -- provider hooks --------------------------------------------------
    @abstractmethod
    def usage_from(self, raw: Any) -> Usage:
        """The provider's usage object, normalised (raises InvalidUsage)."""

    def on_event(self, name: bytes, data: bytes) -> None:
        """One SSE event (``name`` is b"" when the event had no ``event:`` line)."""

    def on_events(self, events: list[tuple[bytes, bytes]]) -> None:
        """Several whole SSE events ``(name, data)`` in stream order: what ``on_event``
        is given one by one. Handlers read runs of their common event at once."""
        on_event = self.on_event
        for name, data in events:
            on_event(name, data)

    def on_datas(self, datas: list[bytes]) -> None:
        """Several whole SSE events without names, by their data: ``on_events`` of them."""
        self.on_events([(b"", data) for data in datas])

    def large_event_paths(self, name: bytes) -> frozenset[Path]:
        """Paths to read from an event too large to parse whole."""
        return frozenset()

    def on_large_event(
        self, name: bytes, obj: dict[str, Any], size: int, ended: bool, count: bool = True
    ) -> None:
        """An event too large to parse whole, as a sparse object of its paths
        (``ended`` is False when the stream stopped inside it). An event that repeats keys
        comes once per reading (repeats.py), ``count`` False after the first."""

    def on_frame(self, headers: dict[str, Any], payload: bytes) -> None:
        """One AWS event-stream message (bedrock only)."""

    def on_frames(self, frames: list[tuple[dict[str, Any], bytes]]) -> None:
        """Several AWS event-stream messages in stream order: ``on_frame`` of each."""
        on_frame = self.on_frame
        for headers, payload in frames:
            on_frame(headers, payload)

    def on_captured(self, path: Path, value: Any) -> None:
        """A value read at one of ``body_paths`` of a body too large to parse whole, as it
        is read (``on_body`` then gets the sparse body, one value per path)."""

    def on_body(self, obj: Any, size: int) -> None:
        """A whole non-streamed body (sparse when it was larger than the limit); a body
        that repeats keys comes once per reading (repeats.py)."""

    @abstractmethod
    def final_usage(self, cut: str | None) -> Usage | None:
        """The usage to charge if the response carried it completely, else None."""

    def incomplete_reason(self) -> str:
        """Why ``final_usage`` is None when nothing else went wrong."""
        return "no_usage: the response carried no usage"


def observed(
    handler: Handler, *, streaming: bool, body_bytes: int, output_unknown: bool
) -> Observed:
    return Observed(
        streaming=streaming,
        delta_events=handler.delta_events,
        text_chars=handler.text_chars,
        reasoning_chars=handler.reasoning_chars,
        body_bytes=body_bytes,
        output_unknown=output_unknown,
        partial=handler.partial,
        partial_floor=any(p.startswith("invalid_usage") for p in handler.problems),
    )


__all__ = [
    "CAPTURE_LIMIT",
    "CUTS",
    "DECODE_PIECE",
    "EVENT_STREAM_FORMATS",
    "FRAME_LIMIT",
    "HOLD_CHUNKS",
    "HOLD_LIMIT",
    "LARGE",
    "SHORTCUTS",
    "WHOLE_PARSE_LIMIT",
    "Cut",
    "Handler",
    "Path",
    "clip",
    "describe_error",
    "may_repeat",
    "observed",
    "read_shape",
    "read_shaped_run",
    "shape_decoder",
    "text_len",
]

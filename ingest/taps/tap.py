"""The tap: decode -> frame -> handler, and the end of a response.

``Tap.feed`` and ``Tap.finish`` never raise: anything unexpected ends reading
(the bytes keep being counted) and the response is charged an estimate that
names the reason. The proxy's response path never depends on a tap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

from .base import (
    CUTS,
    EVENT_STREAM_FORMATS,
    HOLD_CHUNKS,
    HOLD_LIMIT,
    SHORTCUTS,
    WHOLE_PARSE_LIMIT,
    Handler,
    Path,
    clip,
    may_repeat,
    observed,
)
from .decode import ContentDecoder, ContentDecodingError
from .estimate import EstimatorConfig, Observed, estimate_usage
from .eventstream import EventStreamDecoder, EventStreamError
from .jsonscan import JsonBody, JsonPathScanner
from .request import RequestInfo
from .sse import SSEParser
from .usage import TapResult, Usage, priced_model

Mode = Literal["sse", "eventstream", "json", "auto"]

_EVENT_STREAM_TYPES = ("application/vnd.amazon.eventstream",)
#: tiers priced below the standard rate, which a provider applies only to a request that
#: asks for them (OpenAI's flex, a batch): an answer naming one otherwise pays standard
DISCOUNTED_TIERS: frozenset[str] = frozenset({"flex", "batch"})


class _ScanSink:
    """Receives the data of an SSE event too large to parse whole."""

    def __init__(self, handler: Handler, paths: frozenset[Path]) -> None:
        self.handler = handler
        self.size = 0
        self.scanner = JsonPathScanner(paths) if paths else None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self.scanner is not None:
            self.scanner.feed(data)

    def close(self, name: bytes, ended: bool) -> None:
        obj: dict[str, Any] = {}
        handler = self.handler
        if self.scanner is not None:
            error = self.scanner.finish()
            if error is None:
                sparse = self.scanner.sparse()
                obj = sparse if isinstance(sparse, dict) else {}
            elif ended:
                handler.problem(f"unreadable: {error} in a large event")
        # the scanner keeps every value of a repeated path: one event per reading
        first = True
        for reading in handler.readings_of(obj, obj):
            handler.on_large_event(name, reading, self.size, ended, first)
            first = False


class Tap:
    """Reads the usage of one upstream response as its bytes stream by.

    Use :func:`open_tap` to make one. ``feed`` every chunk the client is sent
    (the chunk is not modified or kept), then ``finish`` once.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        mode: Mode,
        request: RequestInfo,
        config: EstimatorConfig,
        content_encoding: str | None,
        status: int | None,
        model_hint: str | None,
        limit: int = WHOLE_PARSE_LIMIT,
    ) -> None:
        self.handler = handler
        self.request = request
        self.config = config
        self.status = status
        self.model_hint = model_hint
        self.limit = limit
        self.raw_bytes = 0
        #: Chunks fed but not read yet (see ``feed``): under ``HOLD_LIMIT`` bytes
        #: and ``HOLD_CHUNKS`` chunks (so tiny chunks cost little memory each).
        self._held: list[bytes] = []
        self._held_bytes = 0
        shortcuts = SHORTCUTS.enabled
        self._hold_limit = HOLD_LIMIT if shortcuts else 1
        self._hold_chunks = HOLD_CHUNKS if shortcuts else 1
        self._decoded = 0
        self._direct_from: int | None = None
        self._mode: Mode = mode
        self._sniff = b""
        self._fatal: str | None = None
        self._result: TapResult | None = None
        self._sse: SSEParser | None = None
        self._frames: EventStreamDecoder | None = None
        self._body: JsonBody | None = None
        self._decoder: ContentDecoder | None = None
        self._frame: Callable[[bytes], None] = self._sniffing
        # Where raw chunks go: the decoder, or straight to the framing.
        self._push: Callable[[bytes], None] = self._on_decoded
        try:
            if content_encoding and not content_encoding.isspace():
                self._decoder = ContentDecoder(content_encoding, self._on_decoded)
                if not self._decoder.identity:
                    self._push = self._decoder.feed
            if mode != "auto":
                self._start(mode)
        except ContentDecodingError as exc:
            self._fatal = f"unreadable: {exc}"
        except Exception as exc:  # pragma: no cover - defensive
            self._fatal = _internal(exc)

    # -- public --------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def decoded_bytes(self) -> int:
        """Bytes of the body after content decoding."""
        if self._direct_from is None:
            return self._decoded
        return self._decoded + self.raw_bytes - self._direct_from

    def feed(self, chunk: Any) -> None:  # Any: a wrong type is caught below, not raised
        """One chunk of the response body as received. Never raises.

        Chunks are held (a copy when not ``bytes``, so the proxy may reuse its
        buffer) until ``HOLD_LIMIT`` bytes or ``HOLD_CHUNKS`` chunks are in, then
        read together: a proxy hands over one small event per chunk, and reading
        many at once in one hot loop costs a fraction of waking the decoder,
        framing and handler per chunk, whose code and state are cold again by then
        (other streams ran in between).
        Nothing is decided before ``finish``, which reads what is still held.
        """
        try:
            self.raw_bytes += len(chunk)
            held = self._held
            if type(chunk) is not bytes:  # the proxy may reuse its buffer
                chunk = bytes(chunk)
            held.append(chunk)
            self._held_bytes += len(chunk)
            if self._held_bytes < self._hold_limit and len(held) < self._hold_chunks:
                return
        except Exception as exc:  # pragma: no cover - only a chunk of a wrong type
            self._fatal = self._fatal or _internal(exc)
            return
        self._release()

    def _release(self) -> None:
        """Reads what is held."""
        held = self._held
        if held:
            data = held[0] if len(held) == 1 else b"".join(held)
            held.clear()
            self._held_bytes = 0
            self._read(data)

    def _read(self, data: bytes) -> None:
        """Decoding, framing and handler over ``data``. Never raises."""
        try:
            if self._fatal is None and self._result is None:
                self._push(data)
        except (ContentDecodingError, EventStreamError) as exc:
            self._fatal = f"unreadable: {exc}"
        except Exception as exc:
            self._fatal = _internal(exc)

    def finish(self, *, cut: Any = None) -> TapResult:
        """The response ended: normally (``cut=None``), or ``client_disconnected``
        / ``upstream_cut``. Returns the same result when called again."""
        if self._result is not None:
            return self._result
        try:
            if cut is not None and cut not in CUTS:
                cut = clip(str(cut), 60)
            self._close(cut)
            result = self._resolve(cut)
        except Exception as exc:
            result = self._fallback(_internal(exc))
        self._result = result
        return result

    # -- pipeline ------------------------------------------------------------
    def _start(self, mode: Mode) -> None:
        self._mode = mode
        handler = self.handler
        if mode == "sse":
            self._sse = SSEParser(
                handler.on_event,
                self._open_large,
                limit=self.limit,
                on_events=handler.on_events if SHORTCUTS.enabled else None,
                on_datas=handler.on_datas if SHORTCUTS.enabled else None,
            )
            self._frame = self._sse.feed
        elif mode == "eventstream":
            self._frames = EventStreamDecoder(
                handler.on_frame,
                on_messages=handler.on_frames if SHORTCUTS.enabled else None,
            )
            self._frame = self._frames.feed
        else:
            self._body = JsonBody(
                handler.body_paths, limit=self.limit, on_capture=handler.on_captured
            )
            self._frame = self._body.feed
        handler.streaming = mode != "json"
        if self._push == self._on_decoded:  # no content-encoding: skip a hop
            self._direct_from = self.raw_bytes
            self._push = self._frame

    def _open_large(self, name: bytes) -> _ScanSink:
        return _ScanSink(self.handler, self.handler.large_event_paths(name))

    def _on_decoded(self, piece: bytes) -> None:
        self._decoded += len(piece)
        self._frame(piece)

    def _sniffing(self, piece: bytes) -> None:
        """Auto mode: wait for the first non-blank byte, then pick the framing."""
        piece = self._sniff + piece
        head = piece.lstrip()
        if not head:
            self._sniff = piece[-64:]
            return
        self._sniff = b""
        self._start(self._auto_mode(head[:1]))
        self._frame(piece)

    def _auto_mode(self, first: bytes) -> Mode:
        if first in (b"{", b"["):
            return "json"
        return "eventstream" if self.handler.fmt in EVENT_STREAM_FORMATS else "sse"

    def _close(self, cut: str | None) -> None:
        self._release()
        if self._fatal is not None:
            return
        handler = self.handler
        try:
            if self._decoder is not None:
                self._decoder.close()
        except ContentDecodingError as exc:
            self._fatal = f"unreadable: {exc}"
            return
        if self._sse is not None:
            self._sse.close(complete=cut is None)
        elif self._frames is not None:
            if self._frames.pending and cut is None:
                handler.problem("unreadable: the event stream ends inside a message")
        elif self._body is not None:
            body = self._body
            obj, problem = body.close()
            if obj is not None:
                whole = body.whole
                body.whole = None
                if whole is None:  # scanned: repeated paths kept (jsonscan.py)
                    found = handler.readings_of(obj, obj)
                elif may_repeat(whole, handler.repeat_keys):
                    found = handler.each_reading(whole, obj)
                else:
                    found = [obj]
                for reading in found:  # a body that repeats keys: each reading
                    handler.on_body(reading, body.size)
            elif cut is None and self.decoded_bytes:
                handler.problem(problem or "unreadable: body")
            handler.streaming = False
        else:  # auto mode saw nothing but whitespace
            handler.streaming = bool(self.request.stream)

    def _model(self) -> str | None:
        return self._priced()[0]

    def _priced(self) -> tuple[str | None, str | None]:
        """(the model the call is priced at, why the response's model was not taken). The
        model requested is the URL's (the hint: Gemini, Bedrock serve the URL's model
        whatever the body says) else the body's, as the proxy admitted it."""
        return priced_model(
            self.model_hint or self.request.model, self.handler.model, self.handler.relabelled_to
        )

    def _tier(self) -> str | None:
        """The tier charged: the answer's, unless it names a discount (flex, batch) the
        request did not ask for; then none, the standard rate (an answer cannot halve its
        own price)."""
        served = self.handler.service_tier
        if served is None or served not in DISCOUNTED_TIERS or served == self.request.service_tier:
            return served
        return None

    def _resolve(self, cut: str | None) -> TapResult:
        handler = self.handler
        if self.status is not None and not 200 <= self.status <= 299:
            usage = handler.final_usage(None) if self._fatal is None else None
            model, note = self._priced()  # once the handler has read all it will
            error = f"HTTP {self.status}"
            if handler.upstream_error:
                error = f"{error}: {handler.upstream_error}"
            if usage is not None and not handler.problems:
                return TapResult.from_usage(
                    model,
                    usage,
                    "reported",
                    upstream_error=error,
                    units=handler.units,
                    service_tier=self._tier(),
                    separate_charges=tuple(handler.charges),
                    model_note=note,
                )
            return TapResult(model, usage_source="none", upstream_error=error, model_note=note)
        usage = handler.final_usage(cut)
        model, note = self._priced()
        if usage is not None and not handler.problems and self._fatal is None:
            return TapResult.from_usage(
                model,
                usage,
                "reported",
                upstream_error=handler.upstream_error,
                units=handler.units,
                service_tier=self._tier(),
                separate_charges=tuple(handler.charges),
                model_note=note,
            )
        if usage is not None:  # complete, but something was unreadable: a floor
            handler.partial = usage
        reason = (
            self._fatal
            or (handler.problems[0] if handler.problems else None)
            or (f"upstream_error: {handler.upstream_error}" if handler.upstream_error else None)
            or cut
            or ("no_usage: the response body is empty" if not self.decoded_bytes else None)
            or handler.incomplete_reason()
        )
        seen = observed(
            handler,
            streaming=handler.streaming,
            body_bytes=self.decoded_bytes,
            output_unknown=self._fatal is not None,
        )
        estimate = estimate_usage(self.request, seen, self.config)
        return TapResult.from_usage(
            model,
            estimate,
            "estimated",
            reason=reason,
            upstream_error=handler.upstream_error,
            units=handler.units,
            service_tier=self._tier(),
            separate_charges=tuple(handler.charges),
            model_note=note,
        )

    def _fallback(self, reason: str) -> TapResult:
        """The result when the tap itself failed: the pessimistic bound."""
        try:
            estimate = estimate_usage(
                self.request, Observed(streaming=True, output_unknown=True), self.config
            )
        except Exception:
            estimate = Usage(self.config.server_state_input_floor, 0, 0, 0, self.config.output_cap)
        model = None
        with contextlib.suppress(Exception):
            model = self._model()
        return TapResult.from_usage(model, estimate, "estimated", reason=reason)


def _internal(exc: BaseException) -> str:
    return f"unreadable: tap internal error ({type(exc).__name__})"


def resolve_mode(
    fmt: str,
    *,
    streaming: bool | None,
    content_type: str | None,
    request_stream: bool | None,
    status: int | None,
) -> Mode:
    """Which framing a response needs (``auto``: sniff the first bytes)."""
    streamed: Mode = "eventstream" if fmt in EVENT_STREAM_FORMATS else "sse"
    if status is not None and not 200 <= status <= 299:
        return "json"  # error bodies are JSON documents
    if streaming is not None:
        return streamed if streaming else "json"
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "text/event-stream" or kind in _EVENT_STREAM_TYPES:
        return "eventstream" if kind in _EVENT_STREAM_TYPES else "sse"
    if kind.endswith("json"):
        return "json"
    if request_stream is not None:
        return streamed if request_stream else "json"
    return "auto"

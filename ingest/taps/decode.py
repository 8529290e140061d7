"""Incremental Content-Encoding decoding, for reading only.

The bytes the client receives are never touched: a tap decodes a copy of each
chunk to read usage from it. Output is pushed to a sink in pieces of at most
``DECODE_PIECE`` bytes (brotli may overshoot by one internal buffer), so a
decompression bomb costs no memory; and decoding stops with a
:class:`ContentDecodingError` once a body's decoded bytes pass ``MAX_DECODED_BYTES``,
so it costs bounded CPU too (the tap then charges the response
pessimistically, as for any unreadable body).

gzip (multi-member too) and deflate (zlib-wrapped or raw, as servers differ)
use the standard library; br needs the ``brotli`` package and zstd the
``zstandard`` package, each used when importable. The decoders' own windows
are outside the tap's buffers: 32 KiB for zlib, up to 16 MiB for brotli (set
by the stream), at most 8 MiB for zstd (RFC 9659; a larger window is refused).
"""

from __future__ import annotations

import importlib
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

from .base import DECODE_PIECE


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - depends on the environment
        return None


_brotli: Any = _optional("brotli")
_zstandard: Any = _optional("zstandard")

Sink = Callable[[bytes], None]
#: Decoded bytes one response body may expand to before reading stops: far above any
#: real response (a whole-body JSON of several base64 images is a few MiB), far below
#: what a compression bomb expands to (gzip: ~1000x, brotli and zstd: more). Inflating
#: this much costs at most a few tenths of a second of the event loop per response.
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: Compressed bytes per zlib call (see _Zlib.feed).
_SLICE = 8 * 1024


class ContentDecodingError(Exception):
    """A body's Content-Encoding cannot be undone (corrupt data, an unsupported encoding,
    or more than ``MAX_DECODED_BYTES``). Not a ``schemas.errors.DecodeError``: that one is
    a message breaking the record contract; this is an HTTP body the tap cannot read."""


def supported_encodings() -> frozenset[str]:
    names = {"identity", "gzip", "x-gzip", "deflate"}
    if _brotli is not None:
        names.add("br")
    if _zstandard is not None:
        names.add("zstd")
    return frozenset(names)


class _Layer(ABC):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    @abstractmethod
    def feed(self, data: bytes) -> None:
        """Decode ``data`` into the sink."""

    def close(self) -> None:
        """Flush what is left (a truncated stream just ends)."""


class _Zlib(_Layer):
    """gzip (members one after another) or deflate (zlib-wrapped or raw).

    ``obj`` is None while waiting for the two bytes that start a stream: the
    gzip magic of the next member, or deflate's zlib header (when absent the
    server sent raw deflate, which many do).
    """

    def __init__(self, sink: Sink, *, gzip: bool) -> None:
        super().__init__(sink)
        self.gzip = gzip
        self.name = "gzip" if gzip else "deflate"
        self.obj: Any = None
        self.head = b""
        self.members = 0
        self.ended = False
        self.fed = 0

    def feed(self, data: bytes) -> None:
        # zlib drops the output of a call that meets corrupt data: feed it slices
        # that end on absolute multiples of _SLICE, so what is read before a
        # corruption does not depend on how the proxy chunked the body.
        while data and not self.ended:
            cut = _SLICE - self.fed % _SLICE
            piece, data = (data[:cut], data[cut:]) if len(data) > cut else (data, b"")
            self.fed += len(piece)
            self._feed(piece)

    def _feed(self, data: bytes) -> None:
        while data and not self.ended:
            if self.obj is None:
                data = self.head + data
                self.head = b""
                if len(data) < 2:
                    self.head = data
                    return
                if self.gzip:
                    if self.members and data[:2] != b"\x1f\x8b":
                        self.ended = True  # trailing bytes after the last member
                        return
                    self.obj = zlib.decompressobj(31)
                else:
                    zlib_wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
                    self.obj = zlib.decompressobj(15 if zlib_wrapped else -15)
            data = self._run(data)

    def _run(self, data: bytes) -> bytes:
        """Decompress ``data``; returns the bytes after the end of the stream."""
        obj = self.obj
        try:
            out = obj.decompress(data, DECODE_PIECE)
            while True:
                if out:
                    self.sink(out)
                if len(out) < DECODE_PIECE and not obj.unconsumed_tail:
                    break
                out = obj.decompress(obj.unconsumed_tail, DECODE_PIECE)
        except zlib.error as exc:
            raise ContentDecodingError(f"{self.name}: {exc}") from None
        if not obj.eof:
            return b""
        self.members += 1
        if not self.gzip:
            self.ended = True
            return b""
        self.obj = None
        return bytes(obj.unused_data)

    def close(self) -> None:
        if self.obj is None or self.ended:
            return
        try:
            out = self.obj.flush()
        except zlib.error as exc:  # pragma: no cover - flush rarely raises
            raise ContentDecodingError(f"{self.name}: {exc}") from None
        if out:
            self.sink(out)


class _Brotli(_Layer):
    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        assert _brotli is not None
        self.obj = _brotli.Decompressor()

    def feed(self, data: bytes) -> None:
        obj = self.obj
        if obj.is_finished() or not data:
            return
        try:
            out = obj.process(data, output_buffer_limit=DECODE_PIECE)
            while out:
                self.sink(out)
                if obj.is_finished():
                    break
                out = obj.process(b"", output_buffer_limit=DECODE_PIECE)
        except _brotli.error as exc:
            raise ContentDecodingError(f"br: {exc}") from None


class _SinkWriter:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def write(self, data: bytes) -> int:
        self.sink(bytes(data))
        return len(data)


class _Zstd(_Layer):
    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        assert _zstandard is not None
        # RFC 9659: zstd content coding uses windows of at most 8 MiB.
        self.obj = _zstandard.ZstdDecompressor(max_window_size=8 << 20).stream_writer(
            cast(Any, _SinkWriter(sink)), write_size=DECODE_PIECE, closefd=False
        )

    def feed(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.obj.write(data)
        except _zstandard.ZstdError as exc:
            raise ContentDecodingError(f"zstd: {exc}") from None


class ContentDecoder:
    """Decodes a body of the given Content-Encoding, pushing pieces to ``sink``.

    ``encoding`` is the header value, possibly a list (``"gzip, br"``: applied
    in that order, so decoded in reverse). Raises :class:`ContentDecodingError` on an
    unsupported encoding (at construction) and on corrupt data (in ``feed``).
    """

    def __init__(
        self, encoding: str | None, sink: Sink, *, max_bytes: int = MAX_DECODED_BYTES
    ) -> None:
        names = [n.strip().lower() for n in (encoding or "").split(",")]
        names = [n for n in names if n and n != "identity"]
        unsupported = [n for n in names if n not in supported_encodings()]
        if unsupported:
            raise ContentDecodingError(f"unsupported content-encoding {', '.join(unsupported)}")
        self.identity = not names
        self.max_bytes = max_bytes
        #: bytes the innermost layer has produced so far
        self.decoded = 0
        self._sink = sink
        target = self._bounded if names else sink
        layers: list[_Layer] = []
        for name in names:  # the first applied is decoded last
            layer = _make(name, target)
            layers.append(layer)
            target = layer.feed
        self._layers = layers[::-1]  # outermost (last applied) first
        self.feed: Sink = target

    def _bounded(self, piece: bytes) -> None:
        self.decoded += len(piece)
        if self.decoded > self.max_bytes:
            raise ContentDecodingError(
                f"the body decompresses to more than {self.max_bytes} bytes; reading stopped"
            )
        self._sink(piece)

    def close(self) -> None:
        for layer in self._layers:
            layer.close()


def _make(name: str, sink: Sink) -> _Layer:
    if name in ("gzip", "x-gzip"):
        return _Zlib(sink, gzip=True)
    if name == "deflate":
        return _Zlib(sink, gzip=False)
    if name == "br":
        return _Brotli(sink)
    return _Zstd(sink)

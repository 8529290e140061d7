"""Content decoding: gzip, deflate, br, zstd; bounded output."""

from __future__ import annotations

import gzip
import zlib

import pytest

from ingest.taps.base import DECODE_PIECE
from ingest.taps.decode import ContentDecoder, ContentDecodingError, supported_encodings

TEXT = b"data: " + b'{"choices":[],"usage":{"prompt_tokens":5}}' * 200 + b"\n\n"


def decode(encoding: str, data: bytes, step: int = 13) -> tuple[bytes, int]:
    pieces: list[bytes] = []
    decoder = ContentDecoder(encoding, pieces.append)
    for i in range(0, len(data), step):
        decoder.feed(data[i : i + step])
    decoder.close()
    return b"".join(pieces), max((len(p) for p in pieces), default=0)


def test_identity() -> None:
    assert ContentDecoder(None, print).identity
    assert ContentDecoder(" identity ", print).identity


def test_gzip_including_several_members_split_anywhere() -> None:
    data = gzip.compress(TEXT[:500]) + gzip.compress(TEXT[500:])
    for step in (1, 2, 7, len(data)):
        assert decode("gzip", data, step)[0] == TEXT
    assert decode("x-gzip", data)[0] == TEXT


def test_deflate_zlib_wrapped_and_raw() -> None:
    assert decode("deflate", zlib.compress(TEXT))[0] == TEXT
    raw = zlib.compressobj(wbits=-15)
    assert decode("deflate", raw.compress(TEXT) + raw.flush(), step=1)[0] == TEXT


def test_stacked_encodings_are_undone_in_reverse() -> None:
    data = gzip.compress(zlib.compress(TEXT))  # deflate applied first, then gzip
    assert decode("deflate, gzip", data)[0] == TEXT


@pytest.mark.skipif("br" not in supported_encodings(), reason="brotli not installed")
def test_brotli() -> None:
    import brotli

    assert decode("br", brotli.compress(TEXT))[0] == TEXT


@pytest.mark.skipif("zstd" not in supported_encodings(), reason="zstandard not installed")
def test_zstd() -> None:
    import zstandard

    assert decode("zstd", zstandard.ZstdCompressor().compress(TEXT))[0] == TEXT


def test_decompression_bomb_output_is_bounded_per_piece() -> None:
    bomb = gzip.compress(b"\0" * (20 << 20))  # 20 MiB from ~20 KiB
    total = 0
    largest = 0

    def sink(piece: bytes) -> None:
        nonlocal total, largest
        total += len(piece)
        largest = max(largest, len(piece))

    decoder = ContentDecoder("gzip", sink)
    decoder.feed(bomb)
    decoder.close()
    assert total == 20 << 20
    assert largest <= DECODE_PIECE


def test_corrupt_and_unsupported() -> None:
    with pytest.raises(ContentDecodingError, match="gzip"):
        decode("gzip", b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    with pytest.raises(ContentDecodingError, match="unsupported content-encoding compress"):
        ContentDecoder("compress", print)


def test_trailing_garbage_after_gzip_is_ignored() -> None:
    assert decode("gzip", gzip.compress(TEXT) + b"\n\n")[0] == TEXT


def _bomb(encoding: str, size: int) -> bytes:
    """``size`` zero bytes compressed in ``encoding`` (a few KiB to ~100 KiB)."""
    zeros = b"\0" * (1 << 20)
    if encoding == "gzip":
        packer = zlib.compressobj(9, wbits=31)
        return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()
    if encoding == "br":
        import brotli

        return bytes(brotli.compress(b"\0" * size, quality=1))
    import zstandard

    return bytes(zstandard.ZstdCompressor().compress(b"\0" * size))


@pytest.mark.parametrize(
    "encoding", [e for e in ("gzip", "br", "zstd") if e in supported_encodings()]
)
def test_a_body_decompressing_past_the_bound_is_cut_off(encoding: str) -> None:
    limit = 3 << 20
    total = 0

    def sink(piece: bytes) -> None:
        nonlocal total
        total += len(piece)

    decoder = ContentDecoder(encoding, sink, max_bytes=limit)
    bomb = _bomb(encoding, 32 << 20)
    with pytest.raises(ContentDecodingError, match=f"more than {limit} bytes"):
        for i in range(0, len(bomb), 16 * 1024):
            decoder.feed(bomb[i : i + 16 * 1024])
    assert total <= limit  # nothing past the bound reached the reader
    assert decoder.decoded <= limit + 2 * DECODE_PIECE  # and little more was inflated


def test_a_decompression_bomb_is_charged_pessimistically_by_the_tap() -> None:
    from ingest.taps import open_tap
    from ingest.taps.decode import MAX_DECODED_BYTES

    bomb = _bomb("gzip", MAX_DECODED_BYTES + (16 << 20))
    tap = open_tap(
        "openai-chat",
        {"model": "gpt-4o", "max_completion_tokens": 700, "messages": []},
        content_type="application/json",
        content_encoding="gzip",
        status=200,
    )
    for i in range(0, len(bomb), 64 * 1024):
        tap.feed(bomb[i : i + 64 * 1024])
    result = tap.finish()
    assert result.usage_source == "estimated"
    assert result.estimate_reason is not None and "decompresses to more than" in (
        result.estimate_reason
    )
    assert result.output_tokens == 700  # the whole cap: what it generated is unknown
    assert tap.decoded_bytes <= MAX_DECODED_BYTES

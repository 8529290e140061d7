"""Content decoding: gzip, deflate, br, zstd; bounded output."""

from __future__ import annotations

import gzip
import zlib

import pytest

from ingest.taps.base import DECODE_PIECE
from ingest.taps.decode import ContentDecoder, DecodeError, supported_encodings

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
    with pytest.raises(DecodeError, match="gzip"):
        decode("gzip", b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    with pytest.raises(DecodeError, match="unsupported content-encoding compress"):
        ContentDecoder("compress", print)


def test_trailing_garbage_after_gzip_is_ignored() -> None:
    assert decode("gzip", gzip.compress(TEXT) + b"\n\n")[0] == TEXT

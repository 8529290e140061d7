"""Run a tap over a captured response (the library half of ``spendbus tap inspect``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, BinaryIO

from .estimate import EstimatorConfig
from .formats import open_tap
from .usage import TapResult

_GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 64 * 1024

Source = bytes | str | os.PathLike[str] | BinaryIO


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(CHUNK):
        yield chunk


def inspect_response(
    fmt: str,
    response: Source,
    *,
    request: bytes | str | os.PathLike[str] | dict[str, Any] | None = None,
    content_encoding: str | None = None,
    content_type: str | None = None,
    streaming: bool | None = None,
    status: int | None = None,
    model: str | None = None,
    cut: str | None = None,
    estimator: EstimatorConfig | None = None,
) -> TapResult:
    """The usage a tap reads from a response captured as received.

    ``response`` is the raw body (bytes), a path to it, or a binary file; a file
    is read in chunks, never whole. When ``content_encoding`` is None a gzip
    body is recognised by its magic bytes. ``request`` is the request body
    (bytes or a dict) or a path to it.
    """
    with ExitStack() as stack:
        if isinstance(request, str | os.PathLike):
            request = stack.enter_context(open(request, "rb")).read()
        if isinstance(response, bytes):
            chunks: Iterator[bytes] = iter(
                [response[i : i + CHUNK] for i in range(0, len(response), CHUNK)]
            )
        else:
            handle = (
                stack.enter_context(open(response, "rb"))
                if isinstance(response, str | os.PathLike)
                else response
            )
            chunks = _chunks(handle)
        first = next(chunks, b"")
        if content_encoding is None and first[:2] == _GZIP_MAGIC:
            content_encoding = "gzip"
        tap = open_tap(
            fmt,
            request,
            streaming=streaming,
            content_encoding=content_encoding,
            content_type=content_type,
            status=status,
            model=model,
            estimator=estimator or EstimatorConfig(),
        )
        tap.feed(first)
        for chunk in chunks:
            tap.feed(chunk)
        return tap.finish(cut=cut)

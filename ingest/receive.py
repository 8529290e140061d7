"""Receiving a request body within a deadline and a size limit: runtime/http_receive.py
(the admin API reads its bodies the same way), named here for the ingest's servers."""

from __future__ import annotations

from runtime.half_close import AnswerAfterHalfClose
from runtime.http_receive import (
    BodyRefused,
    close_after,
    read_body,
    run_app,
    server_options,
)

__all__ = [
    "AnswerAfterHalfClose",
    "BodyRefused",
    "close_after",
    "read_body",
    "run_app",
    "server_options",
]

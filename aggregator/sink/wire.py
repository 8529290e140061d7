"""The wire between a worker and its sink process: length-prefixed pickles on a socketpair.

The worker makes the socketpair and passes one end to the process it starts
(``aggregator/sink/link.py``, ``aggregator/sink/process.py``); nothing else can connect
(no filesystem name, no port), so pickle carries the config and the rows (datetimes,
decimals, lists) between two processes of one program. Errors cross as their class
name, message and refusal reason and are raised again as the same sink error class.

Messages, each one frame:

- worker -> sink process: ``("config", AggregatorConfig)`` once, then
  ``("call", id, method, args)``;
- sink process -> worker: ``("started",)`` once its stage has subscribed,
  ``("figures", dict)`` after each batch committed and every second, and
  ``("reply", id, True, result)`` or ``("reply", id, False, (kind, message, reason))``.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any, Final

from aggregator.sink.errors import (
    QueryRefused,
    SinkError,
    SinkRejected,
    SinkUnavailable,
)

HEADER: Final = struct.Struct(">I")
#: the sink errors that cross the wire as themselves; anything else arrives as SinkError
_ERRORS: Final[dict[str, type[SinkError]]] = {
    "SinkUnavailable": SinkUnavailable,
    "SinkRejected": SinkRejected,
    "SinkError": SinkError,
}


async def send(writer: asyncio.StreamWriter, message: Any) -> None:
    """One frame (the caller holds the writer's lock: frames never interleave)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(HEADER.pack(len(body)) + body)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next frame; ``asyncio.IncompleteReadError`` when the other side is gone."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def error_fields(exc: BaseException) -> tuple[str, str, str | None]:
    """(kind, message, reason) of an error raised in the sink process."""
    if isinstance(exc, QueryRefused):
        return "QueryRefused", str(exc), exc.reason
    for kind, cls in _ERRORS.items():
        if isinstance(exc, cls):
            return kind, str(exc), None
    return "SinkError", f"{type(exc).__name__}: {exc}", None


def error_from(fields: tuple[str, str, str | None]) -> SinkError:
    """The sink error :func:`error_fields` described, to raise in the worker."""
    kind, message, reason = fields
    if kind == "QueryRefused":
        return QueryRefused(message, reason=reason or "refused")
    return _ERRORS.get(kind, SinkError)(message)

"""A client that sends part of a request and then nothing: what a server's receive
deadlines are for (the HTTP surfaces' tests share it)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

#: how long a test waits for the server to answer or hang up before it fails (a guard
#: against a hang, far above any deadline the tests configure; never a measured threshold)
GUARD_S = 30.0


async def send_then_stall(url: str, data: bytes) -> bytes:
    """Send ``data`` to ``url``'s host and port, send nothing more, and return everything the
    server writes until it closes the connection. TimeoutError if it never does."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(GUARD_S):
            return await reader.read()  # until the server closes
    finally:
        writer.close()


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 request head (ends with the blank line)."""
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()

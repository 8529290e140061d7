"""The wire between a store's owner and its engine process: length-prefixed pickles on a
socketpair (``engine_link.py`` makes it, ``engine_host.py`` is the other end).

Nothing else can connect (no filesystem name, no port), so pickle carries statements,
rows and settings between two processes of one program. Frames:

- owner -> engine: ``("config", dict)`` once; ``("call", id, session, settings, method,
  args, kwargs)``; ``("close", session)``;
- engine -> owner: ``("ready", landlock_abi)`` or ``("failed", message)`` once;
  ``("reply", id, True, result)`` or ``("reply", id, False, (kind, message, code))``,
  where ``kind`` names a sink error class (raised again as itself) or ``"engine"``
  (the engine's own error, raised again with its code).
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any, Final

HEADER: Final = struct.Struct(">I")


def send_frame(sock: socket.socket, message: Any) -> None:
    """One frame (the caller serialises senders)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(len(body)) + body)


def receive_frame(sock: socket.socket) -> Any:
    """The next frame; EOFError when the other end is gone."""
    (size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the engine's socket")
        chunks += chunk
    return bytes(chunks)

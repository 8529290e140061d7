"""Which listen addresses count as loopback: a server bound anywhere else needs a token."""

from __future__ import annotations

from typing import Final

#: hosts a server may listen on without a bearer token (only this machine can reach them)
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "::1", "localhost"})


def is_loopback(host: str) -> bool:
    """True when ``host`` is one of :data:`LOOPBACK_HOSTS` (0.0.0.0 and :: are not)."""
    return host in LOOPBACK_HOSTS

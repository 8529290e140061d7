"""A secret file made once under ``$SPENDBUS_HOME``: the web token, the key secret."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def create_once(path: Path, value: str) -> bool:
    """Write ``value`` (and a newline) to ``path`` (0600) unless it exists; False when
    another process made it first (read that one then).

    The value is written whole to a private file first, then linked into place: a reader
    never sees half a secret, and of two processes starting at once the first link wins.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new home is private
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(value + "\n")
        try:
            os.link(staged, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
    return True

"""``$SPENDBUS_HOME`` is private: the folder and its folders 0700, its logs 0600.

The home holds usage with user ids (the Kafka log, the ClickHouse store, the worker's
RocksDB tables), the logs and the secrets (``keys.secret``, ``web.token``). `spendbus up`
makes it 0700 and tightens one made earlier (0755 before issue 32), logging what it
changed; the processes spendbus starts (the broker's JVM, the worker) run under umask
077 (``runtime.private_files.PRIVATE_UMASK``), so what they write is 0600/0700, and the
logs spendbus opens for them are made 0600.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

from runtime.private_files import OPEN_BITS

log = logging.getLogger(__name__)


def secure_home(home: Path) -> list[Path]:
    """Make ``home`` (and its parents as needed) 0700; tighten it, the folders directly in
    it and the logs of the stack's processes when group or others could reach them.
    Returns what was tightened (each logged once, as a warning)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    targets = [home, *(p for p in home.iterdir() if p.is_dir() and not p.is_symlink())]
    logs = [*home.glob("*/*.log"), *home.glob("*/logs/*"), *home.glob("*/*/broker.log")]
    changed = [p for p in targets if _tighten(p, 0o700)]
    changed += [p for p in logs if p.is_file() and not p.is_symlink() and _tighten(p, 0o600)]
    for path in changed:
        log.warning(
            "%s was readable by other users: made private (%s); it holds usage with user "
            "ids, logs or secrets",
            path,
            "0700" if path.is_dir() else "0600",
        )
    return changed


def _tighten(path: Path, mode: int) -> bool:
    current = stat.S_IMODE(path.stat().st_mode)
    if not current & OPEN_BITS:
        return False
    os.chmod(path, mode)
    return True


def open_private_log(path: Path) -> BinaryIO:
    """``path`` opened to append (made 0600, or tightened to it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    if stat.S_IMODE(os.fstat(fd).st_mode) & OPEN_BITS:
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


__all__ = ["open_private_log", "secure_home"]

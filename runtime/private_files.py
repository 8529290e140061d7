"""Secret files and private folders: a secret readable by others is refused.

Every secret spendbus reads from a file (bearer tokens, the key secret, the web token,
the ClickHouse and SASL password files, a webhook's signing secret) is refused when its
group or other users may read it: the message names the file and the fix (``chmod 600
FILE``), and the command stops as on any other configuration error (exit status 2).
Standard input (``-``) and environment variables are not files: unaffected.
Shared by the CLI and the rooms (notify reads webhook secrets), which may share only
``schemas/``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from schemas.errors import ConfigError

#: the mode bits a secret file must not have: read (and write) by group or others
OPEN_BITS: Final = 0o077
#: the umask of the processes spendbus starts: files 0600, folders 0700
PRIVATE_UMASK: Final = 0o077


def secret_file_problem(path: Path | str, where: str) -> str | None:
    """Why ``path`` may not hold a secret (readable by group or others), else None;
    ``where`` starts the message (the file, or ``SETTING=file``).

    A file that cannot be stat'ed is left to the reader's own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not stat.S_ISREG(mode) or not mode & 0o044:
        return None  # a FIFO or a /dev/fd file is no stored secret; private already
    return (
        f"{where}: other users can read this secret (mode {stat.S_IMODE(mode):04o}): "
        f"refused; make it private with `chmod 600 {path}` (or give it by environment)"
    )


def check_secret_file(path: Path | str, where: str) -> None:
    """ConfigError when ``path`` is readable by group or others (see the module doc)."""
    problem = secret_file_problem(path, where)
    if problem is not None:
        raise ConfigError(problem)


__all__ = ["OPEN_BITS", "PRIVATE_UMASK", "check_secret_file", "secret_file_problem"]

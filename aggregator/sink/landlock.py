"""Landlock: a process takes away its own access to every file outside a few folders.

The engine's process (``engine_host.py``) calls :func:`restrict` once, before the engine
starts any thread: from then on, it and every thread it starts can read and write under
the store's folder, read the folders its code comes from, and open nothing else. A
statement that reaches the engine past /sql's guard still cannot read ``keys.secret``
or ``/proc/self/environ``, nor write a file anywhere but the store.

Linux's own mechanism (5.13+, unprivileged: no root, no namespace, no helper binary),
called through its three system calls with ctypes: the maintained Python bindings on PyPI
wrap the same calls for one architecture at a time and lag the kernel's ABI, and this is
the whole of what is needed. Rights the running kernel does not know are left out (its
ABI version says which), so an older kernel enforces what it can.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Final

#: system call numbers (identical on x86_64 and aarch64: the generic table)
_CREATE_RULESET: Final = 444
_ADD_RULE: Final = 445
_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1 << 0
_RULE_PATH_BENEATH: Final = 1
_PR_SET_NO_NEW_PRIVS: Final = 38

# filesystem rights (include/uapi/linux/landlock.h)
EXECUTE: Final = 1 << 0
WRITE_FILE: Final = 1 << 1
READ_FILE: Final = 1 << 2
READ_DIR: Final = 1 << 3
REMOVE_DIR: Final = 1 << 4
REMOVE_FILE: Final = 1 << 5
MAKE_CHAR: Final = 1 << 6
MAKE_DIR: Final = 1 << 7
MAKE_REG: Final = 1 << 8
MAKE_SOCK: Final = 1 << 9
MAKE_FIFO: Final = 1 << 10
MAKE_BLOCK: Final = 1 << 11
MAKE_SYM: Final = 1 << 12
REFER: Final = 1 << 13  # ABI 2
TRUNCATE: Final = 1 << 14  # ABI 3
IOCTL_DEV: Final = 1 << 15  # ABI 5

#: every right the kernel of each ABI version knows
_HANDLED_BY_ABI: Final = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_ALL_KNOWN: Final = (1 << 16) - 1
#: the rights that apply to a file (the others only to a folder)
_FILE_RIGHTS: Final = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ: Final = EXECUTE | READ_FILE | READ_DIR
READ_WRITE: Final = _ALL_KNOWN


class LandlockUnavailable(OSError):
    """The kernel cannot restrict this process (no Landlock, or it is disabled)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or not Linux)."""
    if platform.system() != "Linux":
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def restrict(read_write: Iterable[Path], read_only: Iterable[Path]) -> int:
    """From now on this thread and every thread and process it starts may read and write
    under ``read_write``, read under ``read_only``, and open nothing else.

    Paths that do not exist are skipped. Returns the ABI version enforced; raises
    LandlockUnavailable when the kernel cannot (nothing is restricted then).
    """
    version = abi_version()
    if version < 1:
        raise LandlockUnavailable("this kernel has no Landlock (Linux 5.13+ with lsm=landlock)")
    handled = _HANDLED_BY_ABI.get(version, _ALL_KNOWN)
    libc = _libc()
    attr = _RulesetAttr(handled)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise LandlockUnavailable(os.strerror(ctypes.get_errno()))
    try:
        for paths, access in ((read_write, READ_WRITE), (read_only, READ)):
            for path in paths:
                _add_rule(libc, ruleset, path, access & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockUnavailable(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise LandlockUnavailable(f"restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return version


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: Path, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = _PathBeneathAttr(access, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockUnavailable(f"a rule for {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


__all__ = ["LandlockUnavailable", "abi_version", "restrict"]

"""`spendbus demo` on a terminal (a pty): once its checks pass it serves the spend console
and prints a login that signs in there, where the refused key shows exceeded with its
reset time; Ctrl-C (SIGINT, what the terminal sends) stops the console and the stack and
the demo exits 0. (Off a terminal it ends by itself: tests/packaging/test_wheel_demo.py.)"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from spendbus.stack.broker_probe import free_port

#: slow: a whole demo with a worker (25-45 s on two cores); make test covers the served
#: console and its login in tests/cli/test_demo_console.py, the off-terminal end in the
#: wheel demo
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: a guard against a hang (the demo's own steps time out sooner), never a measured threshold
GUARD_S = 300.0
_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def drain(master: int) -> bytes:
    """What the demo wrote to its terminal within a moment ('' at its end)."""
    if not select.select([master], [], [], 0.2)[0]:
        return b""
    try:
        return os.read(master, 65536)
    except OSError:  # the demo closed its side
        return b""


def test_on_a_terminal_the_demo_serves_its_console_with_a_login_until_ctrl_c(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "SPENDBUS_HOME": str(tmp_path / "home"),
        "KAFKA_BOOTSTRAP": kafka_bootstrap,  # the session's broker; the demo takes a prefix
        "SPENDBUS_ADMIN_PORT": str(free_port()),
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
    }
    master, terminal = pty.openpty()
    demo = subprocess.Popen(
        [sys.executable, "-m", "spendbus", "demo", "--events", "120"],
        cwd=tmp_path,
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    try:
        seen, login = b"", None
        deadline = time.monotonic() + GUARD_S
        while login is None and demo.poll() is None and time.monotonic() < deadline:
            seen += drain(master)
            login = re.search(
                r"spend console: (http://127\.0\.0\.1:\d+/) +\(serving for 900 s or until Ctrl-C.*?\n"
                r"console login \(platform-admin token \w+, shown once\): (sbadm_\S+)",
                _ESCAPES.sub(b"", seen).decode(errors="replace"),
            )
        assert login is not None, _ESCAPES.sub(b"", seen).decode(errors="replace")[-3000:]
        url, token = login.groups()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        with browser.open(url + "login", urllib.parse.urlencode({"token": token}).encode()) as r:
            assert r.status == 200 and r.url == url  # signed in: the overview
            overview = " ".join(re.sub(r"<[^>]+>", " ", r.read().decode()).split())
        # the demo's exhausted secret, refused by its budget, and when that resets
        refused = re.search(
            r"initech/sk-initech-intern \$[\d.]+ of \$([\d.]+) \(100 %\) exceeded \(enforce\) "
            r"\w{3} .*?\d\d:\d\d UTC",
            overview,
        )
        assert refused is not None, overview
        demo.send_signal(signal.SIGINT)
        stop_by = time.monotonic() + GUARD_S
        while demo.poll() is None and time.monotonic() < stop_by:
            drain(master)  # a terminal nobody reads would block the demo's output
        assert demo.wait(1) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        os.close(master)

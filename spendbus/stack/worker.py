"""The aggregator worker as a child process: start, wait until serving, stop, talk to its web port.

The worker owns the embedded ClickHouse path (one process per path), so
analyst queries while it runs go through its ``/sql`` page. Every request carries the
web token (``spendbus/stack/web_token.py``) when there is one: ``/sql`` needs it always,
every page when the worker binds anything but loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from runtime.private_files import PRIVATE_UMASK
from schemas.errors import SpendbusError
from spendbus.stack.private_home import open_private_log

#: the token file in SPENDBUS_HOME (spendbus/stack/web_token.py creates it)
DEFAULT_TOKEN_FILE = "web.token"
#: addresses that mean "every interface": the worker is then asked on loopback
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class WorkerError(SpendbusError):
    pass


@dataclass
class WorkerProcess:
    """One aggregator worker (``spendbus aggregator run``) with its pid and log files in ``run_dir``."""

    run_dir: Path
    env: dict[str, str]
    web_port: int
    name: str = "aggregator"
    #: extra arguments of `spendbus aggregator run` (e.g. --no-sink)
    args: tuple[str, ...] = ()
    #: the address the worker binds (SPENDBUS_WEB_HOST); requests go there
    web_host: str = "127.0.0.1"
    #: the web token, or the file holding it (read at each request: the worker may create
    #: it after this object exists); never on the command line
    token: SecretStr | None = field(default=None, repr=False)
    token_file: Path | None = None

    def __post_init__(self) -> None:
        if self.token is None and self.token_file is None:
            # the token the child serves with: its configured file, else its home's
            configured = self.env.get("SPENDBUS_WEB_TOKEN_FILE")
            home = self.env.get("SPENDBUS_HOME")
            if configured:
                self.token_file = Path(configured)
            elif home:
                self.token_file = Path(home) / DEFAULT_TOKEN_FILE

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.web_host in WILDCARD_HOSTS else self.web_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.web_port}"

    def _authorization(self) -> dict[str, str]:
        token = self.token
        if token is None and self.token_file is not None:
            try:
                first = self.token_file.read_text().splitlines()[:1]
            except OSError:
                first = []
            token = SecretStr(first[0].strip()) if first and first[0].strip() else None
        return {} if token is None else {"authorization": f"Bearer {token.get_secret_value()}"}

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def start(self, timeout: float = 120.0) -> int:
        existing = self.pid()
        if existing is not None:
            return existing
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = open_private_log(self.log_file)  # 0600: usage, user ids
        process = subprocess.Popen(
            [sys.executable, "-m", "spendbus", "aggregator", "run", *self.args],
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=PRIVATE_UMASK,  # its store, tables and files: 0600/0700
        )
        self.pid_file.write_text(str(process.pid))
        self.wait_ready(process, timeout)
        return process.pid

    def wait_ready(self, process: subprocess.Popen[bytes] | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise WorkerError(
                    f"the aggregator worker exited with {process.returncode}:\n{self.log_tail()}"
                )
            try:
                stats = self.get("/stats", timeout=2)
                if stats.get("serving"):
                    return
            except (OSError, WorkerError):
                pass
            time.sleep(0.25)
        raise WorkerError(
            f"the aggregator worker did not become ready in {timeout:.0f}s:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """kill -9: what a crash looks like (fault tests)."""
        self.stop(timeout=10, sig=signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def get(self, path: str, timeout: float = 10) -> Any:
        return self._request(path, None, timeout)

    def post(self, path: str, body: Any, timeout: float = 60) -> Any:
        return self._request(path, body, timeout)

    def _request(self, path: str, body: Any, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=data,
            headers={"content-type": "application/json", **self._authorization()},
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("error", detail)
            if exc.code == 401:
                source = "SPENDBUS_WEB_TOKEN" if self.token is not None else self.token_file
                detail += f" (the token sent came from {source or 'nowhere: none is set'})"
            raise WorkerError(f"{path}: {detail}") from None


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

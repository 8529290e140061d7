"""Reaching the engine: one engine per process, malformed DSNs, an unreachable server, a
data path another process holds."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.sink import (
    ClickHouseSink,
    DataPathInUse,
    SinkUnavailable,
    open_client,
)
from schemas.errors import ConfigError
from tests.aggregator.sink.kit import (
    batch,
    scalar,
    totals,
)


def test_two_clients_on_one_path_in_one_process_share_the_engine(engine: str, client: Any) -> None:
    database = scalar(client, "SELECT currentDatabase()")
    other = open_client(engine, database=database)
    try:
        ClickHouseSink(other).write(batch(range(5)))
        assert totals(client)[0] == 5
    finally:
        other.close()
    assert totals(client)[0] == 5  # closing one client leaves the engine to the others


@pytest.mark.parametrize(
    "dsn", ["chdb://relative/path", "chdb:///abs?opt=1", "ftp://host/db", "http:///db"]
)
def test_a_malformed_dsn_is_a_config_error(dsn: str) -> None:
    with pytest.raises(ConfigError):
        open_client(dsn)


def test_an_unreachable_server_is_retriable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SinkUnavailable) as info:
        open_client(f"http://default:secret@127.0.0.1:{port}/default")
    assert info.value.retriable
    assert "secret" not in str(info.value)


def test_a_data_path_held_by_another_process_names_it_until_it_dies(tmp_path: Path) -> None:
    """chdb hides why it cannot start; open_client finds the lock and its holder."""
    dsn = f"chdb://{tmp_path}/held"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from aggregator.sink import open_client\n"
            f"client = open_client({dsn!r})\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    probe = (
        "from aggregator.sink import open_client, DataPathInUse\n"
        "try:\n"
        f"    open_client({dsn!r})\n"
        "    print('opened')\n"
        "except DataPathInUse as exc:\n"
        "    print('in use', exc.retriable, exc.holder)\n"
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        ).stdout
        assert out.strip() == f"in use True pid {holder.pid}"
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    deadline = time.monotonic() + 30
    out = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        ).stdout
        if out.strip() == "opened":
            break
    assert out.strip() == "opened"
    assert issubclass(DataPathInUse, SinkUnavailable)

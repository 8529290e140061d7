"""A client that shuts its sending side after a whole request (``shutdown(SHUT_WR)``) still
gets the answer from ``spendbus ingest serve`` (issue 21): aiohttp's ``run_app`` closed such
a connection without one, so the client saw no 202 for events that were published, and
re-posted them. Run as the command runs it, over a raw socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from schemas.topics import Topics
from spendbus.stack.broker_probe import free_port
from tests.ingest.http.kit import TOKEN, consume, json_event

pytestmark = pytest.mark.integration

#: a guard against a hang, far above the deadlines configured (never a measured threshold)
GUARD_S = 30.0


def _answer_after_half_close(port: int, data: bytes) -> bytes:
    """Send ``data``, shut the sending side, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD_S) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _post(body: bytes) -> bytes:
    return (
        f"POST /v1/usage HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_half_closed_client_gets_its_answer_and_the_server_stops_cleanly(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "ingest.log"
    args = [
        *("ingest", "serve", "--port", str(port), "--bootstrap", kafka_bootstrap),
        *("--topic-prefix", topics.prefix, "--spool-dir", str(tmp_path / "spool")),
        *("--header-timeout", "0.5", "--body-timeout", "0.5"),
    ]
    env = {**os.environ, "SPENDBUS_INGEST_TOKEN": TOKEN, "SPENDBUS_HOME": str(tmp_path)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "spendbus", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                        break
                except OSError:
                    assert process.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            events = [json_event(i) for i in range(3)]
            answer = _answer_after_half_close(port, _post(json.dumps(events).encode()))
            assert answer.startswith(b"HTTP/1.1 202"), answer[:300]
            assert answer.endswith(b'{"accepted": 3}'), answer[-300:]
            # a bad batch, half-closed: its 400 says why
            answer = _answer_after_half_close(port, _post(b"[{"))
            assert answer.startswith(b"HTTP/1.1 400") and b"invalid JSON" in answer
            # a head cut short, then the end of input: nothing to answer, closed at once
            assert _answer_after_half_close(port, b"POST /v1/usage HTTP/1.1\r\n") == b""
            # a body shorter than declared: the body deadline answers it
            answer = _answer_after_half_close(port, _post(b"[]")[:-1])
            assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
            # and SIGTERM still drains and stops the server (it runs its own loop now)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=GUARD_S) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    published = {
        e["event_id"] for _, e in asyncio.run(consume(kafka_bootstrap, topics.usage_raw, 3))
    }
    assert {e["event_id"] for e in events} <= published

"""Hostile HTTP requests for the fuzz suite (issue 21): hypothesis strategies of raw
requests, a raw-socket sender, and the servers run as their commands run them.

``SPENDBUS_FUZZ_EXAMPLES`` sets how many requests each surface gets (``make test``: the
default, a bounded few hundred; ``make test-fuzz``: thousands).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from schemas.codec import USAGE_EVENT

#: requests per surface (each example is one request)
EXAMPLES = int(os.environ.get("SPENDBUS_FUZZ_EXAMPLES", "200"))
#: hypothesis's settings for a fuzz test: ``EXAMPLES`` requests, no deadline (a request
#: is real I/O), no example database, every health check off (the inputs are meant to be
#: hostile and slow)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
#: the most a server's resident memory may grow over a whole fuzz run
RSS_GROWTH_BOUND = 200 * 1024 * 1024
#: pytest-timeout's guard against a hang, per fuzz test: scaled with the examples (a /sql
#: request is a query on the embedded engine: 1,000 of them pass the default 300 s)
GUARD_S = max(300, 2 * EXAMPLES)

METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO"])
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/octet-stream",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
        "\x00\x01garbage",
    ]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)


@st.composite
def bodies(draw: st.DrawFn, shapes: Sequence[dict[str, object]]) -> bytes:
    """Malformed JSON, deep nesting, binary bytes, wrong shapes, near-valid documents."""
    kind = draw(st.sampled_from(["json", "near", "deep", "binary", "text", "huge", "empty"]))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "near":  # a valid shape with fields replaced by hostile values
        doc = dict(draw(st.sampled_from(list(shapes))))
        for field in draw(st.lists(st.sampled_from(sorted(doc) or ["x"]), max_size=3)):
            doc[field] = draw(JSON_VALUES)
        return json.dumps(doc).encode()
    if kind == "deep":
        depth = draw(st.integers(1_000, 200_000))
        opener = draw(st.sampled_from(["[", '{"a":']))
        return (opener * depth).encode()
    if kind == "binary":
        return draw(st.binary(max_size=2048))
    if kind == "text":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    if kind == "huge":
        return b'{"model": "' + b"x" * draw(st.integers(10_000, 600_000)) + b'"}'
    return b""


@dataclass(frozen=True)
class RawRequest:
    data: bytes
    #: bytes left unsent (a slow sender stops there and waits)
    stall: bool = False
    #: shut the sending side once sent (a hostile request: the server sees the end of its
    #: bytes at once); a well-formed one keeps it open, as clients do
    half_close: bool = True


@st.composite
def requests(
    draw: st.DrawFn,
    paths: Sequence[str],
    shapes: Sequence[dict[str, object]],
    auth: Sequence[dict[str, str]],
) -> RawRequest:
    method = draw(st.sampled_from(["POST"] * 4) | METHODS)
    path = draw(
        st.sampled_from(list(paths))
        | st.text(alphabet="/abcdefgh.%?=&-_~:", min_size=1, max_size=60).map(lambda p: "/" + p)
    )
    headers = dict(draw(st.sampled_from(list(auth))))
    headers["Content-Type"] = draw(CONTENT_TYPES)
    body = draw(bodies(shapes))
    extra = draw(st.sampled_from(["none", "none", "huge_header", "many_headers", "bad_length"]))
    if extra == "huge_header":
        headers["X-Huge"] = "h" * draw(st.integers(4_000, 40_000))
    elif extra == "many_headers":
        for i in range(draw(st.integers(50, 300))):
            headers[f"X-H{i}"] = "v"
    length = len(body)
    if extra == "bad_length":
        length = draw(st.sampled_from([-1, 0, len(body) // 2, 10**12]))
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + body
    stall = draw(st.integers(0, 99)) < 2  # a few slow senders: cut short, then silence
    if stall:
        data = data[: max(1, len(data) // 2)]
    return RawRequest(data, stall)


def send(port: int, request: RawRequest, timeout: float = 30.0) -> int | None:
    """The status the server answers ``request`` with; None when it closed without one (or,
    for a slow sender, had not answered within 2 s: it may hold one until its deadline)."""
    if request.stall:
        timeout = 2.0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(request.data)
        if not request.stall and request.half_close:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            if not request.stall and not answer:
                raise
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


def rss(pid: int) -> int:
    """The resident memory of process ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status  # type: ignore[no-any-return]  # urlopen's response is Any in typeshed


@contextlib.contextmanager
def command(args: list[str], env: dict[str, str], ready_url: str, log: Path) -> Iterator[int]:
    """``spendbus ARGS`` as a process until the block ends; yields its pid once
    ``ready_url`` answers."""
    out = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "spendbus", *args],
        env={**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get(ready_url)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"not ready:\n{log.read_text()}") from None
                time.sleep(0.3)
        yield process.pid
        assert process.poll() is None, f"the server died:\n{log.read_text()[-4000:]}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        out.close()


def malformed_heads(credentials: Sequence[tuple[str, str]], path: str = "/") -> list[bytes]:
    """Request heads aiohttp's parser refuses, each carrying a credential header
    ``(name, value)`` of ``credentials`` (issue 32): bare-LF line endings, control bytes in a
    header, an oversize head, invalid methods, a bad version, pipelined junk, a ``?key=`` in
    the request line. A server must answer each 400 and log none of their bytes."""
    out: list[bytes] = []
    for name, value in credentials:
        cred = f"{name}: {value}".encode()
        key = value.removeprefix("Bearer ").encode()
        out += [
            # bare LF line endings
            b"GET " + path.encode() + b" HTTP/1.1\nHost: x\n" + cred + b"\n\n",
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\n" + cred + b"\r\n\r\n",
            # control bytes in a header value and a header name
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + cred + b"\x01\r\n\r\n",
            b"GET " + path.encode() + b" HTTP/1.1\r\n" + cred + b"\r\nX-\x00a: 1\r\n\r\n",
            b"GET " + path.encode() + b" HTTP/1.1\r\n" + cred + b"\x7f\x1b[2J\r\n\r\n",
            # an oversize header line and an oversize request line carrying the key
            b"GET " + path.encode() + b" HTTP/1.1\r\n" + cred + b"h" * 20_000 + b"\r\n\r\n",
            b"GET /?key=" + key + b"&" + b"q" * 20_000 + b" HTTP/1.1\r\n" + cred + b"\r\n\r\n",
            # invalid methods, a bad version
            b"GE\x00T " + path.encode() + b" HTTP/1.1\r\n" + cred + b"\r\n\r\n",
            b"G(E)T " + path.encode() + b" HTTP/1.1\r\n" + cred + b"\r\n\r\n",
            b"GET " + path.encode() + b" HTTP/9.Z\r\n" + cred + b"\r\n\r\n",
            # a space before the colon, an obsolete folded line, a bad chunk size
            b"GET " + path.encode() + b" HTTP/1.1\r\n" + cred.replace(b":", b" :") + b"\r\n\r\n",
            b"GET " + path.encode() + b" HTTP/1.1\r\nX: a\r\n " + cred + b"\r\n\r\n",
            b"POST " + path.encode() + b" HTTP/1.1\r\n" + cred + b"\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz" + key + b"\r\n",
            # pipelined junk after a head: the second request is the malformed one
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nJUNK " + key + b"\n" + cred + b"\n\n",
        ]
    return out


@st.composite
def malformed_requests(draw: st.DrawFn, credentials: Sequence[tuple[str, str]]) -> RawRequest:
    """One of :func:`malformed_heads`, with random bytes spliced into its head."""
    data = draw(st.sampled_from(malformed_heads(credentials)))
    cut = draw(st.integers(0, len(data)))
    junk = draw(st.binary(max_size=16).filter(lambda b: b"\r\n\r\n" not in b))
    return RawRequest(data[:cut] + junk + data[cut:] if draw(st.booleans()) else data)


def answer_of(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Everything the server writes to ``data`` (sent, then half-closed) until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def gateway_config_file(
    directory: Path,
    *,
    gateway_id: str,
    port: int,
    bootstrap: str,
    topic_prefix: str,
    upstream: str,
    keys: dict[str, str],
    provider_keys: dict[str, str] | None = None,
    **settings: object,
) -> Path:
    """``directory/gateway.yaml`` (0600: it holds keys in clear) for a gateway on ``port``
    in front of the fake provider at ``upstream``: one virtual key of org ``acme`` per API
    of ``keys`` (API -> key), its provider key ``provider_keys[api]`` (default
    ``real-<api>``), the publisher's spool in ``directory``; ``settings`` are added as given."""
    config = {
        "gateway_id": gateway_id,
        "listen": {"host": "127.0.0.1", "port": port},
        "kafka": {"bootstrap": bootstrap, "topic_prefix": topic_prefix},
        "publisher": {"spool_dir": str(directory / "spool")},
        "upstreams": {api: {"api": api, "base_url": upstream} for api in keys},
        "secrets": {
            f"sk-{api}": {"upstream": api, "api_key": (provider_keys or {}).get(api, f"real-{api}")}
            for api in keys
        },
        "keys": [
            {
                "name": f"{gateway_id}-{api}",
                "key": key,
                "principal": {"org_id": "acme", "secret_id": f"sk-{api}"},
            }
            for api, key in keys.items()
        ],
        **settings,
    }
    config_file = directory / "gateway.yaml"
    config_file.write_text(yaml.safe_dump(config))
    config_file.chmod(0o600)
    return config_file


async def usage_events(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every UsageEvent on ``topic`` now (read until two seconds bring none)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        empty = 0
        while empty < 4:
            batches = await consumer.getmany(timeout_ms=500)
            got = [m for ms in batches.values() for m in ms]
            empty = 0 if got else empty + 1
            out.extend(USAGE_EVENT.decode(m.value) for m in got)
    finally:
        await consumer.stop()
    return out

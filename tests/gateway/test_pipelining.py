"""Pipelined HTTP/1.1 through the gateway as `spendbus gateway run` serves it
(:class:`ingest.gateway.GatewayServer`, over the half-close server of
`runtime/half_close.py`): requests written back to back on one raw socket, before any
answer is read, are each answered, in order, and each answered call is on usage.raw;
none is charged without its answer. Real broker, real enforcer, the fake providers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ingest.gateway import GatewayServer
from schemas.topics import Topics
from tests.gateway.kit import gateway_stack, request_for
from tests.slow_sender import GUARD_S, head

pytestmark = pytest.mark.integration

FORMATS = (
    "anthropic-messages",
    "openai-chat",
    "openai-responses",
    "gemini",
    "bedrock-converse",
    "bedrock-invoke",
)
#: the content type each format's answer has, whole (False) or streamed (True)
CONTENT_TYPE = {
    (False, "bedrock-converse"): "application/json",
    (True, "bedrock-converse"): "application/vnd.amazon.eventstream",
    (True, "bedrock-invoke"): "application/vnd.amazon.eventstream",
}


def expected_type(fmt: str, stream: bool) -> str:
    default = "text/event-stream" if stream else "application/json"
    return CONTENT_TYPE.get((stream, fmt), default)


def request_bytes(fmt: str, stream: bool, *, close: bool = False) -> bytes:
    path, body, key = request_for(fmt, stream)
    data = json.dumps(body).encode()
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Content-Length": str(len(data)),
    }
    if close:
        headers["Connection"] = "close"
    return head("POST", path, headers) + data


def parse_answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every HTTP/1.1 response in ``data``, framed strictly (Content-Length or chunked):
    a response cut short or bytes left over fail the test."""
    answers: list[tuple[int, dict[str, str], bytes]] = []
    pos = 0
    while pos < len(data):
        end = data.index(b"\r\n\r\n", pos)
        status_line, *lines = data[pos:end].decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ")
        assert version == "HTTP/1.1", status_line
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        pos = end + 4
        if headers.get("transfer-encoding") == "chunked":
            body = bytearray()
            while True:
                size_end = data.index(b"\r\n", pos)
                size = int(data[pos:size_end].split(b";")[0], 16)
                pos = size_end + 2
                body += data[pos : pos + size]
                assert data[pos + size : pos + size + 2] == b"\r\n", "chunk cut short"
                pos += size + 2
                if size == 0:
                    break
        else:
            length = int(headers["content-length"])
            body = bytearray(data[pos : pos + length])
            assert len(body) == length, "body cut short"
            pos += length
        answers.append((int(status), headers, bytes(body)))
    return answers


async def pipeline(url: str, requests: Sequence[bytes], *, half_close: bool) -> bytes:
    """Write every request at once, then (``half_close``) shut the sending side; read
    until the gateway closes the connection."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(b"".join(requests))
        await writer.drain()
        if half_close:
            writer.write_eof()
        async with asyncio.timeout(GUARD_S):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize("half_close", [False, True], ids=["connection-close", "half-closed"])
async def test_pipelined_requests_are_each_answered_in_order_and_charged_once(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, half_close: bool
) -> None:
    calls = [(fmt, stream) for fmt in FORMATS for stream in (False, True)]
    requests = [request_bytes(fmt, stream) for fmt, stream in calls]
    if not half_close:  # the last says it is the last; else the end of input says so
        calls.append(("openai-chat", False))
        requests.append(request_bytes("openai-chat", False, close=True))
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with GatewayServer(stack.gateway) as server:
            received = await pipeline(server.url, requests, half_close=half_close)
        answers = parse_answers(received)
        assert [a[0] for a in answers] == [200] * len(calls)
        # in the order asked: each answer is its own request's format
        got = [a[1]["content-type"].split(";")[0] for a in answers]
        assert got == [expected_type(fmt, stream) for fmt, stream in calls]
        assert (await stack.upstream_stats())["requests"] == len(calls)
        events = await stack.events(len(calls) + 1, timeout=5)
        assert len(events) == len(answers)  # every answered call charged, nothing else
        assert all(e["usage_source"] == "reported" for e in events), events
        assert len({e["event_id"] for e in events}) == len(events)
        assert sorted(e["api"] for e in events) == sorted(fmt for fmt, _ in calls)

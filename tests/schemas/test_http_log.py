"""runtime/http_log.py (issue 32): the malformed-request tally logs at most one line per
interval (a stepped clock, no wall clock), redact() hides every credential shape, the
record factory redacts every log line and traceback, and a real aiohttp server through
the shared handler answers a malformed head 400 without echoing it and a failing handler
500 with its traceback logged redacted."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from aiohttp import web

from runtime.half_close import AnswerAfterHalfClose
from runtime.http_log import MALFORMED, MalformedRequests, install_log_redaction, redact

SECRET = "tok-0123456789abcdef0123456789abcdef"


class StepClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_tally_logs_one_line_per_interval_and_counts_every_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = StepClock()
    tally = MalformedRequests(interval_s=60.0, clock=clock, logger=logging.getLogger("t.tally"))
    with caplog.at_level(logging.WARNING, logger="t.tally"):
        for _ in range(500):
            tally.note("BadStatusLine", "127.0.0.1")
            clock.now += 0.01
        assert len(caplog.records) == 1  # the first, at once
        assert "BadStatusLine" in caplog.records[0].getMessage()
        clock.now += 60
        tally.note("LineTooLong", "10.0.0.1")  # the interval is over: its summary first
        assert len(caplog.records) == 2
        assert "refused 499 more" in caplog.records[1].getMessage()
        assert "BadStatusLine 499" in caplog.records[1].getMessage()
        clock.now += 61
        tally.flush()  # the timer's call: the last interval's summary
        assert len(caplog.records) == 3
        assert "refused 1 more" in caplog.records[2].getMessage()
        assert "LineTooLong 1" in caplog.records[2].getMessage()
        clock.now += 61
        tally.flush()  # nothing counted since: no line, and the next refusal logs at once
        assert len(caplog.records) == 3
        tally.note("BadHttpMethod", None)
        assert len(caplog.records) == 4
    assert tally.totals == {"BadStatusLine": 500, "LineTooLong": 1, "BadHttpMethod": 1}


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {SECRET}",
        f"b'GET / HTTP/1.1\\nHost: x\\nauthorization: Bearer {SECRET}\\n\\n'",
        f"{{'x-api-key': '{SECRET}', 'Host': 'x'}}",
        f"<CIMultiDictProxy('X-Goog-Api-Key': '{SECRET}')>",
        f"b'\\nx-api-key: {SECRET}\\r\\n'",
        f"GET /v1beta/models/m:generateContent?alt=sse&key={SECRET} HTTP/1.1",
        f"api-key={SECRET}",
        f"Proxy-Authorization: Basic {SECRET}",
        f"Cookie: session={SECRET}",
        f"the key sb-{SECRET} was refused",
        f"token {SECRET!r} in basic {SECRET}".replace("token", "Bearer"),
    ],
)
def test_redact_hides_every_credential_shape(text: str) -> None:
    out = redact(text)
    assert SECRET not in out
    assert "[redacted]" in out


def test_redact_keeps_what_is_no_credential() -> None:
    text = "POST /v1/check 400 from 127.0.0.1: invalid_json (api-key-id: k1)"
    assert redact(text) == text


def test_every_log_record_is_rendered_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    log = logging.getLogger("t.redaction")
    with caplog.at_level(logging.INFO, logger="t.redaction"):
        log.info("headers %r", {"Authorization": f"Bearer {SECRET}"})
        try:
            raise ValueError(f"b'GET / HTTP/1.1\\nAuthorization: Bearer {SECRET}\\n'")
        except ValueError:
            log.exception("failed")
    assert SECRET not in caplog.text
    assert caplog.text.count("[redacted]") >= 2
    # rendered once: a formatter that re-wraps the args (the worker's, mode's) formats it
    from mode.utils.logging import ExtensionFormatter

    assert SECRET not in ExtensionFormatter().format(caplog.records[0])


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def test_the_shared_server_answers_malformed_heads_400_and_logs_no_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail(request: web.Request) -> web.Response:
        raise RuntimeError(f"upstream said no to {request.headers.get('Authorization')}")

    app = web.Application()
    app.router.add_get("/fail", fail)
    runner = AnswerAfterHalfClose(app)  # aiohttp's access log would be on by default
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    before = sum(MALFORMED.totals.values())
    heads = [
        f"GET / HTTP/1.1\nHost: x\nAuthorization: Bearer {SECRET}\n\n".encode(),
        f"GET / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\x01\r\n\r\n".encode(),
        f"GE\x00T / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\n\r\n".encode(),
        f"GET /?key={SECRET}{'q' * 9000} HTTP/1.1\r\n\r\n".encode(),
    ]
    with caplog.at_level(logging.DEBUG):
        for head in heads:
            answer = await asyncio.to_thread(_exchange, port, head)
            assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400")
            assert b"malformed request (" in answer
            assert SECRET.encode() not in answer
        failed = await asyncio.to_thread(
            _exchange,
            port,
            f"GET /fail HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\n\r\n".encode(),
        )
        await runner.cleanup()
    assert failed.startswith(b"HTTP/1.1 500")
    assert sum(MALFORMED.totals.values()) - before == len(heads)
    assert SECRET not in caplog.text
    assert "Error handling request" in caplog.text  # the 500: logged, redacted
    assert "RuntimeError: upstream said no to Bearer [redacted]" in caplog.text
    assert not [r for r in caplog.records if r.name == "aiohttp.access"]

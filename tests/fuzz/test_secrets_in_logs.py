"""No secret in any log after a hostile run (issue 32): each server, run as its command runs
it (the sidecar, the HTTP ingest, the gateway in front of the fake provider, the aggregator
worker's pages), gets malformed requests that carry its credentials (bare-LF line endings,
control bytes in headers, oversize heads, invalid methods, pipelined junk: ``tests.fuzz.kit``'s
``malformed_heads``, and hypothesis-spliced variants of them) over a raw socket. Then every
log file of the run and each process's captured output is read: no credential appears; the
malformed requests are logged in at most one line per ``INTERVAL_S`` (plus the first), with
no traceback and no "Error handling request"; each was answered 400 and counted in
``spendbus_http_malformed_requests_total``; and the server still serves."""

from __future__ import annotations

import re
import secrets
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings

from runtime.http_log import INTERVAL_S
from schemas.topics import Topics
from spendbus.stack.broker_probe import free_port, free_ports
from tests.fuzz.kit import (
    EXAMPLES,
    FUZZ,
    GUARD_S,
    RawRequest,
    answer_of,
    command,
    gateway_config_file,
    get,
    malformed_heads,
    malformed_requests,
)
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

FEWER = settings(FUZZ, max_examples=max(20, EXAMPLES // 4))
REFUSED = b"malformed request ("
#: a log line of the malformed-request tally (the first of an interval, or its summary)
TALLY_LINE = re.compile(r"malformed HTTP request")


class HostileRun:
    """Malformed requests sent to one server, and what it answered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = 0
        self.refused = 0
        self.started = time.monotonic()

    def send(self, data: bytes) -> None:
        answer = answer_of(self.port, data)
        self.sent += 1
        # aiohttp's own answer quoted the head back; ours names the parser's error only
        assert b"Bearer" not in answer.partition(b"\r\n\r\n")[2], answer[:400]
        for status in re.findall(rb"HTTP/1\.[01] (\d{3})", answer):
            assert int(status) < 500, answer[:400]
        self.refused += answer.count(REFUSED)

    def run(self, credentials: Sequence[tuple[str, str]], path: str) -> None:
        for data in malformed_heads(credentials, path):
            self.send(data)

        @FEWER
        @given(malformed_requests(credentials))
        def one(request: RawRequest) -> None:
            self.send(request.data)

        one()
        assert self.refused >= len(malformed_heads(credentials, path)) // 2

    def check_metric(self, metrics: str) -> None:
        counted = sum(
            float(v)
            for v in re.findall(
                r'^spendbus_http_malformed_requests_total\{reason="\w+"\} (\S+)$', metrics, re.M
            )
        )
        # every refusal the client saw is counted; nothing is counted twice
        assert self.refused <= counted <= self.sent, (self.refused, counted, self.sent)

    def check_logs(self, root: Path, captured: Sequence[Path], values: Sequence[str]) -> None:
        """Every ``*.log`` under ``root`` and each of ``captured``: no secret, a bounded tally."""
        files = sorted({*root.rglob("*.log"), *captured})
        assert files
        elapsed = time.monotonic() - self.started
        tally = 0
        for file in files:
            text = file.read_bytes().decode("utf-8", "replace")
            for value in values:
                assert value not in text, f"a secret in {file}"
                assert value[8:40] not in text, f"part of a secret in {file}"
            assert "Error handling request" not in text, file
            lines = [line for line in text.splitlines() if TALLY_LINE.search(line)]
            assert all("Traceback" not in line for line in lines)
            tally += len(lines)
        # the first refusal at once, then at most one line per interval (plus the one
        # that may close the last interval); never one per request
        assert 1 <= tally <= 2 + int(elapsed // INTERVAL_S), (tally, elapsed)
        assert tally < self.refused


def _metrics(url: str, token: str | None = None) -> str:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read().decode()  # type: ignore[no-any-return]  # urlopen's response is Any in typeshed


def _credentials(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}"), ("x-api-key", token)]


def test_the_sidecar_logs_no_token_after_hostile_requests(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    token = secrets.token_urlsafe(32)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "sidecar.log"
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_ENFORCER_TOKEN": token,
        "SPENDBUS_HOME": str(tmp_path / "home"),
    }
    run = HostileRun(port)
    with command(["enforcer", "serve", "--port", str(port)], env, f"{url}/readyz", log):
        run.run(_credentials(token), "/v1/check")
        assert get(f"{url}/healthz") == 200
        run.check_metric(_metrics(f"{url}/metrics", token))
    run.check_logs(tmp_path, [log], [token])


def test_the_http_ingest_logs_no_token_after_hostile_requests(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "ingest.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "ingest.log"
    args = ["ingest", "serve", "--port", str(port), "--token-file", str(token_file)]
    args += ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    args += ["--spool-dir", str(tmp_path / "spool")]
    run = HostileRun(port)
    with command(args, {"SPENDBUS_HOME": str(tmp_path / "home")}, f"{url}/healthz", log):
        run.run(_credentials(token), "/v1/usage")
        assert get(f"{url}/healthz") == 200
        run.check_metric(_metrics(f"{url}/metrics", token))
    run.check_logs(tmp_path, [log], [token])


def test_the_gateway_logs_no_key_after_hostile_requests(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    gateway_port, upstream_port = free_ports(2)
    upstream = f"http://127.0.0.1:{upstream_port}"
    keys = {api: "sb-" + secrets.token_urlsafe(32) for api in ("openai", "anthropic", "gemini")}
    provider_keys = {api: f"real-{api}-{secrets.token_hex(16)}" for api in keys}
    config_file = gateway_config_file(
        tmp_path,
        gateway_id="hostile",
        port=gateway_port,
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        upstream=upstream,
        keys=keys,
        provider_keys=provider_keys,
        # its own access log on too: the requests that parse get a line, with no key
        access_log=True,
    )
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    url = f"http://127.0.0.1:{gateway_port}"
    logs = [tmp_path / "upstream.log", tmp_path / "gateway.log"]
    run = HostileRun(gateway_port)
    credentials = [
        ("Authorization", f"Bearer {keys['openai']}"),
        ("x-api-key", keys["anthropic"]),
        ("x-goog-api-key", keys["gemini"]),
    ]
    with (
        command(
            ["fake-upstream", "--port", str(upstream_port)], env, f"{upstream}/healthz", logs[0]
        ),
        command(["gateway", "run", "--config", str(config_file)], env, f"{url}/healthz", logs[1]),
    ):
        run.run(credentials, "/v1/chat/completions")
        assert get(f"{url}/healthz") == 200
        run.check_metric(_metrics(f"{url}/metrics"))
    run.check_logs(tmp_path, logs, [*keys.values(), *provider_keys.values()])
    # the access log was on: its lines are among those read for keys
    assert "spendbus.gateway.access method=GET path=/healthz status=200" in logs[1].read_text()


def test_the_worker_pages_log_no_token_after_hostile_requests(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    pipeline = Pipeline(kafka_bootstrap, topics, tmp_path, clickhouse_dsn)
    pipeline.apply_reference()
    worker = pipeline.worker
    worker.start(timeout=180)
    try:
        assert worker.token_file is not None
        token = worker.token_file.read_text().strip()
        run = HostileRun(worker.web_port)
        run.run(_credentials(token), "/sql")
        base = f"http://127.0.0.1:{worker.web_port}"
        assert get(f"{base}/stats") == 200
        run.check_metric(_metrics(f"{base}/metrics", token))
    finally:
        worker.stop()
    run.check_logs(tmp_path, [worker.log_file], [token])

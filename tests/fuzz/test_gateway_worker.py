"""The fuzz suite (issue 21), second half: the gateway (``spendbus gateway run`` against
``spendbus fake-upstream``) and the aggregator worker's pages (``spendbus aggregator run``:
/stats, /metrics, /sql), each run as its command runs it, get ``SPENDBUS_FUZZ_EXAMPLES``
hostile requests each (the strategies of ``tests.fuzz.kit``). No answer is >= 500, the server is
alive and answers after, its resident memory grew less than RSS_GROWTH_BOUND, and (gateway)
every call the provider served is charged: its usage event is on usage.raw."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from schemas.topics import Topics
from spendbus.stack.broker_probe import free_ports
from tests.fuzz.kit import (
    EXAMPLES,
    FUZZ,
    GUARD_S,
    RSS_GROWTH_BOUND,
    RawRequest,
    command,
    gateway_config_file,
    get,
    requests,
    rss,
    send,
    usage_events,
)
from tests.pipeline_kit import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

#: the servers' deadlines, short so that slow senders cost little of the run
DEADLINES_S = 0.5
PROMPT = [{"role": "user", "content": "Say hello."}]
#: (path, a valid body) per metered API the gateway serves
CALLS: dict[str, tuple[str, dict[str, object]]] = {
    "openai": ("/v1/chat/completions", {"model": "gpt-4o", "messages": PROMPT, "max_tokens": 64}),
    "responses": ("/v1/responses", {"model": "gpt-4o", "input": "Say hello.", "stream": True}),
    "anthropic": (
        "/v1/messages",
        {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": PROMPT},
    ),
    "gemini": (
        "/v1beta/models/gemini-2.5-flash:generateContent",
        {"contents": [{"parts": [{"text": "Say hello."}]}]},
    ),
}
#: pass-through routes: served by the provider, never metered
NOT_METERED = ("/v1/messages/count_tokens", ":countTokens")


def _raw(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in {"Content-Type": "application/json", **headers}.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_the_gateway_survives_hostile_requests_and_charges_every_call_served(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    gateway_port, upstream_port = free_ports(2)
    upstream = f"http://127.0.0.1:{upstream_port}"
    keys = {api: "sb-" + secrets.token_urlsafe(32) for api in ("openai", "anthropic", "gemini")}
    config_file = gateway_config_file(
        tmp_path,
        gateway_id="fuzz",
        port=gateway_port,
        bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        upstream=upstream,
        keys=keys,
        header_timeout_s=DEADLINES_S,
        body_timeout_s=DEADLINES_S,
        max_body_bytes=256 * 1024,
        max_in_flight_per_key=64,
    )
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    auth = [
        {"Authorization": f"Bearer {keys['openai']}"},
        {"Authorization": f"Bearer {keys['openai']}"},
        {"x-api-key": keys["anthropic"], "anthropic-version": "2023-06-01"},
        {"x-goog-api-key": keys["gemini"]},
        {"Authorization": "Bearer sb-wrong"},
        {},
    ]
    paths = [path for path, _ in CALLS.values()] + ["/healthz", "/metrics", "/v1/spend"]
    shapes: list[dict[str, object]] = [body for _, body in CALLS.values()]
    statuses: list[int | None] = []
    url = f"http://127.0.0.1:{gateway_port}"
    with command(
        ["fake-upstream", "--port", str(upstream_port), "--seed", "21"],
        env,
        f"{upstream}/healthz",
        tmp_path / "upstream.log",
    ):
        with command(
            ["gateway", "run", "--config", str(config_file)],
            env,
            f"{url}/healthz",
            tmp_path / "gateway.log",
        ) as pid:
            before = rss(pid)

            @FUZZ
            @given(requests(paths, shapes, auth))
            def one(request: RawRequest) -> None:
                status = send(gateway_port, request)
                statuses.append(status)
                assert status is None or status < 500, f"{status} for {request.data[:300]!r}"

            one()
            # valid calls after the hostile ones, half-closed after sending as some clients
            # do: each is answered and charged
            headers = {"openai": auth[0], "responses": auth[0], "anthropic": auth[2]}
            headers["gemini"] = auth[3]
            for api, (path, body) in CALLS.items():
                request = RawRequest(_raw(path, json.dumps(body).encode(), headers[api]))
                assert send(gateway_port, request) == 200, api
            assert get(f"{url}/healthz") == 200
            assert rss(pid) - before < RSS_GROWTH_BOUND
        with urllib.request.urlopen(f"{upstream}/stats", timeout=10) as answer:
            served: dict[str, Any] = json.loads(answer.read())["routes"]
    assert len(statuses) >= EXAMPLES
    metered = sum(
        s["requests"]
        for route, s in served.items()
        if not any(route.endswith(p) for p in NOT_METERED) and route != "/v1/realtime"
    )
    events = asyncio.run(usage_events(kafka_bootstrap, topics.usage_raw))
    charged = [e for e in events if e["outcome"] != "refused"]
    assert metered >= len(CALLS)
    assert len(charged) >= metered, (len(charged), metered, served)


@pytest.fixture
def worker_pipeline(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> Iterator[Pipeline]:
    """A worker as ``spendbus aggregator run`` runs it, with a short /sql body deadline."""
    p = Pipeline(
        kafka_bootstrap,
        topics,
        tmp_path,
        clickhouse_dsn,
        worker_env={"SPENDBUS_WEB_BODY_TIMEOUT": str(DEADLINES_S)},
    )
    p.apply_reference()
    p.worker.start(timeout=180)
    try:
        yield p
    finally:
        p.worker.stop()


def _stalled_answer(port: int, data: bytes) -> bytes:
    """Send ``data``, then nothing more; everything the server writes until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
    return answer


def test_the_worker_pages_survive_hostile_requests(worker_pipeline: Pipeline) -> None:
    worker = worker_pipeline.worker
    port = worker.web_port
    assert worker.token_file is not None
    token = worker.token_file.read_text().strip()
    auth = [
        {"Authorization": f"Bearer {token}"},
        {"Authorization": f"Bearer {token}"},
        {"Authorization": "Bearer wrong"},
        {},
    ]
    shapes: list[dict[str, object]] = [
        {"sql": "SELECT count() FROM usage_events"},
        {"sql": "SELECT model, sum(cost_nanos) FROM usage_events GROUP BY model"},
        {"sql": "SHOW TABLES"},
    ]
    statuses: list[int | None] = []
    pid = worker.pid()
    assert pid is not None
    before = rss(pid)

    @FUZZ
    @given(requests(["/sql", "/stats", "/metrics", "/"], shapes, auth))
    def one(request: RawRequest) -> None:
        status = send(port, request)
        statuses.append(status)
        assert status is None or status < 500, f"{status} for {request.data[:300]!r}"

    one()
    # a /sql body that never ends: 408 after the deadline (it held the handler for good)
    slow = _raw("/sql", b'{"sql": "SELECT 1"}', auth[0])[:-5]
    assert _stalled_answer(port, slow).startswith(b"HTTP/1.1 408")
    # it still answers, and still runs a query
    body = json.dumps(shapes[0]).encode()
    request = RawRequest(_raw("/sql", body, auth[0]), half_close=False)
    assert send(port, request) == 200
    assert get(f"http://127.0.0.1:{port}/stats") == 200
    assert worker.pid() == pid
    assert rss(pid) - before < RSS_GROWTH_BOUND
    assert len(statuses) >= EXAMPLES

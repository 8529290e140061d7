"""The fuzz suite (issue 21): the sidecar and the HTTP ingest, each run as its command runs
it, get ``SPENDBUS_FUZZ_EXAMPLES`` hostile requests each (malformed JSON, deep nesting,
binary bodies, wrong methods and content types, huge and many headers, wrong lengths, slow
senders). No answer is >= 500, the server is alive and answers after, its resident memory
grew less than RSS_GROWTH_BOUND, and (ingest) every accepted event is on usage.raw."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from hypothesis import given

from schemas.topics import Topics
from schemas.usage import new_usage_event, usage_event_to_json
from spendbus.stack.broker_probe import free_port
from tests.fuzz.kit import (
    EXAMPLES,
    FUZZ,
    GUARD_S,
    RSS_GROWTH_BOUND,
    RawRequest,
    command,
    get,
    requests,
    rss,
    send,
)

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(GUARD_S)]

TOKEN = "fuzz-token-0123456789abcdef0123456789"
AUTH = [
    {"Authorization": f"Bearer {TOKEN}"},
    {"Authorization": f"Bearer {TOKEN}"},
    {"Authorization": "Bearer wrong"},
    {},
]
#: the servers' deadlines, short so that slow senders cost little of the run
DEADLINES_S = 0.5


def check_answers(port: int, statuses: list[int | None], request: RawRequest) -> None:
    status = send(port, request)
    statuses.append(status)
    assert status is None or status < 500, f"{status} for {request.data[:300]!r}"


def test_the_sidecar_survives_hostile_requests(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    ctx = {
        "org_id": "acme",
        "secret_id": "sk-1",
        "model": "claude-sonnet-4-5",
        "input_tokens": 100,
        "max_output_tokens": 100,
    }
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_ENFORCER_TOKEN": TOKEN,
        "SPENDBUS_HOME": str(tmp_path / "home"),
    }
    url = f"http://127.0.0.1:{port}"
    statuses: list[int | None] = []
    with command(
        ["enforcer", "serve", "--port", str(port), "--max-in-flight-per-key", "64"],
        env,
        f"{url}/readyz",
        tmp_path / "sidecar.log",
    ) as pid:
        before = rss(pid)

        @FUZZ
        @given(
            requests(
                ["/v1/check", "/v1/settle", "/v1/usage", "/healthz", "/metrics"],
                [ctx, {"hold_id": 1, "release": True}, {**ctx, "reserve": False}],
                AUTH,
            )
        )
        def one(request: RawRequest) -> None:
            check_answers(port, statuses, request)

        one()
        assert get(f"{url}/healthz") == 200
        # and it still decides: a valid check after the hostile ones
        body = json.dumps(ctx).encode()
        head = (
            f"POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        assert send(port, RawRequest(head.encode() + body, half_close=False)) == 200
        assert rss(pid) - before < RSS_GROWTH_BOUND
    assert len(statuses) >= EXAMPLES


def test_the_http_ingest_survives_hostile_requests_and_loses_no_accepted_event(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    token_file = tmp_path / "ingest.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    event = usage_event_to_json(
        new_usage_event(
            provider="openai",
            api="openai-chat",
            model="gpt-4o",
            secret_id="sk-1",
            org_id="acme",
            gateway_id="fuzz",
            input_tokens=10,
            output_tokens=5,
        )
    )
    url = f"http://127.0.0.1:{port}"
    accepted: list[int] = []
    statuses: list[int | None] = []
    args = [
        "ingest",
        "serve",
        "--port",
        str(port),
        "--token-file",
        str(token_file),
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        topics.prefix,
        "--spool-dir",
        str(tmp_path / "spool"),
        "--header-timeout",
        str(DEADLINES_S),
        "--body-timeout",
        str(DEADLINES_S),
        "--max-body-bytes",
        str(256 * 1024),
    ]
    with command(
        args, {"SPENDBUS_HOME": str(tmp_path / "home")}, f"{url}/healthz", tmp_path / "ingest.log"
    ) as pid:
        before = rss(pid)

        @FUZZ
        @given(requests(["/v1/usage", "/healthz", "/metrics"], [{"x": [event]}], AUTH))
        def one(request: RawRequest) -> None:
            check_answers(port, statuses, request)

        one()
        # valid batches between the hostile ones: each accepted one must reach usage.raw
        for i in range(20):
            batch = [{**event, "event_id": f"{i:08x}-0000-4000-8000-000000000000"}]
            body = json.dumps(batch).encode()
            head = (
                f"POST /v1/usage HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            # every other one half-closed after sending, as some clients do: still answered
            status = send(port, RawRequest(head.encode() + body, half_close=i % 2 == 0))
            assert status == 202, status
            accepted.append(i)
        assert get(f"{url}/healthz") == 200
        assert rss(pid) - before < RSS_GROWTH_BOUND
    assert len(statuses) >= EXAMPLES
    published = asyncio.run(read_all(kafka_bootstrap, topics.usage_raw))
    ids = {e for e in published}
    for i in accepted:
        assert f"{i:08x}-0000-4000-8000-000000000000" in ids


async def read_all(bootstrap: str, topic: str) -> list[str]:
    """Every event id on ``topic`` now (the ids as strings)."""
    from schemas.codec import USAGE_EVENT

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    out: list[str] = []
    try:
        empty = 0
        while empty < 4:
            batches = await consumer.getmany(timeout_ms=500)
            got: list[Any] = [m for ms in batches.values() for m in ms]
            empty = 0 if got else empty + 1
            out.extend(str(USAGE_EVENT.decode(m.value)["event_id"]) for m in got)
    finally:
        await consumer.stop()
    return out

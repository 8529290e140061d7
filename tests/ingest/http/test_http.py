"""POST /v1/usage against a real broker: auth, per-event 400s, 202 after the ack, idempotency."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ingest.http import USAGE_SCHEMA_PATH, build_app
from ingest.publisher import PublisherConfig, UsagePublisher
from ingest.receive import server_options
from schemas.topics import Topics, usage_raw_key
from tests.ingest.http.kit import DEAD_BOOTSTRAP, TOKEN, consume, json_event
from tests.slow_sender import head, send_then_stall

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parents[3]


async def _client(
    publisher: UsagePublisher, **options: Any
) -> TestClient[web.Request, web.Application]:
    client = TestClient(TestServer(build_app(publisher, token=TOKEN, **options)))
    await client.start_server()
    return client


@pytest.fixture
async def publisher(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> AsyncIterator[UsagePublisher]:
    pub = UsagePublisher(
        PublisherConfig(
            bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, spool_dir=tmp_path, linger_ms=1
        )
    )
    await pub.start()
    yield pub
    await pub.stop()


@pytest.fixture
async def client(
    publisher: UsagePublisher,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    client = await _client(publisher, max_body_bytes=256 * 1024, max_events=100)
    yield client
    await client.close()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer"},
    ],
)
async def test_requests_without_the_token_are_refused(
    client: TestClient[web.Request, web.Application], headers: dict[str, str]
) -> None:
    response = await client.post("/v1/usage", json=[json_event()], headers=headers)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_bad_token_counts_name_the_event_and_field_and_nothing_is_published(
    client: TestClient[web.Request, web.Application], publisher: UsagePublisher
) -> None:
    good = json_event(0)
    negative = json_event(1, input_tokens=-5)
    text = json_event(2, output_tokens="12")
    floating = json_event(3, cache_read_tokens=1.5)
    missing = json_event(4)
    del missing["model"]
    huge = json_event(5, output_tokens=10**30)
    response = await client.post(
        "/v1/usage", json=[good, negative, text, floating, missing, huge], headers=AUTH
    )
    assert response.status == 400
    body = await response.json()
    assert "none of the request was published" in body["error"]
    problems = {(p["index"], p["event_id"], p["field"]) for p in body["events"]}
    assert problems == {
        (1, negative["event_id"], "input_tokens"),
        (2, text["event_id"], "output_tokens"),
        (3, floating["event_id"], "cache_read_tokens"),
        (4, missing["event_id"], "model"),
        (5, huge["event_id"], "output_tokens"),
    }
    reasons = {p["index"]: p["reason"] for p in body["events"]}
    assert reasons[1] == "must be >= 0, got -5"
    assert reasons[2] == "must be an integer, got '12'"
    assert reasons[3] == "must be an integer, got 1.5"
    assert reasons[4] == "required"
    assert "exceeds the sanity bound" in reasons[5]
    assert publisher.spooled_bytes == 0
    assert publisher.metrics.registry.get_sample_value("spendbus_ingest_spooled_events_total") == 0


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "invalid JSON"),
        (b'{"event_id": "x"}', 400, "JSON array"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "invalid JSON"),
        (b"[NaN]", 400, "<event>"),
        (json.dumps([json_event(i) for i in range(101)]).encode(), 413, "at most 100"),
        (b"[" + b" " * 300_000 + b"]", 413, "is over the 262144-byte limit"),
    ],
)
async def test_malformed_bodies_get_a_clear_answer(
    client: TestClient[web.Request, web.Application], body: bytes, status: int, error: str
) -> None:
    response = await client.post(
        "/v1/usage", data=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status == status
    text = await response.text()
    assert error in text


async def test_accepted_after_the_broker_acknowledged_and_idempotent_by_event_id(
    client: TestClient[web.Request, web.Application],
    publisher: UsagePublisher,
    kafka_bootstrap: str,
    topics: Topics,
) -> None:
    events = [json_event(i, org=("acme", "globex")[i % 2]) for i in range(50)]
    response = await client.post("/v1/usage", json=events, headers=AUTH)
    assert response.status == 202
    assert await response.json() == {"accepted": 50}
    assert publisher.spooled_bytes == 0  # acknowledged before the answer

    # a client that did not see the answer re-posts: same ids again, counted once downstream
    again = await client.post("/v1/usage", json=events[:10], headers=AUTH)
    assert again.status == 202

    got = await consume(kafka_bootstrap, topics.usage_raw, 60)
    ids = [e["event_id"] for _, e in got]
    assert len(ids) == 60
    assert set(ids) == {e["event_id"] for e in events}
    assert all(key == usage_raw_key(e["org_id"]) for key, e in got)


async def test_the_json_schema_of_the_body_is_served_as_shipped(
    client: TestClient[web.Request, web.Application],
) -> None:
    """GET /v1/usage/schema answers, without a token, the file the package ships."""
    response = await client.get(USAGE_SCHEMA_PATH)
    assert response.status == 200
    assert response.content_type == "application/schema+json"
    shipped = (ROOT / "schemas" / "json" / "usage_ingest_body.schema.json").read_bytes()
    assert await response.read() == shipped
    schema = json.loads(shipped)
    assert schema["$defs"]["UsageEvent"]["required"][:2] == ["event_id", "occurred_at"]
    # and the body the tests post is one the schema describes: every field of it known
    assert set(json_event()) <= set(schema["$defs"]["UsageEvent"]["properties"])


async def test_health_and_metrics(client: TestClient[web.Request, web.Application]) -> None:
    health = await client.get("/healthz")
    assert health.status == 200
    assert (await health.json())["status"] == "ok"
    await client.post("/v1/usage", json=[json_event(input_tokens=-1)], headers=AUTH)
    metrics = await (await client.get("/metrics")).text()
    assert 'spendbus_ingest_http_requests_total{code="400"} 1.0' in metrics
    assert 'spendbus_ingest_rejected_events_total{field="input_tokens"} 1.0' in metrics
    assert "spendbus_ingest_spool_bytes" in metrics


async def test_unknown_field_names_are_no_label_values(
    client: TestClient[web.Request, web.Application],
) -> None:
    """A field the UsageEvent does not have is counted as ``other``: a client sending a new
    name per request would otherwise make a new time series per request (issue 21)."""
    for i in range(3):
        response = await client.post(
            "/v1/usage", json=[{**json_event(), f"client_chosen_{i}": 1}], headers=AUTH
        )
        assert response.status == 400
        assert (await response.json())["events"][0]["field"] == f"client_chosen_{i}"
    metrics = await (await client.get("/metrics")).text()
    assert 'spendbus_ingest_rejected_events_total{field="other"} 3.0' in metrics
    assert "client_chosen" not in metrics


async def test_unreachable_broker_answers_503_and_keeps_the_events(tmp_path: Path) -> None:
    pub = UsagePublisher(PublisherConfig(bootstrap=DEAD_BOOTSTRAP, spool_dir=tmp_path))
    await pub.start()
    client = await _client(pub, ack_timeout_s=0.3)
    try:
        response = await client.post("/v1/usage", json=[json_event()], headers=AUTH)
        assert response.status == 503
        assert response.headers["Retry-After"]
        body = await response.json()
        assert body["spooled"] == 1
        assert "re-posting" in body["error"]
        assert pub.spooled_bytes > 0
    finally:
        await client.close()
        await pub.stop(timeout=0.1)


async def test_a_slow_sender_gets_408_or_is_disconnected_and_nothing_is_published(
    publisher: UsagePublisher,
) -> None:
    app = build_app(publisher, token=TOKEN, max_body_bytes=64 * 1024, body_timeout_s=0.2)
    # what `ingest serve` runs the app with (run: web.run_app(..., **server_options(...)))
    server = TestServer(app)
    await server.start_server(**server_options(0.2))  # runner keywords go here, not to __init__
    async with TestClient(server) as client:
        url = str(client.make_url("/"))
        assert await send_then_stall(url, b"POST /v1/usage HTTP/1.1\r\nHost: x\r\n") == b""
        slow = head("POST", "/v1/usage", {**AUTH, "Content-Length": "500"}) + b"[{"
        answer = await send_then_stall(url, slow)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"not received within 0.2 s" in answer
        huge = head("POST", "/v1/usage", {**AUTH, "Content-Length": str(10**9)})
        answer = await send_then_stall(url, huge)
        assert answer.startswith(b"HTTP/1.1 413") and b"over the 65536-byte limit" in answer
        assert (await client.post("/v1/usage", json=[], headers=AUTH)).status == 202
    assert publisher.metrics.registry.get_sample_value("spendbus_ingest_spooled_events_total") == 0

"""The sidecar's HTTP adapter over an enforcer fed in memory (the broker tests are separate)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from enforcer_testkit import NOW, budget, loaded_enforcer, verdict

from enforcer import create_app

USD = 1_000_000_000
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ORG = budget("org", limit_usd=1)
CTX = {
    "org_id": "acme",
    "secret_id": "sk-1",
    "model": "claude-sonnet-4-5",
    "input_tokens": 1000,
    "max_output_tokens": 1000,
}


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient, Any]]:  # type: ignore[type-arg]
    e, _clock = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=USD // 2)])
    async with TestClient(TestServer(create_app(e, token=TOKEN))) as c:
        yield c, e


async def test_bearer_token_is_required_on_v1(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        r = await c.post("/v1/check", json=CTX, headers=headers)
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = await c.get("/v1/usage", params={"org_id": "acme", "secret_id": "s"})
    assert r.status == 401
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await c.get(path)).status == 200


async def test_check_reserve_settle(client) -> None:  # type: ignore[no-untyped-def]
    c, e = client
    r = await c.post("/v1/check", json=CTX, headers=AUTH)
    assert r.status == 200
    d = await r.json()
    assert d["allowed"] and d["decision"] == "allowed" and d["status"] == 200
    assert isinstance(d["hold_id"], int) and "counters" not in d
    assert d["usage_fields"] == {
        "outcome": "allowed",
        "decision": "allowed",
        "decision_budget_id": None,
    }
    assert len(e.holds) == 1
    settle = {
        "hold_id": d["hold_id"],
        "usage": {
            "model": "claude-sonnet-4-5",
            "occurred_at": "2026-11-30T12:00:01Z",
            "input_tokens": 10,
            "output_tokens": 10,
        },
    }
    r = await c.post("/v1/settle", json=settle, headers=AUTH)
    assert (await r.json()) == {"settled": True}
    assert e.holds.held_nanos == 10 * 3_000 + 10 * 15_000
    r = await c.post("/v1/settle", json=settle, headers=AUTH)
    assert (await r.json()) == {"settled": False}

    r = await c.post("/v1/check?counters=1", json={**CTX, "reserve": False}, headers=AUTH)
    d = await r.json()
    assert d["hold_id"] is None and d["counters"][0]["spent_nanos"] == USD // 2
    r = await c.post("/v1/check", json=CTX, headers=AUTH)
    hold = (await r.json())["hold_id"]
    r = await c.post("/v1/settle", json={"hold_id": hold, "release": True}, headers=AUTH)
    assert (await r.json()) == {"settled": False, "released": True}


async def test_refusal_answer_carries_what_the_proxy_renders(client) -> None:  # type: ignore[no-untyped-def]
    c, e = client
    e.state.apply_verdict(
        verdict(ORG, ["acme"])["counter_key"], verdict(ORG, ["acme"], spent_nanos=USD, seq=2)
    )
    d = await (await c.post("/v1/check", json=CTX, headers=AUTH)).json()
    assert not d["allowed"] and d["status"] == 402 and d["decision"] == "budget_exceeded"
    assert d["body"]["error"] == "budget_exceeded" and d["over_budget"]
    assert ["Retry-After", str(12 * 3600)] in d["headers"]
    assert d["exceeded_budgets"] == ["org"] and "published" not in d  # no publisher here


async def test_bad_requests_are_400(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    cases: list[tuple[str, Any]] = [
        ("/v1/check", {"org_id": "acme"}),
        ("/v1/check", {**CTX, "org_id": "x" * 600}),
        ("/v1/check", {**CTX, "surprise": 1}),
        ("/v1/check", {**CTX, "reserve": "yes"}),
        ("/v1/check", [1, 2]),
        ("/v1/settle", {"hold_id": "1"}),
        ("/v1/settle", {"hold_id": 1}),
        ("/v1/settle", {"hold_id": 1, "usage": {"model": "m", "input_tokens": -1}}),
        ("/v1/settle", {"hold_id": 1, "usage": {"model": "m", "occurred_at": "yesterday"}}),
    ]
    for path, body in cases:
        r = await c.post(path, json=body, headers=AUTH)
        assert r.status == 400, (path, body, await r.text())
    r = await c.post("/v1/check", data=b"{not json", headers=AUTH)
    assert r.status == 400 and (await r.json())["error"] == "invalid_json"


async def test_usage_is_the_counters_of_the_ctx(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    r = await c.get(
        "/v1/usage",
        params=[("org_id", "acme"), ("secret_id", "s"), ("group", "eng"), ("tag.team", "x")],
        headers=AUTH,
    )
    body = await r.json()
    assert r.status == 200 and body["ready"] and not body["stale"]
    [row] = body["counters"]
    assert row["budget_id"] == "org" and row["spent_nanos"] == USD // 2
    assert row["limit_nanos"] == USD and row["period"] == "m:2026-11" and row["state"] == "ok"
    assert row["as_of"] == NOW.isoformat().replace("+00:00", "Z")


async def test_readyz_and_metrics(client) -> None:  # type: ignore[no-untyped-def]
    c, e = client
    r = await c.get("/readyz")
    assert r.status == 200 and (await r.json())["counters"] == 1
    await c.post("/v1/check", json=CTX, headers=AUTH)
    text = await (await c.get("/metrics")).text()
    assert 'spendbus_enforcer_checks_total{budget="org",outcome="allowed"} 1.0' in text
    assert "spendbus_enforcer_holds_outstanding 1.0" in text
    assert "spendbus_enforcer_verdict_staleness_seconds 0.0" in text
    e.state.ready = False
    r = await c.get("/readyz")
    assert r.status == 503 and (await r.json())["ready"] is False


async def test_no_token_configured_means_open_on_loopback() -> None:
    e, _ = loaded_enforcer([ORG])
    async with TestClient(TestServer(create_app(e))) as c:
        assert (await c.post("/v1/check", json=CTX)).status == 200


async def test_json_the_fast_decoder_refuses_gets_the_same_answer_as_before(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    # NaN is not JSON; the stdlib reads it, and the context says which field is wrong
    body = b'{"org_id": "acme", "secret_id": "sk-1", "input_tokens": NaN}'
    r = await c.post("/v1/check", data=body, headers=AUTH)
    answer = await r.json()
    assert r.status == 400 and answer["error"] == "invalid_context"
    assert answer["field"] == "input_tokens"
    r = await c.post("/v1/check", json={**CTX, "input_tokens": 2**70}, headers=AUTH)
    answer = await r.json()
    assert r.status == 400 and answer["field"] == "input_tokens"
    r = await c.post("/v1/check", data=b"\xff\xfe", headers=AUTH)
    assert r.status == 400 and (await r.json())["error"] == "invalid_json"
    # non-ASCII ids (and U+2028, which JSON allows raw) are read as UTF-8
    r = await c.post("/v1/check", json={**CTX, "user_id": "Zoë\u2028"}, headers=AUTH)
    assert r.status == 200 and (await r.json())["allowed"] is True

"""The sidecar's HTTP adapter over an enforcer fed in memory (the broker tests are separate)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer

from enforcer import Context, Enforcer, create_app
from enforcer.sidecar import create_server
from enforcer.sidecar_json import MAX_BODY
from tests.enforcer.kit import NOW, budget, loaded_enforcer, refresh, verdict
from tests.slow_sender import head, send_then_stall

#: the ``client`` fixture: a test client of the sidecar and the enforcer behind it
Served = tuple[TestClient[web.Request, None], Enforcer]

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


class SidecarServer(BaseTestServer):
    """What ``serve`` runs (create_server: aiohttp's low-level server), as a test server."""

    def __init__(self, enforcer: Enforcer, token: str | None = None) -> None:
        super().__init__()
        self.enforcer = enforcer
        self.token = token

    async def _make_runner(self, **kwargs: Any) -> web.ServerRunner:
        return web.ServerRunner(create_server(self.enforcer, token=self.token), **kwargs)


def served(how: str, e: Enforcer, token: str | None = None) -> TestClient[web.Request, None]:
    """A client of the sidecar's routes served as ``serve`` serves them, or as an application."""
    server: BaseTestServer = (
        SidecarServer(e, token) if how == "server" else TestServer(create_app(e, token=token))
    )
    return TestClient(server)


#: every test of the routes runs against both ways of serving them
SERVED = pytest.mark.parametrize("how", ["server", "app"])


@pytest.fixture(params=["server", "app"])
async def client(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[TestClient[web.Request, None], Enforcer]]:
    e, _clock = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=USD // 2)])
    async with served(request.param, e, TOKEN) as c:
        yield c, e


async def test_bearer_token_is_required_on_v1(client: Served) -> None:
    c, _ = client
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        r = await c.post("/v1/check", json=CTX, headers=headers)
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = await c.get("/v1/usage", params={"org_id": "acme", "secret_id": "s"})
    assert r.status == 401
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await c.get(path)).status == 200


async def test_check_reserve_settle(client: Served) -> None:
    c, e = client
    r = await c.post("/v1/check", json=CTX, headers=AUTH)
    assert r.status == 200
    d = await r.json()
    assert d["allowed"] and d["decision"] == "allowed" and d["status"] == 200
    assert isinstance(d["hold_id"], str) and "counters" not in d
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
    # settled: its id is forgotten, a second settle names no hold and changes nothing
    r = await c.post("/v1/settle", json=settle, headers=AUTH)
    assert r.status == 404 and (await r.json())["error"] == "unknown_hold"
    assert e.holds.held_nanos == 10 * 3_000 + 10 * 15_000

    r = await c.post("/v1/check?counters=1", json={**CTX, "reserve": False}, headers=AUTH)
    d = await r.json()
    assert d["hold_id"] is None and d["counters"][0]["spent_nanos"] == USD // 2
    r = await c.post("/v1/check", json=CTX, headers=AUTH)
    hold = (await r.json())["hold_id"]
    r = await c.post("/v1/settle", json={"hold_id": hold, "release": True}, headers=AUTH)
    assert (await r.json()) == {"settled": False, "released": True}


async def test_refusal_answer_carries_what_the_proxy_renders(client: Served) -> None:
    c, e = client
    e.state.apply_verdict(
        verdict(ORG, ["acme"])["counter_key"], verdict(ORG, ["acme"], spent_nanos=USD, seq=2)
    )
    d = await (await c.post("/v1/check", json=CTX, headers=AUTH)).json()
    assert not d["allowed"] and d["status"] == 402 and d["decision"] == "budget_exceeded"
    assert d["body"]["error"] == "budget_exceeded" and d["over_budget"]
    assert ["Retry-After", str(12 * 3600)] in d["headers"]
    assert d["exceeded_budgets"] == ["org"] and "published" not in d  # no publisher here


async def test_bad_requests_are_400(client: Served) -> None:
    c, _ = client
    cases: list[tuple[str, Any]] = [
        ("/v1/check", {"org_id": "acme"}),
        ("/v1/check", {**CTX, "org_id": "x" * 600}),
        ("/v1/check", {**CTX, "surprise": 1}),
        ("/v1/check", {**CTX, "reserve": "yes"}),
        ("/v1/check", [1, 2]),
        ("/v1/settle", {"hold_id": 1, "release": True}),  # the enforcer's ids are not the wire's
        ("/v1/settle", {"hold_id": None, "release": True}),
        ("/v1/settle", {"hold_id": "1"}),
    ]
    for path, body in cases:
        r = await c.post(path, json=body, headers=AUTH)
        assert r.status == 400, (path, body, await r.text())
    # a usage refused leaves the hold and its id as they were: a good settle still works
    hold = (await (await c.post("/v1/check", json=CTX, headers=AUTH)).json())["hold_id"]
    for usage in ({"model": "m", "input_tokens": -1}, {"model": "m", "occurred_at": "yesterday"}):
        r = await c.post("/v1/settle", json={"hold_id": hold, "usage": usage}, headers=AUTH)
        assert r.status == 400, (usage, await r.text())
    r = await c.post("/v1/settle", json={"hold_id": hold, "release": True}, headers=AUTH)
    assert (await r.json()) == {"settled": False, "released": True}
    r = await c.post("/v1/check", data=b"{not json", headers=AUTH)
    assert r.status == 400 and (await r.json())["error"] == "invalid_json"


async def test_usage_is_the_counters_of_the_ctx(client: Served) -> None:
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


@SERVED
async def test_a_rolling_window_reopens_over_http_by_the_enforcer_clock(how: str) -> None:
    """/v1/check names when enough old buckets leave for the request to fit, and both it
    and /v1/usage drop them once they have, with no new verdict (issue 37)."""
    rolling = budget("five-hours", window="rolling:5h", limit_usd=1)
    width_s = 5 * 3600 // 48
    e, clock = loaded_enforcer(
        [rolling], [verdict(rolling, ["acme"], buckets={40: (USD // 2, 0, 0), 0: (USD // 2, 0, 0)})]
    )
    reopens = NOW + timedelta(seconds=(48 - 40) * width_s)
    async with served(how, e, TOKEN) as c:
        d = await (await c.post("/v1/check", json=CTX, headers=AUTH)).json()
        assert d["decision"] == "budget_exceeded"
        assert d["body"]["reset_at"] == reopens.isoformat().replace("+00:00", "Z")
        assert ["Retry-After", str(8 * width_s)] in d["headers"]
        clock.set(reopens)
        refresh(e)
        usage = await c.get("/v1/usage", params={"org_id": "acme", "secret_id": "s"}, headers=AUTH)
        [row] = (await usage.json())["counters"]
        assert row["spent_nanos"] == USD // 2 and row["state"] == "ok"
        d = await (await c.post("/v1/check", json=CTX, headers=AUTH)).json()
        assert d["allowed"]


async def test_readyz_and_metrics(client: Served) -> None:
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


@SERVED
async def test_no_token_configured_means_open_on_loopback(how: str) -> None:
    e, _ = loaded_enforcer([ORG])
    async with served(how, e) as c:
        assert (await c.post("/v1/check", json=CTX)).status == 200


async def test_unknown_paths_are_404_and_other_methods_405(client: Served) -> None:
    c, e = client
    for method, path in (("POST", "/v1/nope"), ("GET", "/"), ("GET", "/v1/check/")):
        r = await c.request(method, path, headers=AUTH)
        assert r.status == 404, (method, path)
    r = await c.get("/v1/check", headers=AUTH)
    assert r.status == 405 and r.headers["Allow"] == "POST"
    r = await c.post("/healthz")
    assert r.status == 405 and set(r.headers["Allow"].split(",")) == {"GET", "HEAD"}
    assert (await c.head("/healthz")).status == 200
    assert len(e.holds) == 0 and sum(e.metrics.decisions.values()) == 0


async def test_a_body_over_the_limit_is_413_and_decides_nothing(client: Served) -> None:
    c, e = client
    big = {**CTX, "model": "m" * MAX_BODY}
    r = await c.post("/v1/check", json=big, headers=AUTH)
    assert r.status == 413
    assert len(e.holds) == 0 and sum(e.metrics.decisions.values()) == 0
    assert (await c.post("/v1/check", json=CTX, headers=AUTH)).status == 200


async def test_json_the_fast_decoder_refuses_gets_the_same_answer_as_before(client: Served) -> None:
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


def test_the_short_allowed_answer_is_byte_for_byte_the_full_one() -> None:
    """decision_json (what /v1/check writes) against msgspec-encoding Decision.to_json()
    for every kind of decision: allowed with and without warnings, peeks, refusals of
    each kind, both fail modes, native style, with and without counters."""
    import random

    import msgspec

    from enforcer.sidecar_json import decision_json
    from schemas.usage import (
        ALLOWED,
        BUDGET_EXCEEDED,
        FAILED_CLOSED,
        FAILED_OPEN,
        IN_FLIGHT_BUDGET_EXCEEDED,
        JOB_BUDGET_EXCEEDED,
    )

    rng = random.Random(11)
    org = budget("org", limit_usd=10, alert_at=(0.5, 0.8))
    per_user = budget("per-user", "user", window="day", limit_nanos=60_000_000)
    job = budget("job", "session", window="total", limit_nanos=40_000_000)
    team = budget("team", "group", window="week", limit_usd=1, action="warn", alert_at=(0.5,))
    rpm = budget("rpm", "secret", window="rolling:1h", limit_requests=3)
    budgets = [org, per_user, job, team, rpm]
    seen: set[str] = set()
    shapes: set[tuple[str, bool]] = set()
    for style in ("default", "native"):
        for fail_mode in ("open", "closed"):
            verdicts = [
                verdict(org, ["acme"], spent_nanos=rng.choice([0, 6 * USD, 9 * USD])),
                verdict(team, ["acme", "red"], spent_nanos=rng.choice([0, USD // 2, USD])),
                verdict(per_user, ["acme", "ann"], spent_nanos=rng.choice([0, 60_000_000])),
                verdict(job, ["acme", "bob", "run-1"], spent_nanos=40_000_000),
            ]
            e, clock = loaded_enforcer(budgets, verdicts, refusal_style=style, fail_mode=fail_mode)
            for i in range(300):
                fields: dict[str, Any] = {"org_id": "acme", "secret_id": f"sk-{i % 4}"}
                if rng.random() < 0.7:
                    fields["user_id"] = rng.choice(["ann", "bob", " ANN "])
                if rng.random() < 0.5:
                    fields["session_id"] = rng.choice(["run-1", "run-2"])
                if rng.random() < 0.5:
                    fields["groups"] = rng.sample(["red", "blue"], rng.randrange(1, 3))
                fields["provider"] = rng.choice(["anthropic", "openai", "gemini", "bedrock", None])
                fields["model"] = "claude-sonnet-4-5"
                fields["input_tokens"] = rng.choice([10, 1000, None])
                fields["max_output_tokens"] = rng.choice([10, 1000, None])
                if rng.random() < 0.05:  # verdicts stale: the fail mode decides
                    clock.advance(3600)
                reserve = rng.random() < 0.8
                d = e.check(Context.from_mapping(fields), reserve=reserve)
                for counters in (False, True):
                    full = msgspec.json.encode(d.to_json(counters=counters))
                    assert decision_json(d, counters=counters) == full, (d, counters)
                seen.add(d.decision)
                shapes.add((d.decision, bool(d.headers)))
                if d.hold_id is not None and rng.random() < 0.5:
                    e.release(d.hold_id)
                refresh(e)
    # every kind of answer was compared, allowed ones with and without warning headers
    assert seen >= {
        ALLOWED,
        BUDGET_EXCEEDED,
        IN_FLIGHT_BUDGET_EXCEEDED,
        JOB_BUDGET_EXCEEDED,
        FAILED_OPEN,
        FAILED_CLOSED,
    }, seen
    assert {(ALLOWED, True), (ALLOWED, False)} <= shapes


async def test_check_answers_with_the_bytes_of_the_full_decision(client: Served) -> None:
    c, e = client
    import msgspec

    for query in ("", "?counters=1"):
        r = await c.post(f"/v1/check{query}", json=CTX, headers=AUTH)
        raw = await r.read()
        assert r.status == 200 and r.headers["Content-Type"] == "application/json"
        d = await r.json()
        # the same decision from the library, with the wire's hold id, encodes to the same
        # bytes
        r = await c.post(
            "/v1/settle", json={"hold_id": d["hold_id"], "release": True}, headers=AUTH
        )
        assert (await r.json())["released"]
        again = e.check(Context.from_mapping(CTX))
        expected = again.to_json(counters=bool(query))
        expected["hold_id"] = d["hold_id"]
        assert raw == msgspec.json.encode(expected)
        e.release(again.hold_id)


async def test_json_nested_too_deeply_is_400_not_500(client: Served) -> None:
    c, e = client
    deep_array = b"[" * 50_000 + b"]" * 50_000  # well inside MAX_BODY
    deep_object = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
    for path in ("/v1/check", "/v1/settle"):
        for body in (deep_array, deep_object):
            r = await c.post(path, data=body, headers=AUTH)
            answer = await r.json()
            assert r.status == 400 and answer["error"] == "invalid_json", (path, answer)
            assert "nested too deeply" in answer["message"]
    assert len(e.holds) == 0 and sum(e.metrics.decisions.values()) == 0


@SERVED
async def test_a_slow_sender_gets_408_or_is_disconnected_and_decides_nothing(how: str) -> None:
    e, _clock = loaded_enforcer(
        [ORG],
        [verdict(ORG, ["acme"], spent_nanos=USD // 2)],
        sidecar_header_timeout_s=0.2,
        sidecar_body_timeout_s=0.2,
    )
    async with served(how, e, TOKEN) as c:
        url = str(c.make_url("/"))
        # a body that never finishes: 408 with the reason, and the connection is closed
        partial = head(
            "POST",
            "/v1/check",
            {**AUTH, "Content-Type": "application/json", "Content-Length": "500"},
        )
        answer = await send_then_stall(url, partial + b'{"org_id": "acme"')
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout" in answer
        # a body declared over the limit: 413 at once, nothing read
        huge = head("POST", "/v1/check", {**AUTH, "Content-Length": str(MAX_BODY * 100)})
        answer = await send_then_stall(url, huge)
        assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer
        if how == "server":  # what `enforcer serve` runs: the head has a deadline too
            assert await send_then_stall(url, b"POST /v1/check HTTP/1.1\r\nHost: x\r\n") == b""
        assert len(e.holds) == 0 and sum(e.metrics.decisions.values()) == 0
        assert (await c.post("/v1/check", json=CTX, headers=AUTH)).status == 200


@SERVED
async def test_a_key_past_its_in_flight_limit_is_throttled_429_until_one_settles(
    how: str,
) -> None:
    """Issue 21: ``sidecar_max_in_flight_per_key`` holds of one secret at once; the next
    check is refused 429 ``throttled`` with Retry-After (nothing held, nothing decided),
    another key is not affected, and a settle, a release or an expiry frees a place."""
    e, clock = loaded_enforcer(
        [ORG],
        [verdict(ORG, ["acme"], spent_nanos=0)],
        sidecar_max_in_flight_per_key=2,
        sidecar_throttle_retry_after_s=3,
        hold_timeout_s=60,
    )
    async with served(how, e, TOKEN) as c:

        async def check(secret: str = "sk-1") -> dict[str, Any]:
            r = await c.post("/v1/check", json={**CTX, "secret_id": secret}, headers=AUTH)
            assert r.status == 200
            return await r.json()  # type: ignore[no-any-return]  # aiohttp's json() is Any

        first, second = await check(), await check()
        assert first["allowed"] and second["allowed"]
        decided = sum(e.metrics.decisions.values())
        refused = await check()
        assert not refused["allowed"] and refused["status"] == 429
        assert refused["decision"] == "throttled" and refused["reason"] == "in_flight_per_key"
        assert ["retry-after", "3"] in refused["headers"] and refused["retry_after"] == 3
        assert refused["body"]["error"] == "throttled" and refused["body"]["limit"] == 2
        assert refused["hold_id"] is None and len(e.holds) == 2
        assert sum(e.metrics.decisions.values()) == decided  # refused before deciding
        metrics = await (await c.get("/metrics")).text()
        assert "spendbus_enforcer_in_flight_per_key_refusals_total 1.0" in metrics
        assert (await check("sk-2"))["allowed"]  # per key
        # a peek holds nothing and is never throttled
        r = await c.post("/v1/check", json={**CTX, "reserve": False}, headers=AUTH)
        assert (await r.json())["allowed"]
        r = await c.post(
            "/v1/settle", json={"hold_id": first["hold_id"], "release": True}, headers=AUTH
        )
        assert (await r.json())["released"]
        third = await check()
        assert third["allowed"]
        assert not (await check())["allowed"]
        # holds the proxy never settles expire in the enforcer: the key is free again
        clock.advance(120)
        e.holds.expire(int(clock() * 1_000_000))
        assert (await check())["allowed"]


async def _answer_after_half_close(url: str, request: bytes) -> bytes:
    """Send ``request``, shut the sending side (``shutdown(SHUT_WR)``), read to the close."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), timeout=30)  # a guard against a hang
    finally:
        writer.close()


async def test_a_client_that_half_closes_after_its_check_gets_the_decision() -> None:
    # what `enforcer serve` runs; aiohttp's own server closed such a connection unanswered,
    # so a proxy that shuts its sending side never saw the decision of a reserved check
    e, _clock = loaded_enforcer([ORG], [verdict(ORG, ["acme"], spent_nanos=USD // 2)])
    async with served("server", e, TOKEN) as c:
        url = str(c.make_url("/"))
        body = json.dumps({**CTX, "reserve": False}).encode()
        headers = {**AUTH, "Content-Type": "application/json", "Content-Length": str(len(body))}
        answer = await _answer_after_half_close(url, head("POST", "/v1/check", headers) + body)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["allowed"] is True
        # a head cut short, then the end of input: nothing to answer, closed at once
        assert await _answer_after_half_close(url, b"POST /v1/check HTTP/1.1\r\n") == b""
        assert len(e.holds) == 0


@SERVED
async def test_the_sidecar_answers_what_the_policy_says(how: str, tmp_path: Path) -> None:
    """The sidecar's /v1/check goes through the same policy as the gateway: a ``deny``
    refuses with 403 policy_denied and leaves no hold; ``approval`` of a job over its
    ceiling answers 429 approval_required and asks once (the broker tests: the gateway's)."""
    rules = tmp_path / "policy.rego"
    rules.write_text(
        'package spendbus\n\ndefault decision := "allow"\n\n'
        'decision := "deny" if { input.key == "sk-denied" }\n\n'
        'decision := "approval" if { input.job_over_budget }\n'
    )
    job = budget("job", "session", window="total", limit_requests=1)
    e, _clock = loaded_enforcer([ORG, job], policy_file=rules)
    async with served(how, e, None) as c:
        denied = await (await c.post("/v1/check", json={**CTX, "secret_id": "sk-denied"})).json()
        assert (denied["status"], denied["decision"]) == (403, "policy_denied"), denied
        assert denied["hold_id"] is None and len(e.holds) == 0
        session = {**CTX, "session_id": "run-1"}
        first = await (await c.post("/v1/check", json=session)).json()
        assert first["allowed"], first
        held = await (await c.post("/v1/check", json=session)).json()
        assert (held["status"], held["decision"]) == (429, "approval_required"), held
        assert held["body"]["job"].startswith("job-") and "run-1" not in json.dumps(held["body"])
        assert e.policy is not None and e.policy.answers["approval"] == 1
        assert e.state.approvals.standing(held["body"]["job"]) == "pending"

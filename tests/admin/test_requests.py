"""What the admin API does with what it is sent, on a real broker: bad input is a 4xx
naming the problem and writes nothing; writes are read back at once, by this server and
by the CLI (the same records on the same topics); retries converge; every change is in
the audit trail."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime.topic_reader import read_latest_values
from schemas.topics import Topics
from spendbus.cli import cli
from tests.admin.kit import admin_server, budget
from tests.gateway.kit import KEY_SECRET
from tests.slow_sender import head, send_then_stall

pytestmark = pytest.mark.integration


async def topic_size(bootstrap: str, topic: str) -> int:
    return len(await read_latest_values(bootstrap, topic))


async def test_bad_input_is_a_4xx_naming_the_problem_and_writes_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(
        kafka_bootstrap, topics, tmp_path, max_body_bytes=4096, body_timeout_s=0.5
    ) as server:
        token = server.token("org-admin", "acme")
        path = "/v1/admin/budgets"
        cases = [
            (b"{not json", 400, "the body is not JSON"),
            (b"", 400, "the body is empty"),
            (b"[1, 2]", 400, "the body must be a JSON object, not list"),
            (b"[" * 5000 + b"]" * 5000, 413, "over the 4096-byte limit"),
            (b'{"a":' * 40 + b"1" + b"}" * 40, 400, "nested deeper than 32 levels"),
            (json.dumps(budget("acme.a", limit_tokens="many")).encode(), 422, "limit_tokens"),
            (json.dumps(budget("acme.a", colour="red")).encode(), 422, "field 'colour'"),
            (json.dumps(budget("acme.a", window="fortnight")).encode(), 422, "field 'window'"),
            (json.dumps(budget("acme.a", scope="planet")).encode(), 422, "field 'scope'"),
            (json.dumps({"scope": "org", "limit_usd": "5"}).encode(), 422, "field 'id'"),
        ]
        for raw, status, names in cases:
            got, body = await server.call("POST", path, token, raw=raw)
            assert got == status and names in body["error"], (raw[:40], got, body)
        key_cases = [
            ({"name": "acme.k"}, 422, "secret_id"),
            ({"name": "acme k", "secret_id": "s"}, 422, "name"),
            ({"name": "acme.k", "secret_id": "s", "groups": "eng"}, 422, "groups"),
            ({"name": "acme.k", "secret_id": "s", "admin": True}, 422, "admin"),
        ]
        for key_body, status, field in key_cases:
            got, body = await server.call("POST", "/v1/admin/keys", token, key_body)
            assert (got, body["field"]) == (status, field), body
        raise_cases = [
            ({"budget_id": "acme.none", "by_usd": 5, "until": "1d", "reason": "x"}, "budget_id"),
            ({"budget_id": "acme.none", "by_usd": -5, "until": "1d", "reason": "x"}, "by_usd"),
            ({"budget_id": "acme.none", "until": "1d"}, "reason"),
        ]
        for raise_body, field in raise_cases:
            got, body = await server.call("POST", "/v1/admin/raises", token, raise_body)
            assert (got, body["field"]) == (422, field), body
        # a declared length over the limit: refused before a byte is read
        got, body = await server.call(
            "PUT", f"{path}/acme.a", token, raw=b"x" * 5000, headers={"Content-Length": "5000"}
        )
        assert got == 413
        # a slow sender: 408 and the connection closed
        answer = await send_then_stall(
            server.url,
            head(
                "POST",
                path,
                {
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json",
                    "Content-Length": "100",
                },
            )
            + b'{"id": "acme.slow"',
        )
        assert answer.startswith(b"HTTP/1.1 408") and b"not received within" in answer
        # unknown ids and routes, wrong methods: JSON 404 / 405
        for method, where, status in (
            ("GET", f"{path}/acme.nope", 404),
            ("PATCH", f"{path}/acme.nope", 404),
            ("DELETE", f"{path}/acme.nope", 404),
            ("GET", "/v1/admin/raises/r-nope", 404),
            ("POST", "/v1/admin/raises/r-nope/revoke", 404),
            ("GET", "/v1/admin/nothing", 404),
            ("PATCH", "/v1/admin/keys", 405),
        ):
            got, body = await server.call(method, where, token, {} if method != "GET" else None)
            assert got == status and body["error"], (method, where, got, body)
        # a PATCH that would make the budget invalid is refused whole
        assert (await server.call("POST", path, token, budget("acme.ok")))[0] == 201
        got, body = await server.call("PATCH", f"{path}/acme.ok", token, {"limit_usd": "-1"})
        assert (got, body["field"]) == (422, "limit_usd")
        got, body = await server.call("GET", f"{path}/acme.ok", token)
        assert body["limit_usd"] == "50"
        # nothing but the one valid budget was written, and one audit entry
        assert await topic_size(kafka_bootstrap, topics.budget_policies) == 1
        assert await topic_size(kafka_bootstrap, topics.gateway_keys) == 0
        assert await topic_size(kafka_bootstrap, topics.budget_raises) == 0
        assert await topic_size(kafka_bootstrap, topics.admin_audit) == 1


async def test_writes_are_read_back_at_once_and_by_the_cli(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        token = server.token("org-admin", "acme")
        for i in range(5):
            made = budget(f"acme.b{i}", limit_usd=str(10 + i), alert_at=[0.5, 0.9])
            assert (await server.call("POST", "/v1/admin/budgets", token, made))[0] == 201
            status, read = await server.call("GET", f"/v1/admin/budgets/acme.b{i}", token)
            assert status == 200 and read["limit_usd"] == str(10 + i)
            status, patched = await server.call(
                "PATCH", f"/v1/admin/budgets/acme.b{i}", token, {"limit_usd": "99"}
            )
            assert patched["limit_usd"] == "99"
            status, read = await server.call("GET", f"/v1/admin/budgets/acme.b{i}", token)
            assert read["limit_usd"] == "99" and read["match"] == {"org_id": "acme"}
        assert (await server.call("DELETE", "/v1/admin/budgets/acme.b4", token))[0] == 200
        assert (await server.call("GET", "/v1/admin/budgets/acme.b4", token))[0] == 404
    # the CLI reads the very records the API wrote
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path / "cli-home"),
    }
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["budgets", "list", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    listed = {b["budget_id"]: b for b in json.loads(result.output)}
    assert sorted(listed) == [f"acme.b{i}" for i in range(4)]
    assert listed["acme.b0"]["limit_nanos"] == 99_000_000_000
    assert listed["acme.b0"]["alert_at"] == [0.5, 0.9]
    # and a new server (another process's view) starts from them
    async with admin_server(kafka_bootstrap, topics, tmp_path / "second") as server:
        status, read = await server.call("GET", "/v1/admin/budgets", server.token("platform-admin"))
        assert [b["id"] for b in read["budgets"]] == [f"acme.b{i}" for i in range(4)]


async def test_retries_converge_and_every_change_is_audited(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        token = server.token("org-admin", "acme")
        viewer = server.token("org-viewer", "acme")
        other = server.token("org-admin", "globex")
        retry = {"Idempotency-Key": "create-ci-key-1"}
        key_body = {"name": "acme.ci", "secret_id": "sk-openai", "project_id": "p1"}
        first = await server.call("POST", "/v1/admin/keys", token, key_body, headers=retry)
        again = await server.call("POST", "/v1/admin/keys", token, key_body, headers=retry)
        assert first[0] == 201 and again == first  # the same key, minted once
        status, body = await server.call(
            "POST", "/v1/admin/keys", token, {**key_body, "name": "acme.other"}, headers=retry
        )
        assert (status, body["field"]) == (422, "Idempotency-Key")
        # without the header, a second create of the same name is a conflict
        status, body = await server.call("POST", "/v1/admin/keys", token, key_body)
        assert (status, body["field"]) == (409, "name")
        # PUT by id converges: the same budget twice is one change
        made = budget("acme.monthly", limit_usd="20")
        put = [
            await server.call("PUT", "/v1/admin/budgets/acme.monthly", token, made) for _ in "ab"
        ]
        assert [p[0] for p in put] == [201, 200] and put[0][1] == put[1][1]
        rotation = {"Idempotency-Key": "rotate-ci-key-1"}
        rotate = f"/v1/admin/keys/{first[1]['key_id']}/rotate"
        status, rotated = await server.call("POST", rotate, token, headers=rotation)
        assert status == 201 and rotated["key"] != first[1]["key"]
        # a retry gets the key it rotated to (the old one is gone: no third key)
        assert await server.call("POST", rotate, token, headers=rotation) == (201, rotated)
        assert rotated["name"] == "acme.ci" and rotated["project_id"] == "p1"
        assert (await server.call("GET", f"/v1/admin/keys/{first[1]['key_id']}", token))[0] == 404

        status, trail = await server.call("GET", "/v1/admin/audit", viewer)
        entries = trail["entries"]
        assert [e["action"] for e in entries] == ["keys.create", "budgets.replace", "keys.rotate"]
        minted, replaced, rotation = entries
        token_id = next(r.token_id for r in server.tokens.records() if r.role == "org-admin")
        assert minted["token_id"] == token_id and minted["role"] == "org-admin"
        assert minted["remote"] == "127.0.0.1" and minted["org_id"] == "acme"
        assert minted["before"] is None and minted["after"]["name"] == "acme.ci"
        assert first[1]["key"] not in json.dumps(trail)  # never the key itself
        assert replaced["before"] is None and replaced["after"]["limit_usd"] == "20"
        assert rotation["before"] == {"key_id": first[1]["key_id"]}
        assert rotation["after"]["key_id"] == rotated["key_id"]
        # another org sees none of it
        assert (await server.call("GET", "/v1/admin/audit", other))[1]["entries"] == []
    # the CLI reads the same trail from the topic
    env = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(tmp_path / "cli-home"),
        "SPENDBUS_KEY_SECRET": KEY_SECRET.decode(),
    }
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["admin", "audit", "--org", "acme", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    assert [e["action"] for e in json.loads(result.output)] == [
        "keys.create",
        "budgets.replace",
        "keys.rotate",
    ]

"""Idempotency-Key answers kept on the admin.idempotency topic (real broker): a retry
answered after the server restarted, or by another server, is the first answer, with one
change and one audit entry; the kept answer is sealed (never the minted key in clear)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from admin.answers import Answer, answers_key, seal, slot_key, unseal
from runtime.topic_reader import read_latest_values
from schemas.topics import Topics
from tests.admin.kit import admin_server, budget
from tests.gateway.kit import KEY_SECRET

pytestmark = pytest.mark.integration


async def test_a_retry_after_a_restart_or_to_another_server_gets_the_first_answer(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    mint = {"Idempotency-Key": "ci-run-77-mint"}
    key_body = {"name": "acme.ci", "secret_id": "sk-openai"}
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        token = server.token("org-admin", "acme")
        first = await server.call("POST", "/v1/admin/keys", token, key_body, headers=mint)
        assert first[0] == 201 and first[1]["key"]
    # a restart: the new server's memory holds nothing of the first
    async with (
        admin_server(kafka_bootstrap, topics, tmp_path) as restarted,
        admin_server(kafka_bootstrap, topics, tmp_path) as beside,
    ):
        again = await restarted.call("POST", "/v1/admin/keys", token, key_body, headers=mint)
        assert again == first  # the same key, minted once
        status, body = await restarted.call(
            "POST", "/v1/admin/keys", token, {**key_body, "name": "acme.other"}, headers=mint
        )
        assert (status, body["field"]) == (422, "Idempotency-Key")
        # a raise made on one server, retried on another that was running all along
        created = await beside.call("POST", "/v1/admin/budgets", token, budget("acme.m", "acme"))
        assert created[0] == 201
        lift = {"Idempotency-Key": "lift-1"}
        raise_body = {"budget_id": "acme.m", "by_usd": "10", "until": "2h", "reason": "q4"}
        raised = await restarted.call("POST", "/v1/admin/raises", token, raise_body, headers=lift)
        assert raised[0] == 201
        assert await beside.call("POST", "/v1/admin/raises", token, raise_body, headers=lift) == (
            raised
        )
        # one change each: one key, one raise, and their audit entries once
        listed = (await beside.call("GET", "/v1/admin/keys", token))[1]["keys"]
        assert [k["name"] for k in listed] == ["acme.ci"]
        raises = (await beside.call("GET", "/v1/admin/raises", token))[1]["raises"]
        assert len(raises) == 1
        trail = (await beside.call("GET", "/v1/admin/audit", token))[1]["entries"]
        assert [e["action"] for e in trail] == ["keys.create", "budgets.create", "raises.create"]
        # another token's retry of the same key is its own request
        other = restarted.token("org-admin", "acme")
        status, body = await restarted.call("POST", "/v1/admin/keys", other, key_body, headers=mint)
        assert (status, body["field"]) == (409, "name")

    # what the topic keeps: sealed, under a digest of the header, opened only by its slot
    kept = await read_latest_values(kafka_bootstrap, topics.admin_idempotency)
    assert len(kept) == 2
    secret = first[1]["key"]
    for record_key, sealed in kept.items():
        assert sealed is not None
        assert secret.encode() not in sealed and b"acme.ci" not in sealed
        assert b"ci-run-77" not in record_key and b"lift-1" not in record_key
    aes = answers_key(KEY_SECRET)
    token_id = next(r.token_id for r in server.tokens.records() if r.role == "org-admin")
    slot = slot_key(token_id, "/v1/admin/keys", "ci-run-77-mint")
    opened = unseal(aes, slot, kept[slot] or b"")
    assert opened is not None and opened.body == first[1] and opened.status == 201
    assert unseal(aes, slot_key(token_id, "/v1/admin/keys", "other"), kept[slot] or b"") is None
    assert unseal(answers_key(b"another-key-secret"), slot, kept[slot] or b"") is None


async def test_an_expired_answer_is_a_new_request(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        token = server.token("org-admin", "acme")
        token_id = server.tokens.records()[0].token_id
        route, header = "/v1/admin/budgets", "old-key"
        body = budget("acme.late", "acme", limit_usd="5")
        slot = slot_key(token_id, route, header)
        # an answer kept 24 h ago and past its lifetime, as another server left it
        stale = Answer("0" * 64, 201, {"id": "acme.stale"}, expires_at=0.0)
        await server.store._publish(
            topics.admin_idempotency, [(slot, seal(answers_key(KEY_SECRET), slot, stale))]
        )
        status, made = await server.call(
            "POST", route, token, body, headers={"Idempotency-Key": header}
        )
        assert status == 201 and made["id"] == "acme.late"
        kept = await read_latest_values(kafka_bootstrap, topics.admin_idempotency)
        fresh = unseal(answers_key(KEY_SECRET), slot, kept[slot] or b"")
        assert fresh is not None and fresh.body == made and not fresh.expired()
        assert json.loads(json.dumps(made))["limit_usd"] == "5"

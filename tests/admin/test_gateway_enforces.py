"""The issue's story end to end: an org admin provisions a customer's key and budget over
HTTP, and a running gateway (real broker, enforcer and publisher; a fake provider)
admits the key, then refuses it once the budget is spent; another org's admin sees
neither."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from ingest.gateway import KeysTopicFollower
from schemas.budgets import parse_budget
from schemas.codec import VERDICT
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import admin_server, budget
from tests.gateway.kit import PROMPT, exhausted_verdict, gateway_stack

pytestmark = pytest.mark.integration

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
#: a guard against a hang, far above what the gateway takes (never a measured threshold)
GUARD_S = 30.0


async def chat(url: str, key: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
        ) as resp,
    ):
        await resp.read()
        return resp.status


async def answers(url: str, key: str, wanted: int) -> None:
    async with asyncio.timeout(GUARD_S):
        while await chat(url, key) != wanted:
            await asyncio.sleep(0.1)


async def test_an_org_admin_provisions_a_key_and_budget_a_gateway_enforces(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with (
        admin_server(kafka_bootstrap, topics, tmp_path / "admin") as admin,
        gateway_stack(kafka_bootstrap, topics, tmp_path / "gw", budgets=()) as stack,
    ):
        initech = admin.token("org-admin", "initech")
        status, key = await admin.call(
            "POST",
            "/v1/admin/keys",
            initech,
            {"name": "initech.customer-42", "secret_id": "sk-openai", "project_id": "c42"},
        )
        assert status == 201
        status, made = await admin.call(
            "POST", "/v1/admin/budgets", initech, budget("initech.c42", limit_usd="1")
        )
        assert status == 201 and made["match"] == {"org_id": "initech"}
        async with KeysTopicFollower(
            kafka_bootstrap, topics.gateway_keys, stack.gateway.keys, stack.gateway.config
        ) as follower:
            await follower.wait_ready(GUARD_S)
            assert await chat(stack.url, key["key"]) == 200  # the key works, nothing spent
            # the aggregator counts the customer's spend past the cap (its verdict)
            created, errors = parse_budget(made)
            assert created is not None, errors
            spent = exhausted_verdict(created, ("initech",))
            await publish(
                kafka_bootstrap,
                topics.budget_verdicts,
                [(spent["counter_key"].encode(), VERDICT.encode(spent))],
            )
            await answers(stack.url, key["key"], 402)
            # another org's admin can neither see nor touch either
            globex = admin.token("org-admin", "globex")
            for method, path in (
                ("GET", f"/v1/admin/keys/{key['key_id']}"),
                ("DELETE", f"/v1/admin/keys/{key['key_id']}"),
                ("GET", "/v1/admin/budgets/initech.c42"),
                ("DELETE", "/v1/admin/budgets/initech.c42"),
            ):
                assert (await admin.call(method, path, globex))[0] == 404
            listed = (await admin.call("GET", "/v1/admin/keys", globex))[1]["keys"]
            assert listed == []
            # revoked over HTTP: the gateway stops taking the key
            assert (await admin.call("DELETE", f"/v1/admin/keys/{key['key_id']}", initech))[
                0
            ] == 200
            await answers(stack.url, key["key"], 401)

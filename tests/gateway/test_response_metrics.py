"""Seed 003's responses by outcome outside ClickHouse (issue 37, item 4): the gateway's
/metrics counts each metered response by how its usage was known, the same
``usage_source`` its UsageEvent carries, through the real gateway and the fake providers."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.topics import Topics
from schemas.usage import USAGE_SOURCES
from tests.gateway.kit import (
    BROKE,
    KEY_OF,
    REALTIME_MODEL,
    ask,
    exhausted_verdict,
    gateway_stack,
    request_for,
    until,
)

pytestmark = pytest.mark.integration


async def responses_counted(
    session: aiohttp.ClientSession, url: str
) -> dict[tuple[str, str], float]:
    """``spendbus_gateway_responses_total`` by (family, usage_source), read from /metrics."""
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {
        (sample.labels["family"], sample.labels["usage_source"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "spendbus_gateway_responses"
        for sample in family.samples
        if sample.name == "spendbus_gateway_responses_total"
    }


async def test_each_response_is_counted_by_how_its_usage_was_known(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    verdict = exhausted_verdict(BROKE, ["broke"])
    async with (
        gateway_stack(kafka_bootstrap, topics, tmp_path, verdicts=[verdict]) as stack,
        aiohttp.ClientSession() as session,
    ):
        before = await responses_counted(session, stack.url)
        # every source of every family is there from the start, at 0
        assert set(before) == {
            (family, source)
            for family in ("openai", "anthropic", "gemini", "bedrock")
            for source in USAGE_SOURCES
        }
        assert set(before.values()) == {0.0}

        path, body, key = request_for("openai-chat", False)
        bearer = {"Authorization": f"Bearer {key}"}
        async with session.post(stack.url + path, json=body, headers=bearer) as resp:
            assert resp.status == 200
            await resp.read()
        # an upstream error without usage: nothing known of it
        failing = {**bearer, "x-fake-status": "500"}
        async with session.post(stack.url + path, json=body, headers=failing) as resp:
            assert resp.status == 500
            await resp.read()
        # a stream the provider cuts: its usage is estimated
        path, body, key = request_for("anthropic-messages", True)
        cut = {"x-api-key": key, "anthropic-version": "2023-06-01", "x-fake-cut-after": "3"}
        async with session.post(stack.url + path, json=body, headers=cut) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        # refused before the provider: no response, so not counted
        path, body, _ = request_for("openai-chat", False)
        broke = {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}
        async with session.post(stack.url + path, json=body, headers=broke) as resp:
            assert resp.status == 402
            await resp.read()

        # a Realtime response, reported by its response.done: counted under openai
        async with session.ws_connect(
            f"{stack.url}/v1/realtime?model={REALTIME_MODEL}",
            headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
        ) as ws:
            await until(ws, "session.created")
            for message in ask("hello"):
                await ws.send_json(message)
            await until(ws, "response.done")

        events = await stack.events(5)
        after = await responses_counted(session, stack.url)

    metered = [e for e in events if e["outcome"] != "refused"]
    assert sorted((e["api"], e["usage_source"]) for e in metered) == [
        ("anthropic-messages", "estimated"),
        ("openai-chat", "none"),
        ("openai-chat", "reported"),
        ("openai-realtime", "reported"),
    ]
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert moved == {
        ("openai", "reported"): 2.0,  # the chat answer and the Realtime response
        ("openai", "none"): 1.0,
        ("anthropic", "estimated"): 1.0,
    }

"""What the gateway holds and charges when a request can cost more than one answer's
worth (issue 21, "Estimates"): candidates, asked-for streamed usage, background mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schemas.budgets import Budget
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from tests.gateway.kit import KEY_OF, PROMPT, eventually, gateway_stack

pytestmark = pytest.mark.integration

OPENAI = {"Authorization": f"Bearer {KEY_OF['sk-openai']}"}


def token_budget(limit_tokens: int) -> Budget:
    return Budget(
        budget_id="acme-openai-tokens",
        scope="secret",
        window=parse_window("day"),
        match={"secret_id": ("sk-openai",)},
        limit_tokens=limit_tokens,
    )


async def test_the_hold_counts_every_candidate(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``n: 16`` of 1,000 tokens each cannot fit a 10,000-token budget; ``n: 4`` can
    (one candidate's worst case would let both through)."""
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, budgets=[token_budget(10_000)]
    ) as stack:
        body = {
            "model": "gpt-4o",
            "max_completion_tokens": 1_000,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        async with aiohttp.ClientSession() as session:
            url = stack.url + "/v1/chat/completions"
            async with session.post(url, json={**body, "n": 16}, headers=OPENAI) as resp:
                refusal = await resp.json()
                assert resp.status == 402, refusal
            async with session.post(url, json={**body, "n": 4}, headers=OPENAI) as resp:
                assert resp.status == 200
                await resp.read()
        assert (refusal["error"], refusal["reason"]) == ("budget_exceeded", "request_too_large")
        assert refusal["request_tokens"] > 16_000
        assert (await stack.upstream_stats())["requests"] == 1


def compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


CHAT = {
    "model": "gpt-4o",
    "stream": True,
    "max_completion_tokens": 400,
    "messages": [{"role": "user", "content": PROMPT}],
}
JSON = {"Content-Type": "application/json"}


async def test_streamed_usage_is_asked_for_and_the_client_gets_its_own_stream(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A streamed chat request without ``include_usage``: the gateway asks OpenAI for the
    usage (charged as reported, not estimated) and relays the stream byte for byte as
    the provider answers that request without it: no usage chunk, no ``usage: null``."""
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with aiohttp.ClientSession() as session:
            url = stack.url + "/v1/chat/completions"
            # the client's Accept-Encoding (aiohttp asks gzip) is not what the upstream gets
            async with session.post(url, data=compact(CHAT), headers=OPENAI | JSON) as resp:
                assert resp.status == 200
                assert "Content-Length" not in resp.headers
                through = await resp.read()
            direct_url = stack.upstream.url + "/v1/chat/completions"
            async with session.post(direct_url, data=compact(CHAT), headers=JSON) as resp:
                direct = await resp.read()
        assert through == direct
        assert b'"usage"' not in through and through.endswith(b"data: [DONE]\n\n")
        (event,) = await stack.events(1)
        stats = await stack.upstream_stats()
        assert event["usage_source"] == "reported", event
        # the gateway's call reported usage; the direct one, without include_usage, did not
        assert event["output_tokens"] == stats["usage"]["output_tokens"] > 0
        assert stats["usage_unreported"]["output_tokens"] == event["output_tokens"]
        assert event["input_tokens"] == stats["usage"]["input_tokens"]


async def test_a_client_that_asks_for_usage_gets_it_and_other_options_are_kept(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    asked = {**CHAT, "stream_options": {"include_usage": True}}
    other = {**CHAT, "stream_options": {"include_usage": False}}
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with aiohttp.ClientSession() as session:
            url = stack.url + "/v1/chat/completions"
            async with session.post(url, data=compact(asked), headers=OPENAI | JSON) as resp:
                with_usage = await resp.read()
            async with session.post(url, data=compact(other), headers=OPENAI | JSON) as resp:
                without = await resp.read()
        usage_chunks = [line for line in with_usage.split(b"\n\n") if b'"choices":[]' in line]
        assert len(usage_chunks) == 1 and b'"prompt_tokens"' in usage_chunks[0]
        assert b'"usage"' not in without
        events = await stack.events(2)
        assert [e["usage_source"] for e in events] == ["reported", "reported"]


async def test_the_openai_sdk_streams_without_usage_and_is_charged_as_reported(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    from openai import AsyncOpenAI

    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        client = AsyncOpenAI(api_key=KEY_OF["sk-openai"], base_url=stack.url + "/v1")
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": PROMPT}],
                max_completion_tokens=300,
                stream=True,
            )
        ]
        await client.close()
        assert chunks and all(chunk.choices for chunk in chunks)  # choices[0] always there
        assert all(chunk.usage is None for chunk in chunks)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        (event,) = await stack.events(1)
        stats = await stack.upstream_stats()
        assert text and event["usage_source"] == "reported"
        assert event["output_tokens"] == stats["usage"]["output_tokens"]
        assert stats["usage_unreported"]["output_tokens"] == 0


async def test_asking_can_be_turned_off(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, gateway={"ask_stream_usage": False}
    ) as stack:
        async with aiohttp.ClientSession() as session:
            url = stack.url + "/v1/chat/completions"
            async with session.post(url, data=compact(CHAT), headers=OPENAI | JSON) as resp:
                await resp.read()
        (event,) = await stack.events(1)
        assert event["usage_source"] == "estimated"
        assert "include_usage" in event["estimate_reason"]


async def test_a_background_response_is_estimated_then_metered_once_when_fetched(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``background: true`` answers ``queued`` with null usage: charged the floor plus the
    cap at once; the result fetched through the gateway tops that up, once, with what
    the reported usage exceeds it by (here its web search calls), under an id of its own
    naming the call; another tenant's key cannot fetch it."""
    request = {
        "model": "gpt-4.1",
        "background": True,
        "max_output_tokens": 3_000,
        "input": PROMPT,
        "tools": [{"type": "web_search"}],
    }
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                stack.url + "/v1/responses", json=request, headers=OPENAI
            ) as resp:
                queued = await resp.json()
            assert (queued["status"], queued["usage"]) == ("queued", None)
            url = f"{stack.url}/v1/responses/{queued['id']}"
            broke = {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}
            async with session.get(url, headers=broke) as resp:
                assert resp.status == 404  # not this tenant's: never fetched upstream
            async with session.get(stack.url + "/v1/responses/resp_other", headers=OPENAI) as resp:
                assert resp.status == 404
            assert "/v1/responses/{id}" not in (await stack.upstream_stats())["routes"]
            fetched = []
            for _ in range(2):  # fetched twice: charged once
                async with session.get(url, headers=OPENAI) as resp:
                    assert resp.status == 200
                    fetched.append(await resp.json())
        assert [f["status"] for f in fetched] == ["completed", "completed"]
        usage = fetched[0]["usage"]
        searches = sum(item["type"] == "web_search_call" for item in fetched[0]["output"])
        assert searches > 0
        estimate, top_up = await stack.events(2)
        assert estimate["usage_source"] == "estimated"
        assert (estimate["input_tokens"], estimate["output_tokens"]) == (200_000, 3_000)
        assert usage["input_tokens"] < 200_000 and usage["output_tokens"] <= 3_000
        assert top_up["event_id"] == estimate["event_id"] + ".final"
        assert top_up["charge_of"] == estimate["event_id"]
        assert top_up["usage_source"] == "reported"
        assert top_up["units"] == {"web_search": searches}
        assert (top_up["input_tokens"], top_up["output_tokens"]) == (0, 0)
        assert top_up["org_id"] == "acme" and top_up["model"] == estimate["model"]
        assert len(await stack.events(3, timeout=3)) == 2  # the second fetch charged nothing
        stats = await stack.upstream_stats()
        assert stats["routes"]["/v1/responses/{id}"]["requests"] == 2


async def test_the_openai_sdk_creates_and_retrieves_a_background_response(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    from openai import AsyncOpenAI, NotFoundError

    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        client = AsyncOpenAI(api_key=KEY_OF["sk-openai"], base_url=stack.url + "/v1")
        created = await client.responses.create(model="o3", input=PROMPT, background=True)
        assert created.status == "queued" and created.usage is None
        done = await client.responses.retrieve(created.id)
        assert done.status == "completed" and done.usage is not None
        with pytest.raises(NotFoundError):
            await client.responses.retrieve("resp_not_made_here")
        await client.close()
        (estimate,) = await stack.events(1)
        # o3 reasons by default and names no cap: the estimate is the floor plus the cap
        assert (estimate["input_tokens"], estimate["output_tokens"]) == (200_000, 128_000)
        assert done.usage.output_tokens <= 128_000  # covered: no top-up


async def test_a_streamed_background_response_cut_by_the_client_is_metered_when_fetched(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A background stream the client leaves goes on generating upstream: estimated at
    the floor plus the cap; its result fetched (here as a stream, ``?stream=true``) tops
    the estimate up once; a stream read to its end was charged as reported, and
    fetching it charges nothing more."""
    request = {
        "model": "gpt-4.1",
        "background": True,
        "stream": True,
        "max_output_tokens": 2_000,
        "input": PROMPT,
        "tools": [{"type": "web_search"}],
    }
    paced = FakeUpstreamConfig(port=0, seed=7, chunk_latency_ms=20)
    async with gateway_stack(kafka_bootstrap, topics, tmp_path, upstream=paced) as stack:
        async with aiohttp.ClientSession() as session:
            url = stack.url + "/v1/responses"
            async with session.post(url, json=request, headers=OPENAI) as resp:
                first = await resp.content.readuntil(b"\n\n")  # response.created, then leave
            created = json.loads(first.split(b"data: ", 1)[1])["response"]
            await eventually(lambda: len(stack.gateway.background) == 1)  # the cut accounted
            async with session.post(
                url, json={**request, "input": "whole"}, headers=OPENAI
            ) as resp:
                whole = await resp.read()
            whole_id = json.loads(whole.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
            fetched = []
            for response_id, query in ((created["id"], "?stream=true"), (whole_id, "")):
                async with session.get(
                    f"{stack.url}/v1/responses/{response_id}{query}", headers=OPENAI
                ) as resp:
                    assert resp.status == 200
                    fetched.append(await resp.read())
        assert b"event: response.completed" in fetched[0]
        events = await stack.events(3)
        (top_up,) = [e for e in events if e["charge_of"]]  # dated as its call
        cut, complete = [e for e in events if not e["charge_of"]]
        assert (
            cut["usage_source"] == "estimated" and cut["estimate_reason"] == "client_disconnected"
        )
        assert (cut["input_tokens"], cut["output_tokens"]) == (200_000, 2_000)
        assert complete["usage_source"] == "reported"
        assert top_up["charge_of"] == cut["event_id"] and top_up["units"]["web_search"] > 0
        assert len(await stack.events(4, timeout=3)) == 3  # the whole one: nothing more

"""The optional per-key limit of requests in flight (issue 21): one more is 429
``throttled`` with Retry-After in the provider's shape, never forwarded nor charged (real
broker and enforcer, the fake providers only)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest

from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from tests.gateway.kit import KEY_OF, eventually, gateway_stack, request_for

pytestmark = pytest.mark.integration


async def test_a_key_past_its_in_flight_limit_is_throttled_and_never_forwarded(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=5, latency_ms=1500),
        gateway={"max_in_flight_per_key": 2, "throttle_retry_after_s": 2},
    ) as stack:
        path, body, key = request_for("openai-chat", False)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as session:

            async def call(with_key: str = key) -> tuple[int, dict[str, str], str]:
                async with session.post(
                    stack.url + path, json=body, headers={"Authorization": f"Bearer {with_key}"}
                ) as resp:
                    return resp.status, dict(resp.headers), await resp.text()

            slow = [asyncio.create_task(call()) for _ in range(2)]
            await eventually(lambda: stack.gateway.in_flight.get("acme-openai") == 2)
            status, got, text = await call()
            assert status == 429, text
            assert got["Retry-After"] == "2" and got["x-should-retry"] == "true"
            assert '"code": "throttled"' in text and "max_in_flight_per_key" in text
            # another key of the same org is not throttled by this one's requests
            other = await asyncio.create_task(call(KEY_OF["sk-anthropic"]))
            assert other[0] == 403  # (its credential is for another API: it got past the limit)
            # the SDK raises its usual rate-limit error
            client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(**body)
            assert [(await t)[0] for t in slow] == [200, 200]
            assert stack.gateway.in_flight == {}
            async with session.post(stack.url + path, json=body, headers=headers) as resp:
                assert resp.status == 200
        stats = await stack.upstream_stats()
        assert stats["requests"] == 3  # the throttled ones never went out
        events = await stack.events(3)
        assert len(events) == 3 and all(e["outcome"] == "allowed" for e in events)


async def test_a_realtime_session_is_one_of_the_keys_requests_in_flight(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A Realtime session holds an upstream connection for as long as it lasts: it counts
    toward ``max_in_flight_per_key`` until it closes (it went uncounted: a key could open
    any number of sessions past the limit)."""
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, gateway={"max_in_flight_per_key": 1}
    ) as stack:
        key = KEY_OF["sk-openai"]
        headers = {"Authorization": f"Bearer {key}"}
        url = f"{stack.url}/v1/realtime?model=gpt-4o-realtime-preview-2025-06-03"
        path, body, _ = request_for("openai-chat", False)
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, headers=headers) as ws:
                created = json.loads((await ws.receive(timeout=30)).data)
                assert created["type"] == "session.created"
                assert stack.gateway.in_flight == {"acme-openai": 1}
                # a second session and a request of the same key: 429 throttled
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(url, headers=headers)
                assert refused.value.status == 429
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 429
                    assert "max_in_flight_per_key" in await resp.text()
            # closed, it leaves the count: the key may go on
            await eventually(lambda: stack.gateway.in_flight == {})
            async with session.post(stack.url + path, json=body, headers=headers) as resp:
                assert resp.status == 200
        throttled = stack.gateway.metrics.requests.labels("openai", "throttled")
        assert throttled._value.get() == 2

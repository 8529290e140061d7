"""OpenAI Realtime sessions (WebSocket) through the gateway: one charge per response."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schemas.budgets import Budget
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from tests.gateway.kit import KEY_OF, ask, gateway_stack, until
from tests.gateway.kit import REALTIME_MODEL as MODEL

pytestmark = pytest.mark.integration


async def test_each_response_of_a_session_is_charged_as_reported(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        usages = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
            ) as ws,
        ):
            created = await until(ws, "session.created")
            assert created["session"]["model"] == MODEL
            for question in ("What is usage.raw?", "And how long is it kept?"):
                for message in ask(question):
                    await ws.send_str(json.dumps(message))
                done = await until(ws, "response.done")
                usages.append(done["response"]["usage"])
        events = await stack.events(2)
        assert len(events) == 2
        for event, usage in zip(events, usages, strict=True):
            assert event["api"] == "openai-realtime" and event["model"] == MODEL
            assert event["usage_source"] == "reported"
            assert event["input_tokens"] + event["cache_read_tokens"] == usage["input_tokens"]
            assert event["cache_read_tokens"] == usage["input_token_details"]["cached_tokens"]
            assert event["output_tokens"] == usage["output_tokens"]
            assert event["status_code"] == 101 and event["stream"] is True
        # the second response rereads the first from the cache
        assert events[1]["cache_read_tokens"] > 0
        billed = stack.upstream.stats.routes["/v1/realtime"].usage
        assert billed["output_tokens"] == sum(e["output_tokens"] for e in events)


async def test_a_spent_budget_refuses_the_session_and_then_each_response(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    tight = Budget(
        budget_id="realtime-tight",
        scope="secret",
        window=parse_window("day"),
        match={"secret_id": ("sk-openai",)},
        limit_nanos=100_000_000,  # a 4k-output hold fits ($0.08); one more after a 3k answer does not
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[tight],
        enforcer={"default_max_output_tokens": 4000},
        upstream=FakeUpstreamConfig(port=0, seed=4, output_tokens=(3000, 3000)),
    ) as stack:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
            ) as ws,
        ):
            await until(ws, "session.created")
            for message in ask("first"):
                await ws.send_str(json.dumps(message))
            await until(ws, "response.done")  # the connect-time hold covers it
            for message in ask("second"):
                await ws.send_str(json.dumps(message))
            error = await until(ws, "error", "response.done")
            assert error["type"] == "error"
            assert error["error"]["code"] == "insufficient_quota"
            assert error["error"]["event_id"] == "evt_client_1"
        # the refused response.create never reached the provider: one response there
        assert stack.upstream.stats.routes["/v1/realtime"].usage["output_tokens"] > 0
        events = await stack.events(2)
        assert [e["outcome"] for e in events] == ["allowed", "refused"]
        assert events[1]["decision_budget_id"] == "realtime-tight"
        assert events[1]["api"] == "openai-realtime"

        # a new session is now refused before the upgrade, in HTTP
        sessions_before = stack.upstream.stats.routes["/v1/realtime"].requests
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(
                    f"{stack.url}/v1/realtime?model={MODEL}",
                    headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
                )
        assert refused.value.status == 402
        assert stack.upstream.stats.routes["/v1/realtime"].requests == sessions_before


async def test_a_response_cut_short_is_charged_an_estimate(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}", "x-fake-cut-after": "3"},
            ) as ws,
        ):
            await until(ws, "session.created")
            for message in ask("a long answer please"):
                await ws.send_str(json.dumps(message))
            async for _msg in ws:  # the provider drops the session mid-response
                pass
        (event,) = await stack.events(1)
        assert event["usage_source"] == "estimated"
        assert event["output_tokens"] > 0
        assert stack.upstream.stats.routes["/v1/realtime"].cuts == 1


async def test_a_message_nested_too_deeply_is_refused_and_the_session_goes_on(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
            ) as ws,
        ):
            await until(ws, "session.created")
            await ws.send_str("[" * 100_000 + "]" * 100_000)
            error = await until(ws, "error")
            assert error["error"]["type"] == "invalid_request_error"
            assert "nested too deeply" in error["error"]["message"]
            for message in ask("What is usage.raw?"):
                await ws.send_str(json.dumps(message))
            done = await until(ws, "response.done")
        events = await stack.events(1)
        assert (
            len(events) == 1
            and events[0]["output_tokens"] == done["response"]["usage"]["output_tokens"]
        )


async def _events_until_closed(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Every server event until the session closes (at most 30 s: a test never hangs)."""
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                seen.append(json.loads(msg.data))

    try:
        await asyncio.wait_for(read(), 30)
    except TimeoutError:
        raise AssertionError(f"the session stayed open; events seen: {seen}") from None
    return seen


def _speak() -> str:
    """One spoken turn: with server voice activity detection (the default) the provider
    starts a response by itself, without a client response.create."""
    return json.dumps({"type": "input_audio_buffer.append", "audio": "UklGRg" * 2_000})


async def test_a_response_the_server_starts_is_admitted_and_refused_once_the_budget_is_spent(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    from schemas.codec import VERDICT
    from spendbus.stack.compacted import publish
    from tests.gateway.kit import eventually, exhausted_verdict

    budget = Budget(
        budget_id="realtime-spend",
        scope="secret",
        window=parse_window("day"),
        match={"secret_id": ("sk-openai",)},
        limit_nanos=1_000_000_000,
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[budget],
        upstream=FakeUpstreamConfig(port=0, seed=5, output_tokens=(1500, 1500), chunk_latency_ms=2),
    ) as stack:
        realtime = stack.upstream.stats.routes
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
            ) as ws,
        ):
            await until(ws, "session.created")
            await ws.send_str(_speak())  # the first turn: the connect-time hold admits it
            first = await until(ws, "response.created")
            done = await until(ws, "response.done")
            assert done["response"]["id"] == first["response"]["id"]

            # the budget is spent elsewhere (its verdict arrives mid-session)
            spent = exhausted_verdict(budget, ["acme", "sk-openai"])
            await publish(
                kafka_bootstrap,
                topics.budget_verdicts,
                [(v["counter_key"].encode(), VERDICT.encode(v)) for v in [spent]],
            )
            ctx = stack.enforcer.context(
                org_id="acme", secret_id="sk-openai", provider="openai", model=MODEL
            )
            await eventually(lambda: not stack.enforcer.peek(ctx).allowed)

            await ws.send_str(_speak())  # the server starts a second response by itself
            rest = await _events_until_closed(ws)
            assert ws.close_code == 1008  # the session is closed: the budget is spent
        errors = [e for e in rest if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["insufficient_quota"]
        assert "realtime-spend" in errors[0]["error"]["message"]
        # the refused response never reached the client, and it was cancelled upstream
        assert not [e for e in rest if e["type"].startswith("response.")]
        await eventually(lambda: realtime["/v1/realtime"].cancels == 1)
        assert realtime["/v1/realtime"].responses == 2
        events = await stack.events(3)
        outcomes = sorted(e["outcome"] for e in events)
        assert outcomes == ["allowed", "allowed", "refused"]
        refusal = next(e for e in events if e["outcome"] == "refused")
        assert refusal["decision_budget_id"] == "realtime-spend"
        # what the cancelled response generated before its cancel is charged all the same
        assert sum(e["output_tokens"] for e in events if e["outcome"] == "allowed") > 1500
        assert stack.gateway.metrics.realtime_server_refused._value.get() == 1


async def test_frames_the_gateway_cannot_read_are_refused_and_never_forwarded(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"{stack.url}/v1/realtime?model={MODEL}",
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai']}"},
            ) as ws,
        ):
            await until(ws, "session.created")
            hostile = [
                '{"type": "response.create", "type": "session.update"}',  # which one counts?
                '{"type": "session.update", "type": "response.create"}',
                '{"type": "response.create"',  # not JSON
                '["response.create"]',  # no type
                '{"type": {"nested": "response.create"}}',
            ]
            for text in hostile:
                await ws.send_str(text)
            await ws.send_bytes(b'{"type": "response.create"}')  # binary: not read
            codes = []
            for _ in range(len(hostile) + 1):
                error = await until(ws, "error")
                codes.append(error["error"]["code"])
            assert codes == ["invalid_request_error"] * (len(hostile) + 1)
            await ws.send_str(json.dumps({"type": "session.update", "session": {}}))
            await until(ws, "session.updated")
        served = stack.upstream.stats.routes["/v1/realtime"]
        assert served.binary_in == 0 and served.client_events == 1  # only the session.update
        assert served.responses == 0
        metrics = stack.gateway.metrics.realtime_frames_refused
        assert metrics.labels("duplicate_key")._value.get() == 2
        assert metrics.labels("binary")._value.get() == 1

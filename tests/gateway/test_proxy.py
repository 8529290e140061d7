"""The gateway over real HTTP, a real broker and the real enforcer (fake providers only)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from schemas.topics import Topics
from spendbus.fake_upstream import FORMATS, FakeUpstreamConfig
from tests.gateway.kit import (
    BROKE,
    KEY_OF,
    eventually,
    exhausted_verdict,
    gateway_stack,
    request_for,
)

pytestmark = pytest.mark.integration

FIELDS = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


def auth(fmt: str, key: str) -> dict[str, str]:
    """Where each provider's SDK puts its key."""
    if fmt == "anthropic-messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if fmt == "gemini":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


async def test_every_format_streamed_and_whole_is_relayed_and_charged_as_billed(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=3, cache_ratio=0.5),
    ) as stack:
        bodies: dict[tuple[str, bool], bytes] = {}
        async with aiohttp.ClientSession() as session:
            for fmt in FORMATS:
                for stream in (False, True):
                    path, body, key = request_for(fmt, stream)
                    async with session.post(
                        stack.url + path, json=body, headers=auth(fmt, key)
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        bodies[(fmt, stream)] = await resp.read()
                    # the same request straight to the provider: the gateway alters nothing
                    async with session.post(stack.upstream.url + path, json=body) as direct:
                        assert await direct.read() == bodies[(fmt, stream)]
        events = await stack.events(2 * len(FORMATS))
        assert len(events) == 2 * len(FORMATS)
        stats = await stack.upstream_stats()
        # every request twice (through the gateway, then direct): the gateway charged half
        billed = {name: stats["usage"][name] // 2 for name in FIELDS}
        charged = {name: sum(e[name] for e in events) for name in FIELDS}
        assert charged == billed
        assert stats["usage_unreported"]["output_tokens"] == 0
        for event in events:
            assert event["usage_source"] == "reported", event
            assert event["outcome"] == "allowed"
            assert event["org_id"] == "acme"
            assert event["project_id"] == "proj-1"
            assert event["groups"] == ["eng"] and event["tags"] == {"team": "search"}
            assert event["gateway_id"] == "test-gateway"
            assert event["session_id"].startswith("auto:acme-")
            assert event["status_code"] == 200
        by_api = {(e["api"], e["stream"]) for e in events}
        assert by_api == {(fmt, s) for fmt in FORMATS for s in (False, True)}


async def test_a_refused_request_never_reaches_the_provider_and_is_published(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, verdicts=[exhausted_verdict(BROKE, ["broke"])]
    ) as stack:
        await eventually(lambda: stack.enforcer.ready)
        path, body, _ = request_for("openai-chat", True)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.url + path,
                json=body,
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"},
            ) as resp,
        ):
            assert resp.status == 402
            refusal = await resp.json()
            assert refusal["error"] == "budget_exceeded"
            assert refusal["budget_id"] == "broke-monthly"
            assert "Retry-After" in resp.headers
        stats = await stack.upstream_stats()
        assert stats["requests"] == 0
        (event,) = await stack.events(1)
        assert event["outcome"] == "refused"
        assert event["decision"] == "budget_exceeded"
        assert event["decision_budget_id"] == "broke-monthly"
        assert event["status_code"] == 402
        assert event["input_tokens"] == event["output_tokens"] == 0
        assert event["stream"] is True


async def test_native_refusals_use_the_providers_error_shapes(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        verdicts=[exhausted_verdict(BROKE, ["broke"])],
        enforcer={"refusal_style": "native"},
    ) as stack:
        async with aiohttp.ClientSession() as session:
            path, body, _ = request_for("anthropic-messages", False)
            async with session.post(
                stack.url + path,
                json=body,
                headers={"x-api-key": KEY_OF["sk-anthropic-broke"]},
            ) as resp:
                assert resp.status == 429
                assert (await resp.json())["error"]["type"] == "rate_limit_error"
            path, body, _ = request_for("openai-chat", False)
            async with session.post(
                stack.url + path,
                json=body,
                headers={"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"},
            ) as resp:
                assert resp.status == 429
                assert (await resp.json())["error"]["code"] == "insufficient_quota"
        assert (await stack.upstream_stats())["requests"] == 0


async def test_a_client_hang_up_mid_stream_still_publishes_an_estimate(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=5, chunk_latency_ms=20, output_tokens=(400, 400)),
    ) as stack:
        path, body, key = request_for("anthropic-messages", True)
        async with aiohttp.ClientSession() as session:
            resp = await session.post(
                stack.url + path, json=body, headers=auth("anthropic-messages", key)
            )
            assert resp.status == 200
            first = await resp.content.readany()
            assert first.startswith(b"event: message_start")
            resp.close()  # the client goes away after the first event
        (event,) = await stack.events(1)
        assert event["usage_source"] == "estimated"
        assert event["estimate_reason"] == "client_disconnected"
        # input read from message_start is kept, output is a pessimistic estimate
        assert event["input_tokens"] > 0 and event["output_tokens"] > 0
        assert event["status_code"] == 200
        # the gateway hung up on the provider too: it stops generating for nobody
        await eventually(lambda: stack.upstream.stats.total.client_disconnects == 1)


async def test_an_upstream_cut_reaches_the_client_and_is_charged_an_estimate(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        path, body, key = request_for("openai-chat", True)
        headers = {**auth("openai-chat", key), "x-fake-cut-after": "3"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(stack.url + path, json=body, headers=headers) as resp,
        ):
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        (event,) = await stack.events(1)
        assert event["usage_source"] == "estimated"
        assert event["estimate_reason"] == "upstream_cut"
        assert event["output_tokens"] > 0


async def test_a_silent_upstream_is_cut_by_the_read_timeout(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``read_timeout_s`` bounds the wait for the headers (502, hold released, not
    charged) and every silence inside a body (cut: the client sees it incomplete,
    and the response is charged an estimate), while a stream whose chunks come
    faster than the timeout goes through whole however long it lasts."""
    silent_after_first = FakeUpstreamConfig(
        port=0, seed=3, chunk_latency_ms=1500, output_tokens=(60, 60)
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=silent_after_first,
        gateway={"read_timeout_s": 0.5},
    ) as stack:
        path, body, key = request_for("anthropic-messages", True)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                stack.url + path, json=body, headers=auth("anthropic-messages", key)
            ) as resp:
                assert resp.status == 200
                first = await resp.content.readany()
                assert first.startswith(b"event: message_start")
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
            (event,) = await stack.events(1)
            assert event["usage_source"] == "estimated"
            assert event["estimate_reason"] == "upstream_cut"
            assert event["input_tokens"] > 0 and event["output_tokens"] > 0
            await eventually(lambda: stack.upstream.stats.total.client_disconnects == 1)

            # the headers never come within the timeout: nothing reached the client
            stack.upstream.config = silent_after_first.model_copy(
                update={"chunk_latency_ms": 0, "latency_ms": 1500}
            )
            held_before = len(stack.enforcer.holds)
            async with session.post(
                stack.url + path, json=body, headers=auth("anthropic-messages", key)
            ) as resp:
                assert resp.status == 502
                assert (await resp.json())["type"] == "error"
            assert len(stack.enforcer.holds) == held_before

            # chunks 100 ms apart for seconds in all: never 0.5 s silent
            stack.upstream.config = silent_after_first.model_copy(
                update={"chunk_latency_ms": 100, "output_tokens": (40, 40)}
            )
            async with session.post(
                stack.url + path, json=body, headers=auth("anthropic-messages", key)
            ) as resp:
                assert resp.status == 200
                assert (await resp.read()).rstrip().endswith(b'{"type":"message_stop"}')
        events = await stack.events(2)
        assert [e["usage_source"] for e in events] == ["estimated", "reported"]


async def test_identity_comes_from_the_virtual_key_only(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Unknown keys get 401, a key for another API 403, and no header changes the principal."""
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        await request.read()
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "gpt-4o",
                "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    echo_url = f"http://127.0.0.1:{port}"
    try:
        async with gateway_stack(
            kafka_bootstrap,
            topics,
            tmp_path,
            gateway={
                "upstreams": {
                    "openai": {"api": "openai", "base_url": echo_url},
                    "anthropic": {"api": "anthropic", "base_url": echo_url},
                    "gemini": {"api": "gemini", "base_url": echo_url},
                    "bedrock": {"api": "bedrock", "base_url": echo_url},
                }
            },
        ) as stack:
            path, body, key = request_for("openai-chat", False)
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    stack.url + path,
                    json=body,
                    headers={"Authorization": "Bearer vk-nope-0000000000"},
                ) as resp:
                    assert resp.status == 401
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"
                async with session.post(
                    stack.url + "/v1/messages",
                    json=body,
                    headers={"x-api-key": key},  # an OpenAI key on the Anthropic API
                ) as resp:
                    assert resp.status == 403
                    assert (await resp.json())["error"]["type"] == "permission_error"
                spoof = {
                    "Authorization": f"Bearer {key}",
                    "X-Spend-Org": "globex",
                    "X-Spend-User": "ceo@globex.com",
                    "X-Spend-Session": "job-42",
                    "OpenAI-Organization": "org-someone-else",
                    "x-api-key": KEY_OF["sk-anthropic"],
                }
                async with session.post(stack.url + path, json=body, headers=spoof) as resp:
                    assert resp.status == 200
            assert len(seen) == 1  # neither refusal reached the upstream
            forwarded = {k.lower(): v for k, v in seen[0].items()}
            assert forwarded["authorization"] == "Bearer real-openai-credential-1234"
            assert "x-api-key" not in forwarded
            assert not any(k.startswith("x-spend-") for k in forwarded)
            assert "openai-organization" not in forwarded  # the operator's key bills as set up
            (event,) = await stack.events(1)
            assert event["org_id"] == "acme" and event["secret_id"] == "sk-openai"
            assert event["user_id"] == "acme-openai@example.com"
            assert event["session_id"] == "acme/job-42"  # the header, scoped by the key's org
            assert (event["input_tokens"], event["output_tokens"]) == (10, 2)
    finally:
        await runner.cleanup()


async def test_spending_through_the_gateway_refuses_before_any_verdict(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Reserve-and-settle: settled holds count until the aggregator's verdicts cover them."""
    from schemas.budgets import Budget
    from schemas.periods import parse_window

    tight = Budget(
        budget_id="acme-tight",
        scope="secret",
        window=parse_window("day"),
        match={"secret_id": ("sk-anthropic",)},
        limit_nanos=60_000_000,  # $0.06: a few 1k-token answers of claude-sonnet-4-5
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[tight],
        upstream=FakeUpstreamConfig(port=0, seed=2, output_tokens=(900, 1000)),
    ) as stack:
        path, body, key = request_for("anthropic-messages", True)
        statuses: list[int] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(12):
                async with session.post(
                    stack.url + path, json=body, headers=auth("anthropic-messages", key)
                ) as resp:
                    await resp.read()
                    statuses.append(resp.status)
                    if resp.status != 200:
                        refusal = await resp.json()
        assert 200 in statuses and statuses[-1] == 402
        first_refusal = statuses.index(402)
        assert set(statuses[first_refusal:]) == {402}
        assert refusal["error"] == "in_flight_budget_exceeded"
        stats = await stack.upstream_stats()
        assert stats["requests"] == first_refusal  # refusals never reached the provider
        events = await stack.events(len(statuses))
        assert [e["outcome"] for e in events].count("refused") == len(statuses) - first_refusal


async def test_token_counting_is_forwarded_but_never_checked_nor_charged(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, verdicts=[exhausted_verdict(BROKE, ["broke"])]
    ) as stack:
        body = {
            "model": "claude-sonnet-4-5",
            "messages": [{"role": "user", "content": "hello " * 40}],
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.url + "/v1/messages/count_tokens",
                json=body,
                headers={"x-api-key": KEY_OF["sk-anthropic-broke"]},  # an exhausted org
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            counted = await resp.json()
        assert counted["input_tokens"] > 0
        stats = await stack.upstream_stats()
        assert stats["routes"]["/v1/messages/count_tokens"]["requests"] == 1
        await stack.publisher.flush(10)
        assert await stack.events(1, timeout=3) == []


def test_the_example_config_parses() -> None:
    from ingest.gateway import load_config

    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "infra" / "gateway" / "gateway.example.yaml")
    assert config.keys and config.upstreams


async def test_warnings_reach_the_client_and_bad_calls_cost_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """X-Spend-Budget on an allowed call past an alert threshold; an oversized body is
    413 and an unreachable upstream 502 (hold released), neither charged."""
    from schemas.budgets import Budget
    from schemas.periods import parse_window

    watched = Budget(
        budget_id="acme-watch",
        scope="org",
        window=parse_window("month"),
        match={"org_id": ("acme",)},
        limit_nanos=5_000_000_000,
        alert_at=(0.5,),
    )
    verdict = exhausted_verdict(watched, ["acme"]) | {
        "state": "alert",
        "spent_nanos": 3_000_000_000,
    }
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[watched],
        verdicts=[verdict],
        gateway={"max_body_bytes": 64 * 1024},
    ) as stack:
        path, body, key = request_for("gemini", True)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                stack.url + path, json=body, headers=auth("gemini", key)
            ) as resp:
                assert resp.status == 200
                await resp.read()
                warning = resp.headers["X-Spend-Budget"]
                assert warning.startswith("acme-watch; scope=org; used=60%; state=alert")
            huge = {**body, "padding": "x" * 100_000}
            async with session.post(
                stack.url + path, json=huge, headers=auth("gemini", key)
            ) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"]["status"] == "INVALID_ARGUMENT"
            held_before = len(stack.enforcer.holds)
            await stack.upstream.stop()  # the provider is gone
            bedrock_path, bedrock_body, bedrock_key = request_for("bedrock-converse", False)
            async with session.post(
                stack.url + bedrock_path,
                json=bedrock_body,
                headers=auth("bedrock-converse", bedrock_key),
            ) as resp:
                assert resp.status == 502
                assert resp.headers["x-amzn-ErrorType"] == "ServiceUnavailableException"
            assert len(stack.enforcer.holds) == held_before  # its hold was released
        events = await stack.events(3, timeout=5)
        assert [e["api"] for e in events] == ["gemini"]  # only the call that was served


async def test_a_publish_failure_never_breaks_the_response(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(kafka_bootstrap, topics, tmp_path) as stack:
        await stack.publisher.stop()  # publish() now raises PublisherClosed
        path, body, key = request_for("openai-responses", True)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.url + path, json=body, headers=auth("openai-responses", key)
            ) as resp,
        ):
            assert resp.status == 200
            assert b"response.completed" in await resp.read()
        await stack.gateway.drain()
        errors = stack.gateway.metrics.published.labels("error")._value.get()
        assert errors == 1


async def test_encoded_bodies_pass_encoded_and_are_still_metered(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap, topics, tmp_path, upstream=FakeUpstreamConfig(port=0, seed=9, gzip=True)
    ) as stack:
        raw: list[bytes] = []
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            for base, extra in ((stack.url, True), (stack.upstream.url, False)):
                path, body, key = request_for("anthropic-messages", stream=False)
                headers = {
                    **(auth("anthropic-messages", key) if extra else {}),
                    "Accept-Encoding": "gzip",
                }
                async with session.post(base + path, json=body, headers=headers) as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Encoding"] == "gzip"
                    raw.append(await resp.read())
        assert raw[0] == raw[1]  # the gateway relayed the provider's gzip bytes untouched
        (event,) = await stack.events(1)
        assert event["usage_source"] == "reported"
        assert event["output_tokens"] == stack.upstream.stats.total.usage["output_tokens"] // 2

"""The official openai and anthropic SDKs as clients of the gateway, end to end.

Each SDK points its base URL at the gateway with a virtual key, as a team would.
What the SDK reads back must be what the provider sent, what the pipeline is
charged must be what the provider billed, and once the budget is spent the SDK
raises its own error class.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from schemas.budgets import Budget, RateLimit
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from tests.gateway.kit import KEY_OF, PROMPT, eventually, gateway_stack

pytestmark = pytest.mark.integration


def tight(secret: str, usd_nanos: int) -> Budget:
    return Budget(
        budget_id=f"tight-{secret}",
        scope="secret",
        window=parse_window("day"),
        match={"secret_id": (secret,)},
        limit_nanos=usd_nanos,
    )


def openai_client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def anthropic_client(url: str, key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


def charged(event: dict[str, Any]) -> tuple[int, int]:
    """(every input-side token, output tokens) of an event."""
    inputs = event["input_tokens"] + event["cache_read_tokens"] + event["cache_write_tokens"]
    return inputs, event["output_tokens"]


async def test_openai_sdk_chat_and_responses_streamed_and_not(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=11, cache_ratio=0.5),
    ) as stack:
        client = openai_client(stack.url, KEY_OF["sk-openai"])
        seen: list[tuple[int, int]] = []
        chat = await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": PROMPT}]
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None
        seen.append((chat.usage.prompt_tokens, chat.usage.completion_tokens))

        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text and usage is not None
        seen.append((usage.prompt_tokens, usage.completion_tokens))

        response = await client.responses.create(model="gpt-5", input=PROMPT, max_output_tokens=800)
        assert response.output_text and response.usage is not None
        seen.append((response.usage.input_tokens, response.usage.output_tokens))

        streamed = await client.responses.create(
            model="gpt-5", input=PROMPT, max_output_tokens=800, stream=True
        )
        completed = None
        async for event in streamed:
            if event.type == "response.completed":
                completed = event.response
        assert completed is not None and completed.usage is not None
        seen.append((completed.usage.input_tokens, completed.usage.output_tokens))
        await client.close()

        events = await stack.events(4)
        assert [charged(e) for e in events] == seen  # what the SDK saw is what was charged
        assert all(e["usage_source"] == "reported" for e in events)
        assert [(e["api"], e["stream"]) for e in events] == [
            ("openai-chat", False),
            ("openai-chat", True),
            ("openai-responses", False),
            ("openai-responses", True),
        ]


async def test_anthropic_sdk_messages_streamed_and_not_and_count_tokens(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        upstream=FakeUpstreamConfig(port=0, seed=12, cache_ratio=0.5),
    ) as stack:
        client = anthropic_client(stack.url, KEY_OF["sk-anthropic"])
        message = await client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=1024,
            messages=[{"role": "user", "content": PROMPT}],
        )
        assert message.content and message.usage.output_tokens > 0
        whole = message.usage

        async with client.messages.stream(
            model="claude-haiku-4-5",
            max_tokens=1024,
            messages=[{"role": "user", "content": PROMPT}],
        ) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        assert text
        counted = await client.messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": PROMPT}]
        )
        assert counted.input_tokens > 0
        await client.close()

        events = await stack.events(2)
        assert len(events) == 2  # token counting is not charged
        for event, usage in zip(events, (whole, final.usage), strict=True):
            assert event["input_tokens"] == usage.input_tokens
            assert event["cache_read_tokens"] == (usage.cache_read_input_tokens or 0)
            assert event["cache_write_tokens"] == (usage.cache_creation_input_tokens or 0)
            assert event["output_tokens"] == usage.output_tokens
            assert event["usage_source"] == "reported"


async def test_sdks_raise_their_rate_limit_errors_once_the_budget_is_spent(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Native refusals: spending through the gateway until the SDK raises its own error."""
    budgets = [tight("sk-openai", 30_000_000), tight("sk-anthropic", 60_000_000)]
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=budgets,
        enforcer={"refusal_style": "native"},
        upstream=FakeUpstreamConfig(port=0, seed=13, output_tokens=(900, 1000)),
    ) as stack:
        oa = openai_client(stack.url, KEY_OF["sk-openai"])
        ok = 0
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(20):
                stream = await oa.chat.completions.create(
                    model="gpt-4o",
                    messages=[{"role": "user", "content": PROMPT}],
                    max_tokens=1000,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async for _chunk in stream:
                    pass
                ok += 1
        assert ok >= 1
        assert refused.value.status_code == 429
        assert refused.value.code == "insufficient_quota"
        assert "tight-sk-openai" in refused.value.message
        await oa.close()

        an = anthropic_client(stack.url, KEY_OF["sk-anthropic"])
        ok_anthropic = 0
        with pytest.raises(anthropic.RateLimitError) as refused_a:
            for _ in range(20):
                await an.messages.create(
                    model="claude-sonnet-4-5",
                    max_tokens=1000,
                    messages=[{"role": "user", "content": PROMPT}],
                )
                ok_anthropic += 1
        assert ok_anthropic >= 1
        assert refused_a.value.status_code == 429
        assert refused_a.value.response.headers.get("retry-after")
        await an.close()

        stats = await stack.upstream_stats()
        assert stats["requests"] == ok + ok_anthropic  # the refusals never reached it
        events = await stack.events(ok + ok_anthropic + 2)
        refusals = [e for e in events if e["outcome"] == "refused"]
        assert {e["decision_budget_id"] for e in refusals} == {
            "tight-sk-openai",
            "tight-sk-anthropic",
        }


async def test_default_refusals_reach_the_sdk_as_a_402_status_error(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[tight("sk-openai", 1)],  # one nano: the first estimate is already over
    ) as stack:
        oa = openai_client(stack.url, KEY_OF["sk-openai"])
        with pytest.raises(openai.APIStatusError) as refused:
            await oa.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": PROMPT}]
            )
        await oa.close()
        assert refused.value.status_code == 402
        assert not isinstance(refused.value, openai.RateLimitError)
        # the SDK keeps the "error" member as the body; the whole answer is spendbus's.
        # Nothing is in flight: the request is too large for what is left, not "in flight"
        assert refused.value.body == "budget_exceeded"
        answer = refused.value.response.json()
        assert answer["budget_id"] == "tight-sk-openai"
        assert answer["reason"] == "request_too_large" and answer["held_nanos"] == 0
        assert answer["remaining_nanos"] == 1 and answer["max_tokens_that_fits"] is None
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert (await stack.upstream_stats())["requests"] == 0


def _fitting_max_tokens(message: str) -> int:
    match = re.search(r"The largest max_tokens that fits now is (\d+)\.", message)
    assert match is not None, message
    return int(match.group(1))


async def test_a_request_too_large_for_what_is_left_is_not_retried_by_the_sdk(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Native style, the SDK's default retries on: a request whose worst case does not fit
    what is left is refused once (no retry for nothing), with the max_tokens that fits;
    asking for that many passes."""
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[tight("sk-openai", 20_000_000)],  # $0.02; 8000 output tokens = $0.08
        enforcer={"refusal_style": "native"},
        upstream=FakeUpstreamConfig(port=0, seed=21, output_tokens=(40, 60)),
    ) as stack:
        oa = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEY_OF["sk-openai"])
        assert oa.max_retries == 2  # the SDK's default
        with pytest.raises(openai.RateLimitError) as refused:
            # max_tokens given (4 digits): the same request with the fitting number is no
            # larger, so the gateway's input estimate (from the body's size) stays the same
            await oa.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": PROMPT}], max_tokens=8000
            )
        headers = refused.value.response.headers
        assert headers["x-should-retry"] == "false" and "retry-after" in headers
        assert int(headers["retry-after"]) > 60  # the day's reset, not "soon"
        message = refused.value.message
        assert "does not fit what is left ($0.020000)" in message
        fit = _fitting_max_tokens(message)
        assert 1000 < fit < 2000
        assert stack.enforcer.metrics.decisions["budget_exceeded"] == 1  # one attempt only
        assert stack.enforcer.metrics.decisions["in_flight_budget_exceeded"] == 0
        chat = await oa.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": PROMPT}], max_tokens=fit
        )
        assert chat.choices[0].message.content
        await oa.close()
        assert (await stack.upstream_stats())["requests"] == 1


async def test_an_in_flight_refusal_is_retried_by_the_sdk_once_the_hold_is_gone(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Another request in flight holds most of what is left: the SDK's request is refused
    in flight (Retry-After 5, retry allowed); with its default retries it passes once the
    other request's hold is released."""
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[tight("sk-anthropic", 25_000_000)],
        enforcer={"refusal_style": "native"},
        upstream=FakeUpstreamConfig(port=0, seed=22, output_tokens=(40, 60)),
    ) as stack:
        # a request in flight on this replica (the same counter): $0.015 held
        other = stack.enforcer.check(
            stack.enforcer.context(
                org_id="acme",
                secret_id="sk-anthropic",
                provider="anthropic",
                model="claude-sonnet-4-5",
                input_tokens=0,
                max_output_tokens=1000,
            )
        )
        assert other.allowed and other.hold_id is not None
        request = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1000,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        no_retries = anthropic_client(stack.url, KEY_OF["sk-anthropic"])
        with pytest.raises(anthropic.RateLimitError) as refused:
            await no_retries.messages.create(**request)  # type: ignore[call-overload]  # one dict for both clients: the SDK's typed params aside
        await no_retries.close()
        headers = refused.value.response.headers
        assert headers["retry-after"] == "5" and headers["x-should-retry"] == "true"
        assert "the requests in flight could use what is left" in refused.value.message

        retrying = anthropic.AsyncAnthropic(base_url=stack.url, api_key=KEY_OF["sk-anthropic"])
        answer = asyncio.create_task(retrying.messages.create(**request))  # type: ignore[call-overload]  # one dict for both clients: the SDK's typed params aside
        await eventually(lambda: stack.enforcer.metrics.decisions["in_flight_budget_exceeded"] == 2)
        assert not answer.done()  # the SDK waits Retry-After before its retry
        assert stack.enforcer.release(other.hold_id)
        message = await answer
        assert message.content and message.usage.output_tokens > 0
        await retrying.close()
        decisions = stack.enforcer.metrics.decisions
        assert decisions["in_flight_budget_exceeded"] == 2 and decisions["allowed"] == 2
        assert decisions["budget_exceeded"] == 0
        assert (await stack.upstream_stats())["requests"] == 1


async def test_a_rate_limit_throttles_with_429_and_the_sdk_retries_after_it(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A budget's rate (60 requests a minute: a bucket of 2): the third request at once is
    throttled, 429 with Retry-After and retry-after-ms, its refusal event says
    ``throttled``; the SDK's own retry waits retry-after-ms and passes."""
    rated = Budget(
        budget_id="rate-sk-openai",
        scope="secret",
        window=parse_window("total"),
        match={"secret_id": ("sk-openai",)},
        rate=RateLimit(requests_per_minute=60),
    )
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        budgets=[rated],
        enforcer={"refusal_style": "native"},
        upstream=FakeUpstreamConfig(port=0, seed=23, output_tokens=(10, 20)),
    ) as stack:
        request = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
        once = openai_client(stack.url, KEY_OF["sk-openai"])
        for _ in range(2):
            await once.chat.completions.create(**request)  # type: ignore[call-overload]  # one dict for every call: the SDK's typed params aside
        with pytest.raises(openai.RateLimitError) as refused:
            await once.chat.completions.create(**request)  # type: ignore[call-overload]  # one dict for every call: the SDK's typed params aside
        await once.close()
        assert refused.value.code == "rate_limit_exceeded"
        headers = refused.value.response.headers
        assert headers["retry-after"] == "1" and 0 < int(headers["retry-after-ms"]) <= 1000
        assert headers["x-should-retry"] == "true"
        retrying = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEY_OF["sk-openai"])
        chat = await retrying.chat.completions.create(**request)  # type: ignore[call-overload]  # one dict for every call: the SDK's typed params aside
        await retrying.close()
        assert chat.choices[0].message.content
        decisions = stack.enforcer.metrics.decisions
        # the retrying client's first try is throttled too unless a second passed since
        assert decisions["allowed"] == 3 and decisions["throttled"] in (1, 2)
        events = await stack.events(3 + decisions["throttled"])
        throttled = [e for e in events if e["decision"] == "throttled"]
        assert len(throttled) == decisions["throttled"]
        assert all(e["outcome"] == "refused" and e["status_code"] == 429 for e in throttled)
        assert {e["decision_budget_id"] for e in throttled} == {"rate-sk-openai"}
        assert (await stack.upstream_stats())["requests"] == 3

"""The official openai and anthropic SDKs as clients of the gateway, end to end.

Each SDK points its base URL at the gateway with a virtual key, as a team would.
What the SDK reads back must be what the provider sent, what the pipeline is
charged must be what the provider billed, and once the budget is spent the SDK
raises its own error class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from gateway_kit import KEY_OF, PROMPT, gateway_stack

from schemas.budgets import Budget
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig

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
        # the SDK keeps the "error" member as the body; the whole answer is spendbus's
        assert refused.value.body == "in_flight_budget_exceeded"
        assert refused.value.response.json()["budget_id"] == "tight-sk-openai"
        assert (await stack.upstream_stats())["requests"] == 0

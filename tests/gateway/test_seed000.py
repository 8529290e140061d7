"""Seed 000's refusal body through the gateway, read by real HTTP clients (issue 37 item 5).

`refusal_style: seed000` is pinned field by field in the enforcer
(tests/enforcer/test_refusals.py); here the same answer crosses the gateway: an aiohttp
client and the openai SDK read exactly `{"error", "secretId", "period", "limitCents",
"spentCents"}`, a Retry-After to the period's end, `x-should-retry: false` (so the SDK
does not retry for nothing) and the message in `X-Spend-Refusal`; nothing reaches the
provider and each refusal is on the ledger.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import openai
import pytest

from schemas.periods import period_end, period_key
from schemas.topics import Topics
from tests.gateway.kit import BROKE, KEY_OF, exhausted_verdict, gateway_stack, request_for

pytestmark = pytest.mark.integration

#: what BROKE ($5, org broke) reads once exhausted: 500 cents of 500
LIMIT_CENTS = 500


def expected_body(secret_id: str) -> dict[str, Any]:
    return {
        "error": "budget_exceeded",
        "secretId": secret_id,
        "period": period_key(BROKE.window, datetime.now(UTC)),
        "limitCents": LIMIT_CENTS,
        "spentCents": LIMIT_CENTS,
    }


async def test_seed000_bodies_reach_http_clients_exactly(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        verdicts=[exhausted_verdict(BROKE, ["broke"])],
        enforcer={"refusal_style": "seed000"},
    ) as stack:
        calls = [
            ("openai-chat", True, {"Authorization": f"Bearer {KEY_OF['sk-openai-broke']}"}),
            (
                "anthropic-messages",
                False,
                {"x-api-key": KEY_OF["sk-anthropic-broke"], "anthropic-version": "2023-06-01"},
            ),
        ]
        async with aiohttp.ClientSession() as session:
            for fmt, stream, headers in calls:
                path, body, _ = request_for(fmt, stream)
                async with session.post(stack.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 402
                    assert resp.content_type == "application/json"
                    secret = "sk-openai-broke" if fmt == "openai-chat" else "sk-anthropic-broke"
                    assert await resp.json() == expected_body(secret)
                    # the month's end, seconds away (rounded up), as the enforcer counts
                    end = period_end(BROKE.window, datetime.now(UTC))
                    assert end is not None
                    retry_after = int(resp.headers["Retry-After"])
                    assert 0 < retry_after <= math.ceil(end.timestamp() - time.time()) + 1
                    assert resp.headers["x-should-retry"] == "false"
                    message = unquote(resp.headers["X-Spend-Refusal"])
                    assert message.startswith("Budget 'broke-monthly' is exhausted")
        assert (await stack.upstream_stats())["requests"] == 0
        events = await stack.events(2)
        assert [(e["outcome"], e["decision"], e["status_code"]) for e in events] == [
            ("refused", "budget_exceeded", 402)
        ] * 2
        assert {e["secret_id"] for e in events} == {"sk-openai-broke", "sk-anthropic-broke"}


async def test_the_openai_sdk_reads_seed000_once_and_does_not_retry(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with gateway_stack(
        kafka_bootstrap,
        topics,
        tmp_path,
        verdicts=[exhausted_verdict(BROKE, ["broke"])],
        enforcer={"refusal_style": "seed000"},
    ) as stack:
        # the SDK's default: two retries of what its rules call retryable
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEY_OF["sk-openai-broke"])
        assert client.max_retries == 2
        _, body, _ = request_for("openai-chat", False)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(**body)
        assert refused.value.status_code == 402
        assert refused.value.response.json() == expected_body("sk-openai-broke")
        await client.close()
        # x-should-retry: false was obeyed: one refusal reached the gateway, none the provider
        await stack.publisher.flush(30)
        assert stack.enforcer.metrics.decisions["budget_exceeded"] == 1
        assert (await stack.upstream_stats())["requests"] == 0

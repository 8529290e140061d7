"""What the gateway holds and charges when a request can cost more than one answer's
worth (issue 21, "Estimates"): candidates, asked-for streamed usage, background mode."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from gateway_kit import KEY_OF, PROMPT, gateway_stack

from schemas.budgets import Budget
from schemas.periods import parse_window
from schemas.topics import Topics

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

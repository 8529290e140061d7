"""The fake's usage: validated, fitted to what each provider can report, and drawn
for a request the way the server bills it."""

from __future__ import annotations

import json
import random

import pytest

from spendbus.fake_upstream import FORMATS, FakeUsage, fit_usage, synthesize, usage_for_request
from spendbus.fake_upstream.formats import CACHE_WRITES, REASONING_APART


def test_fit_usage_folds_what_a_provider_cannot_report() -> None:
    usage = FakeUsage(
        100,
        50,
        cache_read_tokens=10,
        cache_write_tokens=30,
        cache_write_1h_tokens=20,
        reasoning_tokens=5,
    )
    for fmt in FORMATS:
        fitted = fit_usage(fmt, usage)
        assert fitted.total_tokens == usage.total_tokens  # nothing billed disappears
        if fmt in CACHE_WRITES:
            assert (fitted.cache_write_tokens, fitted.cache_write_1h_tokens) == (30, 20)
            assert fitted.reasoning_tokens == 0  # thinking is inside output, not apart
        else:
            assert fitted.cache_write_tokens == 0 and fitted.input_tokens == 130
            assert fitted.reasoning_tokens == 5


def test_fake_usage_is_validated() -> None:
    with pytest.raises(ValueError):
        FakeUsage(-1, 0)
    with pytest.raises(ValueError):
        FakeUsage(1, 1, cache_write_tokens=1, cache_write_1h_tokens=2)
    with pytest.raises(ValueError):
        FakeUsage(1, 1, reasoning_tokens=2)
    with pytest.raises(ValueError):
        synthesize("cohere", model="x", usage=FakeUsage(1, 1), stream=True, rng=random.Random())


def test_usage_for_request_follows_the_request() -> None:
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "messages": [{"role": "user", "content": "y" * 4_000}],
    }
    size = len(json.dumps(request))
    plain = usage_for_request(
        "anthropic-messages", request, size=size, rng=random.Random(1), output_tokens=(10, 10_000)
    )
    assert plain.prompt_tokens == -(-size // 4)
    assert plain.cache_read_tokens == plain.cache_write_tokens == 0
    assert plain.output_tokens <= 64
    hit = usage_for_request(
        "anthropic-messages", request, size=size, rng=random.Random(1), cache_ratio=1.0
    )
    assert hit.cache_read_tokens > 0.5 * hit.prompt_tokens and hit.cache_write_tokens == 0
    for seed in range(20):
        miss = usage_for_request(
            "anthropic-messages",
            request,
            size=size,
            rng=random.Random(seed),
            cache_ratio=0.01,
        )
        if miss.cache_write_tokens:
            assert miss.cache_write_1h_tokens == miss.cache_write_tokens
            break
    else:
        pytest.fail("a cache miss never wrote the cache")
    for fmt in REASONING_APART:
        openai = usage_for_request(
            fmt,
            {"model": "gpt-4o", "reasoning_effort": "high", "reasoning": {"effort": "high"}},
            size=100,
            rng=random.Random(2),
            cache_ratio=0.0,
            model="gemini-2.5-pro" if fmt == "gemini" else "o3",
        )
        assert 0 < openai.reasoning_tokens < openai.output_tokens

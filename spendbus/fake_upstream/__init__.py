"""A realistic stand-in for the LLM providers, for tests, the demo and benchmarks.

::

    from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig, synthesize

    exchange = synthesize("anthropic-messages", model="claude-sonnet-4-5",
                          usage=FakeUsage(input_tokens=120, output_tokens=40),
                          stream=True, rng=random.Random(1))
    exchange.chunks       # the SSE events, as Anthropic streams them

    async with FakeUpstream(FakeUpstreamConfig(port=0, cut_rate=0.05)) as upstream:
        ...               # POST upstream.url + "/v1/messages", GET /stats

``responses`` builds each provider's bytes (pure, seeded); ``server`` serves
them on the providers' paths with latencies, errors and cut streams.
"""

from __future__ import annotations

from .responses import (
    FORMATS,
    FakeExchange,
    FakeUsage,
    build_request,
    fit_usage,
    random_usage,
    synthesize,
    synthesize_error,
    usage_for_request,
)
from .server import ROUTES, FakeUpstream, FakeUpstreamConfig, make_app

__all__ = [
    "FORMATS",
    "ROUTES",
    "FakeExchange",
    "FakeUpstream",
    "FakeUpstreamConfig",
    "FakeUsage",
    "build_request",
    "fit_usage",
    "make_app",
    "random_usage",
    "synthesize",
    "synthesize_error",
    "usage_for_request",
]

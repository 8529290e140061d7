"""A realistic stand-in for the LLM providers, for tests, the demo and benchmarks.

::

    from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig, synthesize

    exchange = synthesize("anthropic-messages", model="claude-sonnet-4-5",
                          usage=FakeUsage(input_tokens=120, output_tokens=40),
                          stream=True, rng=random.Random(1))
    exchange.chunks       # the SSE events, as Anthropic streams them

    async with FakeUpstream(FakeUpstreamConfig(port=0, cut_rate=0.05)) as upstream:
        ...               # POST upstream.url + "/v1/messages", GET /stats

``exchange`` assembles each provider's bytes (pure, seeded), built by the module named
after the provider as in ``ingest/taps/`` (``anthropic``, ``openai_chat``,
``openai_responses``, ``gemini``, ``bedrock``, ``bedrock_invoke``); ``server`` serves
them on the providers' paths (``answer``: latencies, errors and cut streams;
``realtime``: the Realtime WebSocket), counting what it served in ``stats``; ``hostile``
writes an answer whose usage reads lower than it billed (issue 32); ``billing`` keeps
every call billed and serves the providers' admin usage reports of them, and Gemini's
as a Cloud Billing export (issue 41).
"""

from __future__ import annotations

from .config import FakeUpstreamConfig
from .exchange import FakeExchange, build_request, synthesize, synthesize_error
from .formats import FORMATS
from .routes import ROUTES
from .server import FakeUpstream, make_app
from .usage import FakeUsage, fit_usage, random_usage, usage_for_request

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

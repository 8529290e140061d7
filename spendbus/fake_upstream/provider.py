"""What a provider's module builds from and what it gives the synthesizer (exchange.py).

A :class:`RequestPlan` says what one built request is made of (its prompt and output
limit drawn first, the same for every format, so a seed gives the same text in each),
an :class:`AnswerPlan` what one answer is made of; a :class:`Provider` is one format's
builders: request, body, stream, headers, error body and in-stream error.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .formats import CHARS_PER_TOKEN
from .text import make_text
from .usage import FakeUsage


@dataclass(frozen=True)
class RequestPlan:
    """What one built request is made of (see :func:`draw_request_plan`)."""

    model: str
    usage: FakeUsage
    stream: bool
    rng: random.Random
    server_tools: int
    system: str
    question: str
    #: the usage reads or writes the prompt cache / writes it with a 1-hour TTL
    cached: bool
    one_hour: bool
    reasoning: bool
    #: the request's output limit
    limit: int


def draw_request_plan(
    *,
    model: str,
    usage: FakeUsage,
    stream: bool,
    rng: random.Random,
    server_tools: int,
    prompt_chars: int | None,
) -> RequestPlan:
    """The prompt (``prompt_chars``, default about 4 per input token, at most 8 KiB)
    and output limit of a request that could have been billed ``usage``."""
    if prompt_chars is None:
        prompt_chars = min(usage.prompt_tokens * CHARS_PER_TOKEN, 8_192)
    system = "You are a careful assistant for the finance team. " + make_text(
        rng, max(0, prompt_chars // 3 - 50)
    )
    question = make_text(rng, max(8, prompt_chars - len(system)))
    return RequestPlan(
        model=model,
        usage=usage,
        stream=stream,
        rng=rng,
        server_tools=server_tools,
        system=system,
        question=question,
        cached=bool(usage.cache_read_tokens or usage.cache_write_tokens),
        one_hour=usage.cache_write_1h_tokens > 0,
        reasoning=usage.reasoning_tokens > 0,
        limit=output_limit(rng, usage.output_tokens),
    )


_LIMITS = (1_024, 2_048, 4_096, 8_192, 16_384, 32_000, 64_000)


def output_limit(rng: random.Random, at_least: int) -> int:
    """A round max-tokens setting a client would pick, at least ``at_least``."""
    choices = [n for n in _LIMITS if n >= at_least]
    return rng.choice(choices) if choices else at_least


@dataclass
class AnswerPlan:
    """What one synthesized answer is made of."""

    fmt: str
    model: str
    usage: FakeUsage
    request: dict[str, Any]
    rng: random.Random
    text: str
    thinking: str
    server_tools: int
    stop_at_limit: bool


#: (error body, response headers, description) of an error status
ErrorAnswer = tuple[dict[str, Any], dict[str, str], str]


@dataclass(frozen=True)
class Provider:
    """One format's builders, as :mod:`.exchange` calls them."""

    fmt: str
    request: Callable[[RequestPlan], dict[str, Any]]
    body: Callable[[AnswerPlan], bytes]
    #: the streamed chunks and how many carry the usage whole (None: never)
    stream: Callable[[AnswerPlan], tuple[list[bytes], int | None]]
    headers: Callable[[random.Random], dict[str, str]]
    #: the JSON error answering (status, rng, message or None for the provider's own)
    error: Callable[[int, random.Random, str | None], ErrorAnswer]
    #: the error sent inside a 200 stream after N chunks: (description, chunk)
    stream_error: Callable[[AnswerPlan, int], tuple[str, bytes]]

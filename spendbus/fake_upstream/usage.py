"""The usage a fake provider bills: normalised (:class:`FakeUsage`), fitted to what a
format can report, drawn at random or for a given request.

What a provider cannot report is folded the way it bills: :func:`fit_usage`
turns cache writes into plain input for OpenAI and Gemini and drops the
reasoning split for Anthropic and Bedrock; ``FakeExchange.usage`` is the
fitted usage, the one a correct tap reads back.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Any

from .formats import CACHE_WRITES, CHARS_PER_TOKEN, REASONING_APART, check_fmt
from .request import asks_1h_ttl, max_output_tokens, reasoning_enabled


@dataclass(frozen=True)
class FakeUsage:
    """Normalised usage: ``input_tokens`` excludes cache reads and writes,
    ``output_tokens`` includes ``reasoning_tokens``."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.cache_write_1h_tokens > self.cache_write_tokens:
            raise ValueError("cache_write_1h_tokens exceeds cache_write_tokens")
        if self.reasoning_tokens > self.output_tokens:
            raise ValueError("reasoning_tokens exceeds output_tokens")

    @property
    def total_tokens(self) -> int:
        """Every billed token: input + cache reads + cache writes + output."""
        return (
            self.input_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )

    @property
    def prompt_tokens(self) -> int:
        """Every input-side token (input + cache reads + cache writes)."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


ZERO_USAGE = FakeUsage(0, 0)


def fit_usage(fmt: str, usage: FakeUsage) -> FakeUsage:
    """``usage`` as ``fmt`` can report it (see the module docstring)."""
    check_fmt(fmt)
    if fmt not in CACHE_WRITES and usage.cache_write_tokens:
        usage = replace(
            usage,
            input_tokens=usage.input_tokens + usage.cache_write_tokens,
            cache_write_tokens=0,
            cache_write_1h_tokens=0,
        )
    if fmt not in REASONING_APART and usage.reasoning_tokens:
        usage = replace(usage, reasoning_tokens=0)
    return usage


def random_usage(
    fmt: str,
    rng: random.Random,
    *,
    max_input: int = 50_000,
    max_output: int = 2_000,
    cache: bool = True,
    reasoning: bool = True,
) -> FakeUsage:
    """A plausible usage ``fmt`` can report, over the whole range of its fields."""
    check_fmt(fmt)
    prompt = rng.randint(1, max_input)
    read = write = write_1h = 0
    if cache and rng.random() < 0.6:
        read = rng.randint(0, prompt - 1)
        if fmt in CACHE_WRITES and rng.random() < 0.6:
            write = rng.randint(0, prompt - 1 - read)
            write_1h = rng.choice((0, write, rng.randint(0, write)))
    output = rng.randint(0, max_output)
    thought = 0
    if reasoning and fmt in REASONING_APART and rng.random() < 0.5:
        thought = rng.randint(0, output)
    return FakeUsage(
        input_tokens=prompt - read - write,
        output_tokens=output,
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write_1h,
        reasoning_tokens=thought,
    )


def usage_for_request(
    fmt: str,
    request: dict[str, Any],
    *,
    size: int,
    rng: random.Random,
    cache_ratio: float = 0.0,
    output_tokens: tuple[int, int] = (16, 512),
    model: str | None = None,
) -> FakeUsage:
    """The usage a provider would bill for ``request`` (``size`` bytes).

    The prompt is about ``size / 4`` tokens. With probability ``cache_ratio``
    most of it (60-95 %) is read from the prompt cache; otherwise, for
    providers that bill cache writes and when ``cache_ratio`` > 0, that prefix
    is written (with a 1-hour TTL when the request asks for one). The output is
    drawn from ``output_tokens`` and capped by the request's max tokens; when
    the request enables reasoning, part of it is reasoning.
    """
    check_fmt(fmt)
    prompt = max(1, math.ceil(size / CHARS_PER_TOKEN))
    read = write = write_1h = 0
    if cache_ratio > 0 and prompt > 1:
        prefix = min(prompt - 1, int(prompt * rng.uniform(0.6, 0.95)))
        if rng.random() < cache_ratio:
            read = prefix
        elif fmt in CACHE_WRITES:
            write = prefix
            write_1h = write if asks_1h_ttl(fmt, request) else 0
    lo, hi = output_tokens
    output = rng.randint(min(lo, hi), max(lo, hi))
    limit = max_output_tokens(fmt, request)
    if limit is not None:
        output = min(output, limit)
    thought = 0
    if output and reasoning_enabled(fmt, request, model):
        thought = int(output * rng.uniform(0.2, 0.7))
    return fit_usage(
        fmt,
        FakeUsage(
            input_tokens=prompt - read - write,
            output_tokens=output,
            cache_read_tokens=read,
            cache_write_tokens=write,
            cache_write_1h_tokens=write_1h,
            reasoning_tokens=thought,
        ),
    )

"""Pessimistic estimates for responses whose usage is missing (docs/design.md invariant 7).

Output: the text of the delta events / 4, at least 1 per delta event (the
decoded body bytes / 4 when not streamed), capped at the cap: the request's max
output tokens (else ``EstimatorConfig.output_cap``) times its candidates (OpenAI
``n``, Gemini ``candidateCount``: each candidate may write up to the max); when
the request enables reasoning, at least its thinking budget per candidate, or the
cap when it names no budget (OpenAI's efforts, a reasoning model by default,
Gemini's thinking levels: what they think is bounded by the max output only); at
least what a partial report already counted. When the output could not be read at
all (undecodable body, lost framing), or the request runs in the background (the
response goes on generating after the answer, whose usage is null), it is the cap:
seed 003 charges an undecodable body its bytes / 4, but those are the bytes of an
encoding the tap could not undo (compressed, or cut from their framing), which say
nothing of the text, so only the cap bounds what was generated (ingest/taps/README.md).

Input: the counts reported so far when the stream carried them (Anthropic's
``message_start``, a partial ``usageMetadata``; when a report was invalid, at least
the request's estimate too: the valid ones may be an upstream's zero repeats), else
request bytes / 3 (``schemas.usage.REQUEST_BYTES_PER_TOKEN``, the enforcer's hold's rule
too), and at least ``server_state_input_floor`` when the request names server-side state
(stored responses, conversations, prompts, files by id or URL, server tools,
background mode) or when there is no readable request at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.usage import REQUEST_BYTES_PER_TOKEN

from .request import RequestInfo
from .usage import MAX_TOKENS, Usage

DeltaText = Literal["parsed", "payload_bytes"]


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """Knobs of the estimate (defaults from the issue).

    ``delta_text`` picks how the text of streamed deltas is measured:
    ``"parsed"`` parses every delta event and counts the characters of its text
    fields (exact); ``"payload_bytes"`` skips parsing deltas and counts the bytes
    of their JSON payloads instead, an upper bound of the text (so still
    pessimistic, typically 10-50x higher on token-per-event streams) that costs
    less CPU. Usage itself is always read by parsing.
    """

    output_cap: int = 128_000
    server_state_input_floor: int = 200_000
    #: output text characters per token (the delta text, a decoded body's bytes)
    chars_per_token: int = 4
    #: request bytes per input token
    request_bytes_per_token: int = REQUEST_BYTES_PER_TOKEN
    delta_text: DeltaText = "parsed"

    def __post_init__(self) -> None:
        for name in ("output_cap", "server_state_input_floor"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_TOKENS:
                raise ValueError(f"{name} must be an int in [0, {MAX_TOKENS}], got {value!r}")
        for name in ("chars_per_token", "request_bytes_per_token"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.delta_text not in ("parsed", "payload_bytes"):
            raise ValueError(
                f"delta_text must be 'parsed' or 'payload_bytes', not {self.delta_text!r}"
            )


@dataclass(frozen=True, slots=True)
class Observed:
    """What a tap saw of a response whose usage is missing."""

    streaming: bool
    delta_events: int = 0
    text_chars: int = 0
    reasoning_chars: int = 0
    body_bytes: int = 0
    output_unknown: bool = False
    partial: Usage | None = None
    #: the partial counts are a floor only: a usage report was invalid, so the valid
    #: ones may be an upstream's lower or zero repeats (input: at least the request's)
    partial_floor: bool = False


def _per_token(chars: int, config: EstimatorConfig) -> int:
    return -(-chars // config.chars_per_token)


def estimate_usage(request: RequestInfo, seen: Observed, config: EstimatorConfig) -> Usage:
    """The estimate charged for a response whose usage is missing."""
    candidates = request.candidates
    cap = (request.max_output_tokens or config.output_cap) * candidates
    if seen.output_unknown or request.background:
        output = cap
    elif seen.streaming:
        output = min(max(_per_token(seen.text_chars, config), seen.delta_events), cap)
    else:
        output = min(_per_token(seen.body_bytes, config), cap)

    reasoning = _per_token(seen.reasoning_chars, config)
    if request.reasoning:
        budget = request.thinking_budget
        if budget is None:
            output = cap
        else:
            output = max(output, budget * candidates)
            reasoning = max(reasoning, budget * candidates)

    partial = seen.partial
    if partial is not None:
        output = max(output, partial.output_tokens)
        reasoning = max(reasoning, partial.reasoning_tokens)
        input_tokens = partial.input_tokens
        if seen.partial_floor:
            input_tokens = max(input_tokens, _request_input(request, config))
        input_side = (
            input_tokens,
            partial.cache_read_tokens,
            partial.cache_write_tokens,
            partial.cache_write_1h_tokens,
        )
    else:
        input_side = (_request_input(request, config), 0, 0, 0)

    output = min(output, MAX_TOKENS)
    return Usage(*input_side, output, min(reasoning, output))


def _request_input(request: RequestInfo, config: EstimatorConfig) -> int:
    """The input a request is estimated at: its bytes / 3, at least the server-state floor
    when it names server-side state or cannot be read."""
    per_token = config.request_bytes_per_token
    if request.size is None or not request.readable:
        input_tokens = config.server_state_input_floor
        if request.size is not None:
            input_tokens = max(input_tokens, -(-request.size // per_token))
    else:
        input_tokens = -(-request.size // per_token)
        if request.server_state:
            input_tokens = max(input_tokens, config.server_state_input_floor)
    return min(input_tokens, MAX_TOKENS)

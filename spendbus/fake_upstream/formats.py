"""The provider formats the fake speaks, and the facts about each that several modules share.

===================  =========================================================
anthropic-messages   ``input_tokens`` excludes cache; ``cache_creation_input_tokens``
                     with ``cache_creation.ephemeral_5m/1h_input_tokens``;
                     ``cache_read_input_tokens``. Streamed: ``message_start``
                     carries the input side, cumulative ``message_delta``\\s the
                     output (several with server tools). Thinking is inside
                     ``output_tokens`` and not reported apart.
openai-chat          ``prompt_tokens`` = input + cache reads
                     (``prompt_tokens_details.cached_tokens``);
                     ``completion_tokens`` includes
                     ``completion_tokens_details.reasoning_tokens``. Streamed:
                     a last chunk with ``choices: []``, only when the request
                     sets ``stream_options.include_usage``. No cache writes.
openai-responses     ``input_tokens`` includes ``input_tokens_details.cached_tokens``;
                     ``output_tokens`` includes ``output_tokens_details.reasoning_tokens``;
                     streamed in ``response.completed`` (``response.incomplete``
                     when the output hit ``max_output_tokens``). No cache writes.
gemini               ``promptTokenCount`` includes ``cachedContentTokenCount``;
                     ``thoughtsTokenCount`` is apart from ``candidatesTokenCount``;
                     with server tools part of the input is
                     ``toolUsePromptTokenCount``. Streamed: every chunk carries a
                     cumulative ``usageMetadata``, the last one is final. No
                     cache writes.
bedrock-converse     ``inputTokens`` excludes cache; ``cacheReadInputTokens``,
                     ``cacheWriteInputTokens`` and ``cacheDetails`` (per TTL,
                     ``1h`` before ``5m``). Streamed: AWS event-stream frames, the
                     usage in the final ``metadata`` event. Reasoning is inside
                     ``outputTokens`` and not reported apart.
bedrock-invoke       Anthropic's body and usage on Bedrock (``invoke``; no ``model``
                     in the request). Streamed (``invoke-with-response-stream``):
                     each Anthropic event base64-encoded in a ``chunk`` event-stream
                     frame; ``message_stop`` adds ``amazon-bedrock-invocationMetrics``.
===================  =========================================================

Each format's bytes are built in the module named after it (as in ``ingest/taps/``).
"""

from __future__ import annotations

FORMATS: tuple[str, ...] = (
    "anthropic-messages",
    "openai-chat",
    "openai-responses",
    "gemini",
    "bedrock-converse",
    "bedrock-invoke",
)

SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"
EVENT_STREAM = "application/vnd.amazon.eventstream"

#: Formats whose usage carries cache writes / their 1-hour part / reasoning apart.
CACHE_WRITES = frozenset({"anthropic-messages", "bedrock-converse", "bedrock-invoke"})
#: Formats whose bodies are Anthropic's Messages (on Bedrock: InvokeModel).
ANTHROPIC_BODIES = frozenset({"anthropic-messages", "bedrock-invoke"})
#: Formats streamed as AWS event-stream frames.
EVENT_STREAMS = frozenset({"bedrock-converse", "bedrock-invoke"})
REASONING_APART = frozenset({"openai-chat", "openai-responses", "gemini"})

#: Characters of generated text per output token.
CHARS_PER_TOKEN = 4

#: (smallest, largest) characters of one streamed text delta, per format.
DELTA_CHARS: dict[str, tuple[int, int]] = {
    "anthropic-messages": (2, 24),  # a few tokens per content_block_delta
    "openai-chat": (1, 9),  # about one token per chunk
    "openai-responses": (1, 9),
    "gemini": (40, 320),  # Gemini streams sentence-sized chunks
    "bedrock-converse": (2, 24),
    "bedrock-invoke": (2, 24),
}


def check_fmt(fmt: str) -> None:
    """Raise ValueError unless ``fmt`` is one of :data:`FORMATS`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def json_type(fmt: str) -> str:
    """The Content-Type of ``fmt``'s JSON bodies."""
    return "application/json; charset=UTF-8" if fmt == "gemini" else JSON

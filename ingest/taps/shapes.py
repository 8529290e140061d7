"""The narrow msgspec shapes of each provider's common event (``base.read_shape``).

Only the fields a handler reads are declared; msgspec skips the rest of the event
without building it. They live apart from the handlers because the handlers are
compiled with mypyc (pyproject.toml, ``taps``) and a Struct is made by msgspec's own
metaclass: this module stays plain Python, the compiled code reads the Structs' fields
as attributes. Shapes are ``gc=False``: what they hold is decoded JSON, which can never
refer back to them, so the garbage collector need not track (nor count) them.
"""

from __future__ import annotations

from typing import Any

import msgspec


class AnthropicText(msgspec.Struct, gc=False):
    text: str


class AnthropicTextDelta(msgspec.Struct, gc=False):
    """``content_block_delta`` of text, the common event: only ``delta.text`` is built."""

    delta: AnthropicText


class ChatDelta(msgspec.Struct, gc=False):
    """The text fields OpenAI chat's ``_delta`` counts; tool calls and audio take the
    general path."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: None = None
    audio: None = None


class ChatChoice(msgspec.Struct, gc=False):
    delta: ChatDelta


class ChatChunk(msgspec.Struct, gc=False):
    """OpenAI chat's common chunk: one choice with a delta, no usage, no error."""

    choices: tuple[ChatChoice]
    usage: None = None
    error: None = None


class ResponsesTextDelta(msgspec.Struct, gc=False):
    """A Responses ``*.delta`` event whose ``delta`` is text: only that field is built."""

    delta: str


class GeminiPart(msgspec.Struct, gc=False):
    """A text part; function calls and code take the general path."""

    text: str | None = None
    thought: bool | None = None
    functionCall: None = None  # the wire names
    executableCode: None = None


class GeminiContent(msgspec.Struct, gc=False):
    parts: list[GeminiPart] | None = None


class GeminiCandidate(msgspec.Struct, gc=False):
    content: GeminiContent | None = None
    finishReason: str | None = None
    index: int | None = None
    #: present (any JSON, not built) when the answer was grounded with Google Search
    groundingMetadata: msgspec.Raw | None = None


#: a count a ``GeminiUsage`` does not carry (no JSON count is negative: one that is,
#: or a count of -1 written out, is read the general way, see gemini.py)
ABSENT = -1


class GeminiUsage(msgspec.Struct, gc=False):
    """The counts of a chunk's ``usageMetadata`` (every chunk carries one, cumulative):
    what each one reports is charged at its field-wise maximum. ``totalTokenCount`` is
    read only to account for every count key of the chunk (gemini.py); the details
    (billed units) are read from the last chunk's whole usage. gemini.py reads the
    fields by position (``msgspec.structs.astuple``): keep their order."""

    promptTokenCount: int = ABSENT
    cachedContentTokenCount: int = ABSENT
    candidatesTokenCount: int = ABSENT
    thoughtsTokenCount: int = ABSENT
    toolUsePromptTokenCount: int = ABSENT
    totalTokenCount: int = ABSENT


class GeminiChunk(msgspec.Struct, gc=False):
    """Gemini's common chunk: text parts and usage counts, no error. Its modelVersion is
    skipped here (every chunk carries it, only the last counts): ``GeminiChunkTail``
    reads it, and the last chunk's whole usage, from the last chunks of a run."""

    candidates: list[GeminiCandidate] | None = None
    error: None = None
    usageMetadata: GeminiUsage | None = None


class GeminiUsageChunk(msgspec.Struct, gc=False):
    """A chunk's usage counts alone (``delta_text="payload_bytes"``: the text is counted
    by its bytes, the usage of every chunk is still read)."""

    error: None = None
    usageMetadata: GeminiUsage | None = None


class GeminiChunkTail(msgspec.Struct, gc=False):
    """The usage (as its raw JSON: checked, not built) and model of a chunk that fit
    ``GeminiChunk``."""

    usageMetadata: msgspec.Raw = msgspec.Raw()
    modelVersion: Any = None


class BedrockText(msgspec.Struct, gc=False):
    """A Bedrock text delta; tool input and reasoning take the general path."""

    text: str | None = None
    toolUse: None = None  # the wire name
    reasoningContent: None = None  # the wire name


class BedrockTextDelta(msgspec.Struct, gc=False):
    delta: BedrockText


class _Large:
    """Stands for a captured JSON value larger than ``CAPTURE_LIMIT`` (base.py)."""

    _instance: _Large | None = None

    def __new__(cls) -> _Large:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "LARGE"


LARGE: Any = _Large()

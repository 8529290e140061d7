"""Bedrock Converse, faked: requests, streamed and whole answers, errors.

``inputTokens`` excludes cache; ``cacheReadInputTokens``, ``cacheWriteInputTokens``
and ``cacheDetails`` (per TTL, ``1h`` before ``5m``). Streamed: AWS event-stream
frames (each payload padded), the usage in the final ``metadata`` event. Reasoning
is inside ``outputTokens`` and not reported apart. Bedrock's headers, error bodies
and in-stream exceptions are InvokeModel's too (bedrock_invoke.py).
"""

from __future__ import annotations

import random
from typing import Any

from .eventstream import event_stream_message
from .formats import DELTA_CHARS
from .provider import AnswerPlan, ErrorAnswer, Provider, RequestPlan, output_limit
from .template import Template, dumps, slot
from .text import random_id, random_uuid, split_text
from .usage import FakeUsage


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """A Converse body (a ``cachePoint`` after the system prompt when cached)."""
    system_blocks: list[dict[str, Any]] = [{"text": plan.system}]
    if plan.cached:
        point: dict[str, Any] = {"type": "default"}
        if plan.one_hour:
            point["ttl"] = "1h"
        system_blocks.append({"cachePoint": point})
    req: dict[str, Any] = {
        "messages": [{"role": "user", "content": [{"text": plan.question}]}],
        "system": system_blocks,
        "inferenceConfig": {"maxTokens": plan.limit, "temperature": 0.5},
    }
    if plan.reasoning:
        budget = max(1_024, plan.usage.reasoning_tokens)
        req["inferenceConfig"]["maxTokens"] = max(plan.limit, output_limit(plan.rng, budget + 1))
        req["additionalModelRequestFields"] = {
            "thinking": {"type": "enabled", "budget_tokens": budget}
        }
    return req


def _usage(u: FakeUsage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.total_tokens,
    }
    if u.cache_read_tokens or u.cache_write_tokens:
        out["cacheReadInputTokens"] = u.cache_read_tokens
        out["cacheWriteInputTokens"] = u.cache_write_tokens
    details = []  # sorted by TTL, 1h before 5m
    if u.cache_write_1h_tokens:
        details.append({"inputTokens": u.cache_write_1h_tokens, "ttl": "1h"})
    if u.cache_write_tokens - u.cache_write_1h_tokens:
        details.append({"inputTokens": u.cache_write_tokens - u.cache_write_1h_tokens, "ttl": "5m"})
    if details:
        out["cacheDetails"] = details
    return out


def _stop(plan: AnswerPlan) -> str:
    return "max_tokens" if plan.stop_at_limit else "end_turn"


#: Bedrock pads every payload with "p" (a prefix of this) so its length says nothing of it
PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"


def _frame(rng: random.Random, event: str, payload: dict[str, Any]) -> bytes:
    # Bedrock pads every payload with "p" so its length says nothing of its content.
    payload = {**payload, "p": PAD[: rng.randint(1, len(PAD))]}
    return event_stream_message(_EVENT_HEADERS[event], dumps(payload).encode())


_EVENT_HEADERS = {
    event: {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    for event in (
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    )
}


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """The event-stream frames of a streamed answer; the usage is in the last."""
    rng = plan.rng
    lo, hi = DELTA_CHARS[plan.fmt]
    chunks = [_frame(rng, "messageStart", {"role": "assistant"})]
    index = 0
    if plan.thinking:
        for piece in split_text(plan.thinking, rng, lo * 4, hi * 4):
            chunks.append(
                _frame(
                    rng,
                    "contentBlockDelta",
                    {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": piece}}},
                )
            )
        chunks.append(
            _frame(
                rng,
                "contentBlockDelta",
                {
                    "contentBlockIndex": 0,
                    "delta": {"reasoningContent": {"signature": random_id(rng, 64)}},
                },
            )
        )
        chunks.append(_frame(rng, "contentBlockStop", {"contentBlockIndex": 0}))
        index = 1
    template = Template(
        dumps({"contentBlockIndex": index, "delta": {"text": slot(0)}, "p": slot(1)})
    )
    for piece in split_text(plan.text, rng, lo, hi):
        payload = template.fill(piece, PAD[: rng.randint(1, len(PAD))]).encode()
        chunks.append(event_stream_message(_EVENT_HEADERS["contentBlockDelta"], payload))
    chunks.append(_frame(rng, "contentBlockStop", {"contentBlockIndex": index}))
    chunks.append(_frame(rng, "messageStop", {"stopReason": _stop(plan)}))
    chunks.append(
        _frame(
            rng,
            "metadata",
            {
                "usage": _usage(plan.usage),
                "metrics": {"latencyMs": rng.randint(200, 9_000)},
            },
        )
    )
    return chunks, len(chunks)


def body(plan: AnswerPlan) -> bytes:
    """A whole (non-streamed) Converse answer."""
    rng = plan.rng
    content: list[dict[str, Any]] = []
    if plan.thinking:
        content.append(
            {
                "reasoningContent": {
                    "reasoningText": {"text": plan.thinking, "signature": random_id(rng, 64)}
                }
            }
        )
    content.append({"text": plan.text})
    return dumps(
        {
            "metrics": {"latencyMs": rng.randint(200, 9_000)},
            "output": {"message": {"content": content, "role": "assistant"}},
            "stopReason": _stop(plan),
            "usage": _usage(plan.usage),
        }
    ).encode()


def headers(rng: random.Random) -> dict[str, str]:
    """Bedrock's response headers: a request id."""
    return {"x-amzn-requestid": random_uuid(rng)}


#: status -> (exception name, message) of Bedrock's error bodies
ERRORS = {
    400: (
        "ValidationException",
        "Malformed input request, please reformat your input and try again.",
    ),
    403: (
        "AccessDeniedException",
        "You don't have access to the model with the specified model ID.",
    ),
    404: (
        "ResourceNotFoundException",
        "Could not resolve the foundation model from the provided model identifier.",
    ),
    429: ("ThrottlingException", "Too many requests, please wait before trying again."),
    500: (
        "InternalServerException",
        "The system encountered an unexpected error during processing. Try your request again.",
    ),
    503: ("ServiceUnavailableException", "Bedrock is unable to process your request."),
}


def error(status: int, rng: random.Random, message: str | None) -> ErrorAnswer:
    """Bedrock's JSON error for ``status`` (the exception named in ``x-amzn-ErrorType``)."""
    answer_headers = headers(rng)
    kind, default = ERRORS.get(status, ("InternalServerException", "Internal error."))
    text = message or default
    answer_headers["x-amzn-ErrorType"] = (
        f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    )
    return {"message": text}, answer_headers, f"{kind}: {text}"


_STREAM_EXCEPTIONS = {
    "modelStreamErrorException": "Model stream error: the model produced an invalid sequence.",
    "throttlingException": "Too many tokens, please wait before trying again.",
    "internalServerException": "The system encountered an unexpected error during processing.",
}


def stream_error(plan: AnswerPlan, after: int) -> tuple[str, bytes]:
    """An exception frame Bedrock sends inside a stream (one of three, drawn)."""
    kind = plan.rng.choice(
        ("modelStreamErrorException", "throttlingException", "internalServerException")
    )
    text = _STREAM_EXCEPTIONS[kind]
    payload: dict[str, Any] = {"message": text}
    if kind == "modelStreamErrorException":
        payload["originalStatusCode"] = 424
    exception_headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return f"{kind}: {text}", event_stream_message(exception_headers, dumps(payload).encode())


PROVIDER = Provider(
    fmt="bedrock-converse",
    request=build_request,
    body=body,
    stream=stream,
    headers=headers,
    error=error,
    stream_error=stream_error,
)

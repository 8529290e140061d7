"""Bedrock InvokeModel with Anthropic's models, faked: Anthropic's body and usage on Bedrock.

The request is a Messages body without ``model`` (in the URL) and with
``anthropic_version``. Streamed (``invoke-with-response-stream``): each Anthropic
event base64-encoded in a ``chunk`` event-stream frame; ``message_stop`` adds
``amazon-bedrock-invocationMetrics``. Headers, errors and in-stream exceptions are
Bedrock's (bedrock.py).
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

from . import anthropic, bedrock
from .eventstream import event_stream_message
from .provider import AnswerPlan, Provider, RequestPlan
from .template import dumps


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """Anthropic's body; the model and streaming are in the URL."""
    invoke = anthropic.build_request(replace(plan, stream=False))
    del invoke["model"]
    return {"anthropic_version": "bedrock-2023-05-31", **invoke}


_CHUNK_HEADERS = {
    ":event-type": "chunk",
    ":content-type": "application/json",
    ":message-type": "event",
}


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """InvokeModelWithResponseStream: Anthropic's events, each base64 in a ``chunk`` frame."""
    events, usage_after = anthropic.stream(plan)
    u = plan.usage
    frames = []
    for event in events:
        data = event.split(b"\ndata: ", 1)[1].rstrip(b"\n")
        obj = json.loads(data)
        if obj.get("type") == "message_stop":
            obj["amazon-bedrock-invocationMetrics"] = {
                "inputTokenCount": u.input_tokens,
                "outputTokenCount": u.output_tokens,
                "invocationLatency": plan.rng.randint(200, 9_000),
                "firstByteLatency": plan.rng.randint(100, 2_000),
            }
            data = dumps(obj).encode()
        payload = {
            "bytes": base64.b64encode(data).decode(),
            "p": bedrock.PAD[: plan.rng.randint(1, 8)],
        }
        frames.append(event_stream_message(_CHUNK_HEADERS, dumps(payload).encode()))
    return frames, usage_after


PROVIDER = Provider(
    fmt="bedrock-invoke",
    request=build_request,
    body=anthropic.body,
    stream=stream,
    headers=bedrock.headers,
    error=bedrock.error,
    stream_error=bedrock.stream_error,
)

"""What the provider-fact tests share: SSE bodies, each provider's chunks, one tap run."""

from __future__ import annotations

import json
from typing import Any

from ingest.taps import TapResult, open_tap


def sse(*events: tuple[str | None, Any], crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    out = ""
    for name, obj in events:
        if name:
            out += f"event: {name}{nl}"
        out += f"data: {obj if isinstance(obj, str) else json.dumps(obj)}{nl}{nl}"
    return out.encode()


#: the request ``tap`` sends unless told: its model is none a response names
REQUEST: dict[str, Any] = {"model": "req-model"}
#: an Anthropic request that allows server-side fallback (a relabel is priced as served)
FALLBACK_REQUEST: dict[str, Any] = {"model": "claude-x", "fallbacks": "default"}


def tap(
    fmt: str,
    body: bytes,
    *,
    streaming: bool = True,
    cut: str | None = None,
    model: str | None = None,
    request: dict[str, Any] | None = None,
    response_headers: dict[str, str] | None = None,
) -> TapResult:
    """``body`` through a tap of ``fmt`` for ``request`` (default ``REQUEST``); ``model``
    is the URL's (the hint)."""
    t = open_tap(
        fmt,
        REQUEST if request is None else request,
        streaming=streaming,
        model=model,
        response_headers=response_headers,
    )
    t.feed(body)
    return t.finish(cut=cut)


def anthropic_stream(start_usage: dict[str, Any], *deltas: dict[str, Any]) -> bytes:
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"id": "msg_1", "model": "claude-x", "usage": start_usage},
            },
        ),
    ]
    for usage in deltas:
        events.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": None}, "usage": usage},
            )
        )
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


def chat_chunk(choices: Any, usage: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "gpt-x",
        "choices": choices,
        "usage": usage,
        **extra,
    }


USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 300,
    "prompt_tokens_details": {"cached_tokens": 600},
    "completion_tokens_details": {"reasoning_tokens": 200},
}


def gemini_chunk(text: str, usage: dict[str, Any] | None, finish: bool = False) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finish:
        cand["finishReason"] = "STOP"
    out: dict[str, Any] = {"candidates": [cand], "modelVersion": "gemini-x"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out

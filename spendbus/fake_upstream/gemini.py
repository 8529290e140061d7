"""Gemini generateContent, faked: requests, streamed and whole answers, errors.

``promptTokenCount`` includes ``cachedContentTokenCount``; ``thoughtsTokenCount``
is apart from ``candidatesTokenCount``; with server tools (Google Search) part of
the input is ``toolUsePromptTokenCount``. Streamed (``alt=sse``, CRLF, Google's
spaced JSON; without it one JSON array): every chunk carries a cumulative
``usageMetadata``, the last one is final. No cache writes.
"""

from __future__ import annotations

import json
import random
from typing import Any

from .formats import DELTA_CHARS
from .provider import AnswerPlan, ErrorAnswer, Provider, RequestPlan
from .sse import sse_event
from .text import make_text, random_id, split_text
from .usage import FakeUsage


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """A generateContent body (the model and streaming are in the URL)."""
    rng, usage = plan.rng, plan.usage
    config: dict[str, Any] = {"maxOutputTokens": plan.limit, "temperature": 0.7}
    if plan.reasoning:
        config["thinkingConfig"] = {
            "thinkingBudget": max(1_024, usage.reasoning_tokens),
            "includeThoughts": rng.random() < 0.5,
        }
    req: dict[str, Any] = {
        "systemInstruction": {"parts": [{"text": plan.system}]},
        "contents": [{"role": "user", "parts": [{"text": plan.question}]}],
        "generationConfig": config,
    }
    if plan.server_tools:
        req["tools"] = [{"googleSearch": {}}]
    return req


def _split(u: FakeUsage, tools: int) -> tuple[int, int]:
    """(prompt tokens excluding cache, tool-use prompt tokens) of the input."""
    tool_use = u.input_tokens // 3 if tools else 0
    return u.input_tokens - tool_use, tool_use


def _usage(u: FakeUsage, tools: int, *, candidates: int | None = None) -> dict[str, Any]:
    plain, tool_use = _split(u, tools)
    prompt = plain + u.cache_read_tokens
    visible = u.output_tokens - u.reasoning_tokens if candidates is None else candidates
    out: dict[str, Any] = {"promptTokenCount": prompt}
    if visible or candidates is None:
        out["candidatesTokenCount"] = visible
    out["totalTokenCount"] = prompt + visible + u.reasoning_tokens + tool_use
    if u.cache_read_tokens:
        out["cachedContentTokenCount"] = u.cache_read_tokens
    out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if u.cache_read_tokens:
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.cache_read_tokens}]
    if tool_use:
        out["toolUsePromptTokenCount"] = tool_use
    if u.reasoning_tokens:
        out["thoughtsTokenCount"] = u.reasoning_tokens
    return out


def _finish(plan: AnswerPlan) -> str:
    return "MAX_TOKENS" if plan.stop_at_limit else "STOP"


def _includes_thoughts(request: dict[str, Any]) -> bool:
    config = request.get("generationConfig")
    thinking = config.get("thinkingConfig") if isinstance(config, dict) else None
    return isinstance(thinking, dict) and thinking.get("includeThoughts") is True


def _grounding(plan: AnswerPlan) -> dict[str, Any]:
    rng = plan.rng
    return {
        "webSearchQueries": [
            make_text(rng, rng.randint(12, 40)).strip() for _ in range(plan.server_tools)
        ],
        "groundingChunks": [
            {
                "web": {
                    "uri": f"https://example.com/{random_id(rng, 8).lower()}",
                    "title": "example.com",
                }
            }
        ],
    }


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """The SSE chunks of a streamed answer, each with the usage so far; whole at the last."""
    rng, u = plan.rng, plan.usage
    response_id = random_id(rng, 23)
    visible = u.output_tokens - u.reasoning_tokens
    lo, hi = DELTA_CHARS[plan.fmt]
    pieces = split_text(plan.text, rng, lo, hi) or [""]
    parts_list: list[list[dict[str, Any]]] = []
    if u.reasoning_tokens and _includes_thoughts(plan.request):
        summary = make_text(rng, rng.randint(60, 240))
        parts_list.append([{"text": summary, "thought": True}])
    parts_list += [[{"text": p}] for p in pieces]
    chunks = []
    sent = 0
    total_chars = max(1, len(plan.text))
    for i, parts in enumerate(parts_list):
        last = i == len(parts_list) - 1
        if not parts[0].get("thought"):
            sent += len(parts[0]["text"])
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if last:
            candidate["finishReason"] = _finish(plan)
            if plan.server_tools:
                candidate["groundingMetadata"] = _grounding(plan)
            usage = _usage(u, plan.server_tools)
        else:  # cumulative so far, never above the final counts
            usage = _usage(
                u, plan.server_tools, candidates=min(visible, visible * sent // total_chars)
            )
        obj = {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": plan.model,
            "responseId": response_id,
        }
        chunks.append(sse_event(None, obj, crlf=True))
    return chunks, len(chunks)


def as_json_array(chunks: list[bytes], *, as_written: bool = False) -> list[bytes]:
    """Gemini's stream without ``alt=sse``: one JSON array, sent element by element
    (``as_written``: each chunk's JSON as it is, not laid out again: a hostile answer's
    repeated keys stay repeated)."""
    out = []
    for i, chunk in enumerate(chunks):
        data = chunk.decode().strip()
        data = data[len("data: ") :] if data.startswith("data: ") else data
        element = data if as_written else json.dumps(json.loads(data), ensure_ascii=False, indent=2)
        out.append((b"[" if i == 0 else b",\r\n") + element.encode())
    if out:
        out[-1] += b"]"
    return out


def body(plan: AnswerPlan) -> bytes:
    """A whole (non-streamed) generateContent answer."""
    u = plan.usage
    parts: list[dict[str, Any]] = []
    if u.reasoning_tokens and _includes_thoughts(plan.request):
        parts.append({"text": make_text(plan.rng, plan.rng.randint(60, 240)), "thought": True})
    parts.append({"text": plan.text})
    candidate: dict[str, Any] = {
        "content": {"parts": parts, "role": "model"},
        "finishReason": _finish(plan),
        "avgLogprobs": -round(plan.rng.uniform(0.05, 0.6), 4),
    }
    if plan.server_tools:
        candidate["groundingMetadata"] = _grounding(plan)
    obj = {
        "candidates": [candidate],
        "usageMetadata": _usage(u, plan.server_tools),
        "modelVersion": plan.model,
        "responseId": random_id(plan.rng, 23),
    }
    return json.dumps(obj, ensure_ascii=False, indent=2).encode()


def headers(rng: random.Random) -> dict[str, str]:
    """Google's response headers (no request id)."""
    return {"server": "scaffolding on HTTPServer2", "x-content-type-options": "nosniff"}


def served_tier(request: dict[str, Any]) -> str:
    """The tier Google says served ``request`` (``x-gemini-service-tier``): the one it
    asks for (``service_tier`` / ``serviceTier``, ``flex`` or ``SERVICE_TIER_FLEX``),
    lower case, else ``standard``."""
    asked = request.get("service_tier") or request.get("serviceTier")
    if not isinstance(asked, str) or not asked:
        return "standard"
    return asked.lower().removeprefix("service_tier_")


#: status -> (status name, message) of Google's error bodies
ERRORS = {
    400: ("INVALID_ARGUMENT", "Invalid JSON payload received."),
    403: ("PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
    404: ("NOT_FOUND", "models/unknown is not found for API version v1beta."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: (
        "INTERNAL",
        "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    ),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
}


def error(status: int, rng: random.Random, message: str | None) -> ErrorAnswer:
    """Google's JSON error for ``status`` (``code``, ``message``, ``status``)."""
    answer_headers = headers(rng)
    kind, default = ERRORS.get(status, ("INTERNAL", "An internal error has occurred."))
    text = message or default
    return (
        {"error": {"code": status, "message": text, "status": kind}},
        answer_headers,
        f"{kind}: {text}",
    )


def stream_error(plan: AnswerPlan, after: int) -> tuple[str, bytes]:
    """The error chunk Gemini sends inside a stream (an internal error)."""
    kind, text = ERRORS[500]
    obj = {"error": {"code": 500, "message": text, "status": kind}}
    return f"{kind}: {text}", sse_event(None, obj, crlf=True)


PROVIDER = Provider(
    fmt="gemini",
    request=build_request,
    body=body,
    stream=stream,
    headers=headers,
    error=error,
    stream_error=stream_error,
)

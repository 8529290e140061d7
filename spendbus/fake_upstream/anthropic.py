"""Anthropic Messages, faked: requests, streamed and whole answers, errors.

``input_tokens`` excludes cache; ``cache_creation_input_tokens`` with
``cache_creation.ephemeral_5m/1h_input_tokens``; ``cache_read_input_tokens``.
Streamed: ``message_start`` carries the input side, cumulative ``message_delta``\\s
the output (several with server tools: web search). Thinking is inside
``output_tokens`` and not reported apart. Bedrock InvokeModel reuses the body and
the stream (bedrock_invoke.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .formats import DELTA_CHARS
from .provider import AnswerPlan, ErrorAnswer, Provider, RequestPlan, output_limit
from .sse import sse_event, sse_template
from .template import dumps, slot
from .text import make_text, random_id, split_text
from .usage import FakeUsage


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """A Messages request body (``model``, ``max_tokens``, a cached system block...)."""
    rng, usage = plan.rng, plan.usage
    block: dict[str, Any] = {"type": "text", "text": plan.system}
    if plan.cached:
        block["cache_control"] = {"type": "ephemeral", **({"ttl": "1h"} if plan.one_hour else {})}
    req: dict[str, Any] = {"model": plan.model, "max_tokens": plan.limit, "system": [block]}
    if plan.reasoning:
        budget = max(1_024, usage.reasoning_tokens)
        req["max_tokens"] = max(plan.limit, output_limit(rng, budget + 1))
        req["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if plan.server_tools:
        req["tools"] = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
    req["messages"] = [{"role": "user", "content": plan.question}]
    if plan.stream:
        req["stream"] = True
    return req


def _usage(u: FakeUsage, *, output: int | None = None) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": u.cache_write_tokens - u.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        },
        "output_tokens": u.output_tokens if output is None else output,
        "service_tier": "standard",
    }


def _stop(plan: AnswerPlan) -> str:
    return "max_tokens" if plan.stop_at_limit else "end_turn"


def _search_blocks(plan: AnswerPlan, k: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    rng = plan.rng
    tool_id = "srvtoolu_" + random_id(rng, 24)
    query = make_text(rng, rng.randint(12, 40)).strip()
    use = {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {}}
    result = {
        "type": "web_search_tool_result",
        "tool_use_id": tool_id,
        "content": [
            {
                "type": "web_search_result",
                "title": make_text(rng, rng.randint(20, 60)).strip(),
                "url": f"https://example.com/{random_id(rng, 8).lower()}/{k}",
                "encrypted_content": random_id(rng, 48),
                "page_age": None,
            }
        ],
    }
    return use, result, dumps({"query": query})


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """The SSE events of a streamed answer; the usage is whole after the last."""
    rng, u = plan.rng, plan.usage
    tools = plan.server_tools
    # message_start: the input of the first sampling step, a few output tokens.
    start_input = u.input_tokens // (tools + 1) if tools else u.input_tokens
    start_output = min(u.output_tokens, rng.randint(1, 4))
    start_usage = _usage(replace(u, input_tokens=start_input), output=start_output)
    if tools:
        start_usage["server_tool_use"] = {"web_search_requests": 0}
    blocks = _Blocks([_message_start(plan, start_usage)])
    lo, hi = DELTA_CHARS[plan.fmt]
    if plan.thinking:
        blocks.add(
            {"type": "thinking", "thinking": "", "signature": ""},
            split_text(plan.thinking, rng, lo * 4, hi * 4),
            ("thinking_delta", "thinking"),
            ({"type": "signature_delta", "signature": random_id(rng, 64)},),
        )
    for k in range(tools):
        preamble = make_text(rng, rng.randint(20, 60))
        blocks.add({"type": "text", "text": ""}, split_text(preamble, rng, lo, hi))
        use, result, query = _search_blocks(plan, k)
        blocks.add(use, ["", query], ("input_json_delta", "partial_json"))
        blocks.add(result)
        # A cumulative usage after each server tool call: never a sum.
        step = k + 1
        blocks.chunks.append(
            sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": None, "stop_sequence": None},
                    "usage": {
                        "input_tokens": start_input
                        + (u.input_tokens - start_input) * step // (tools + 1),
                        "cache_creation_input_tokens": u.cache_write_tokens,
                        "cache_read_input_tokens": u.cache_read_tokens,
                        "output_tokens": start_output
                        + (u.output_tokens - start_output) * step // (tools + 1),
                        "server_tool_use": {"web_search_requests": step},
                    },
                },
            )
        )
    blocks.add({"type": "text", "text": ""}, split_text(plan.text, rng, lo, hi))
    final = _final_usage(plan)
    chunks = blocks.chunks
    chunks.append(
        sse_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop(plan), "stop_sequence": None},
                "usage": final,
            },
        )
    )
    chunks.append(sse_event("message_stop", {"type": "message_stop"}))
    return chunks, len(chunks)


def _message_start(plan: AnswerPlan, usage: dict[str, Any]) -> bytes:
    return sse_event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_" + random_id(plan.rng, 24),
                "type": "message",
                "role": "assistant",
                "model": plan.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
    )


class _Blocks:
    """A stream's content blocks, numbered as they are added after ``chunks``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.index = 0

    def add(
        self,
        start: dict[str, Any],
        pieces: Sequence[str] = (),
        kind: tuple[str, str] = ("text_delta", "text"),
        tail: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """One content block: its start, a delta of type ``kind`` = (type, field)
        per text piece, then the ``tail`` deltas, its stop."""
        index, chunks = self.index, self.chunks
        where = {"type": "content_block_delta", "index": index}
        chunks.append(
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        if index == 0:
            chunks.append(sse_event("ping", {"type": "ping"}))
        delta_type, field_name = kind
        template = sse_template(
            "content_block_delta", {**where, "delta": {"type": delta_type, field_name: slot(0)}}
        )
        chunks.extend(template.fill(piece).encode() for piece in pieces)
        chunks.extend(sse_event("content_block_delta", {**where, "delta": d}) for d in tail)
        chunks.append(
            sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
        )
        self.index += 1


def _final_usage(plan: AnswerPlan) -> dict[str, Any]:
    """The last ``message_delta``'s usage: fully cumulative (always with server tools), or
    the older shape of output tokens only."""
    u, tools = plan.usage, plan.server_tools
    if not tools and plan.rng.random() >= 0.5:
        return {"output_tokens": u.output_tokens}
    final: dict[str, Any] = {
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "output_tokens": u.output_tokens,
    }
    if tools:
        final["server_tool_use"] = {"web_search_requests": tools}
    return final


def body(plan: AnswerPlan) -> bytes:
    """A whole (non-streamed) Messages answer."""
    rng = plan.rng
    content: list[dict[str, Any]] = []
    if plan.thinking:
        content.append(
            {"type": "thinking", "thinking": plan.thinking, "signature": random_id(rng, 64)}
        )
    for k in range(plan.server_tools):
        use, result, query = _search_blocks(plan, k)
        use["input"] = json.loads(query)
        content += [{"type": "text", "text": make_text(rng, rng.randint(20, 60))}, use, result]
    content.append({"type": "text", "text": plan.text})
    usage = _usage(plan.usage)
    if plan.server_tools:
        usage["server_tool_use"] = {"web_search_requests": plan.server_tools}
    return dumps(
        {
            "id": "msg_" + random_id(rng, 24),
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": content,
            "stop_reason": _stop(plan),
            "stop_sequence": None,
            "usage": usage,
        }
    ).encode()


#: what Anthropic also answers about the account and the edge: the organisation id, a
#: load balancer's cookie, rate limits (constants: the draws stay as they were)
_ACCOUNT_HEADERS = {
    "anthropic-organization-id": "6f1d3c2a-0b9e-4f7a-8c5d-fake0organis",
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-tokens-remaining": "399000",
    "set-cookie": "__cf_bm=fake-edge-cookie; path=/; HttpOnly; Secure",
    "cf-ray": "8f00fake0000-AMS",
}


def headers(rng: random.Random) -> dict[str, str]:
    """The response headers: a request id and the account's."""
    return {"request-id": "req_" + random_id(rng, 24), **_ACCOUNT_HEADERS}


_ERRORS = {
    400: ("invalid_request_error", "messages: at least one message is required"),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: (
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 80,000 input tokens per minute.",
    ),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


def error(status: int, rng: random.Random, message: str | None) -> ErrorAnswer:
    """Anthropic's JSON error for ``status`` (``x-should-retry`` as Anthropic says it)."""
    answer_headers = headers(rng)
    kind, default = _ERRORS.get(status, ("api_error", "Internal server error"))
    text = message or default
    error_body: dict[str, Any] = {
        "type": "error",
        "error": {"type": kind, "message": text},
        "request_id": answer_headers["request-id"],
    }
    answer_headers["x-should-retry"] = "true" if status in (429, 500, 529) else "false"
    return error_body, answer_headers, f"{kind}: {text}"


def stream_error(plan: AnswerPlan, after: int) -> tuple[str, bytes]:
    """The ``error`` event Anthropic sends inside a stream (overloaded)."""
    obj = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return "overloaded_error: Overloaded", sse_event("error", obj)


PROVIDER = Provider(
    fmt="anthropic-messages",
    request=build_request,
    body=body,
    stream=stream,
    headers=headers,
    error=error,
    stream_error=stream_error,
)

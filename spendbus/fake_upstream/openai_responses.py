"""OpenAI Responses, faked: requests, streamed and whole answers, the in-stream error.

``input_tokens`` includes ``input_tokens_details.cached_tokens``; ``output_tokens``
includes ``output_tokens_details.reasoning_tokens``; streamed in
``response.completed`` (``response.incomplete`` when the output hit
``max_output_tokens``). No cache writes. Server tools: web search items. The
response headers and error bodies are OpenAI's (openai_chat.py).
"""

from __future__ import annotations

import json
import random
from typing import Any

from . import openai_chat
from .formats import DELTA_CHARS
from .provider import AnswerPlan, Provider, RequestPlan
from .sse import sse_event, sse_template
from .template import slot
from .text import make_text, random_hex, random_id, split_text
from .usage import FakeUsage


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """A Responses request (``input`` with a developer message, not stored)."""
    req: dict[str, Any] = {
        "model": plan.model,
        "input": [
            {"role": "developer", "content": plan.system},
            {"role": "user", "content": plan.question},
        ],
        "max_output_tokens": plan.limit,
        "store": False,
    }
    if plan.reasoning:
        req["reasoning"] = {"effort": plan.rng.choice(("low", "medium", "high"))}
    if plan.server_tools:
        req["tools"] = [{"type": "web_search"}]
    if plan.stream:
        req["stream"] = True
    return req


def _usage(u: FakeUsage) -> dict[str, Any]:
    prompt = u.input_tokens + u.cache_read_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": prompt + u.output_tokens,
    }


def _response_object(
    plan: AnswerPlan, ids: dict[str, str], *, status: str, output: list[Any], usage: Any
) -> dict[str, Any]:
    request = plan.request
    return {
        "id": ids["resp"],
        "object": "response",
        "created_at": int(ids["created"]),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "max_output_tokens": request.get("max_output_tokens"),
        "model": plan.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": request.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def _items(plan: AnswerPlan, ids: dict[str, str]) -> list[dict[str, Any]]:
    """The output items of a finished response, in order."""
    rng = plan.rng
    items: list[dict[str, Any]] = []
    if plan.usage.reasoning_tokens:
        items.append({"id": "rs_" + random_hex(rng, 48), "type": "reasoning", "summary": []})
    for _ in range(plan.server_tools):
        items.append(
            {
                "id": "ws_" + random_hex(rng, 48),
                "type": "web_search_call",
                "status": "completed",
                "action": {"type": "search", "query": make_text(rng, rng.randint(12, 40)).strip()},
            }
        )
    items.append(
        {
            "id": ids["msg"],
            "type": "message",
            "status": "incomplete" if plan.stop_at_limit else "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "annotations": [], "logprobs": [], "text": plan.text}
            ],
        }
    )
    return items


def _ids(rng: random.Random) -> dict[str, str]:
    return {
        "resp": "resp_" + random_hex(rng, 48),
        "msg": "msg_" + random_hex(rng, 48),
        "created": str(1_750_000_000 + rng.randrange(10_000_000)),
    }


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """The SSE events of a streamed answer; the usage is whole after the last."""
    rng = plan.rng
    ids = _ids(rng)
    items = _items(plan, ids)
    chunks: list[bytes] = []

    def event(name: str, **fields: Any) -> None:
        chunks.append(sse_event(name, {"type": name, "sequence_number": len(chunks), **fields}))

    pending = _response_object(plan, ids, status="in_progress", output=[], usage=None)
    event("response.created", response=pending)
    event("response.in_progress", response=pending)
    for index, item in enumerate(items):
        if item["type"] == "reasoning":
            event("response.output_item.added", output_index=index, item=item)
            event("response.output_item.done", output_index=index, item=item)
        elif item["type"] == "web_search_call":
            event(
                "response.output_item.added",
                output_index=index,
                item={"id": item["id"], "type": "web_search_call", "status": "in_progress"},
            )
            for phase in ("in_progress", "searching", "completed"):
                event(f"response.web_search_call.{phase}", output_index=index, item_id=item["id"])
            event("response.output_item.done", output_index=index, item=item)
        else:
            started = {**item, "status": "in_progress", "content": []}
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            event("response.output_item.added", output_index=index, item=started)
            event("response.content_part.added", **where, part=part)
            lo, hi = DELTA_CHARS[plan.fmt]
            name = "response.output_text.delta"
            template = sse_template(
                name,
                {
                    "type": name,
                    "sequence_number": slot(0),
                    **where,
                    "delta": slot(1),
                    "logprobs": [],
                    "obfuscation": slot(2),
                },
            )
            for piece in split_text(plan.text, rng, lo, hi):
                obfuscation = random_id(rng, rng.randint(2, 12))
                chunks.append(template.fill(len(chunks), piece, obfuscation).encode())
            event("response.output_text.done", **where, text=plan.text, logprobs=[])
            event("response.content_part.done", **where, part={**part, "text": plan.text})
            event("response.output_item.done", output_index=index, item=item)
    status = "incomplete" if plan.stop_at_limit else "completed"
    final = _response_object(plan, ids, status=status, output=items, usage=_usage(plan.usage))
    event(f"response.{status}", response=final)
    return chunks, len(chunks)


def body(plan: AnswerPlan) -> bytes:
    """A whole (non-streamed) response object."""
    ids = _ids(plan.rng)
    status = "incomplete" if plan.stop_at_limit else "completed"
    obj = _response_object(
        plan,
        ids,
        status=status,
        output=_items(plan, ids),
        usage=_usage(plan.usage),
    )
    return json.dumps(obj, ensure_ascii=False, indent=2).encode()


#: background responses kept for retrieval, at most (the oldest goes first)
MAX_STORED = 10_000


def background(body_bytes: bytes, stored: dict[str, bytes]) -> bytes:
    """A background request's answer: the response ``queued`` (usage null), its
    finished object kept in ``stored`` for ``GET /v1/responses/{id}`` (as OpenAI runs it
    on after answering; the fake has it finished at once)."""
    obj = json.loads(body_bytes)
    finished = {**obj, "background": True}
    while len(stored) >= MAX_STORED:
        del stored[next(iter(stored))]
    stored[obj["id"]] = json.dumps(finished, ensure_ascii=False, indent=2).encode()
    queued = {
        **finished,
        "status": "queued",
        "output": [],
        "usage": None,
        "incomplete_details": None,
    }
    return json.dumps(queued, ensure_ascii=False, indent=2).encode()


def replay(stored: bytes) -> bytes:
    """``GET /v1/responses/{id}?stream=true`` of a finished background response: its
    ``response.created`` and terminal events (OpenAI replays every event; these two are
    the ones that carry the response)."""
    final = json.loads(stored)
    created = {**final, "status": "in_progress", "output": [], "usage": None}
    done = f"response.{final['status']}"
    return sse_event(
        "response.created", {"type": "response.created", "sequence_number": 0, "response": created}
    ) + sse_event(done, {"type": done, "sequence_number": 1, "response": final})


def stream_error(plan: AnswerPlan, after: int) -> tuple[str, bytes]:
    """The ``error`` event the Responses API sends inside a stream (numbered in sequence)."""
    text = "The server had an error while processing your request. Sorry about that!"
    obj = {
        "type": "error",
        "sequence_number": after,
        "code": "server_error",
        "message": text,
        "param": None,
    }
    return f"server_error: {text}", sse_event("error", obj)


PROVIDER = Provider(
    fmt="openai-responses",
    request=build_request,
    body=body,
    stream=stream,
    headers=openai_chat.headers,
    error=openai_chat.error,
    stream_error=stream_error,
)

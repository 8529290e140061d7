"""OpenAI Chat Completions, faked: requests, streamed and whole answers, errors.

``prompt_tokens`` = input + cache reads (``prompt_tokens_details.cached_tokens``);
``completion_tokens`` includes ``completion_tokens_details.reasoning_tokens``.
Streamed: a last chunk with ``choices: []``, only when the request sets
``stream_options.include_usage``. No cache writes. OpenAI's response headers and
error bodies, the same on the Responses API (openai_responses.py), are here.
"""

from __future__ import annotations

import json
import random
from typing import Any

from .formats import DELTA_CHARS
from .provider import AnswerPlan, ErrorAnswer, Provider, RequestPlan
from .sse import sse_event
from .template import Template, slot
from .text import random_hex, random_id, split_text
from .usage import FakeUsage


def build_request(plan: RequestPlan) -> dict[str, Any]:
    """A Chat Completions request (usage asked for when streamed)."""
    req: dict[str, Any] = {
        "model": plan.model,
        "messages": [
            {"role": "system", "content": plan.system},
            {"role": "user", "content": plan.question},
        ],
        "max_completion_tokens": plan.limit,
    }
    if plan.reasoning:
        req["reasoning_effort"] = plan.rng.choice(("low", "medium", "high"))
    if plan.stream:
        req["stream"] = True
        req["stream_options"] = {"include_usage": True}
    return req


def _usage(u: FakeUsage) -> dict[str, Any]:
    prompt = u.input_tokens + u.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": u.output_tokens,
        "total_tokens": prompt + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _finish(plan: AnswerPlan) -> str:
    return "length" if plan.stop_at_limit else "stop"


def _include_usage(request: dict[str, Any]) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def stream(plan: AnswerPlan) -> tuple[list[bytes], int | None]:
    """The SSE chunks of a streamed answer; usage only when the request asks for it."""
    rng = plan.rng
    with_usage = _include_usage(plan.request)
    base: dict[str, Any] = {
        "id": "chatcmpl-" + random_id(rng, 29),
        "object": "chat.completion.chunk",
        "created": 1_750_000_000 + rng.randrange(10_000_000),
        "model": plan.model,
        "service_tier": "default",
        "system_fingerprint": "fp_" + random_hex(rng, 10),
    }

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {**base, "choices": choices, **extra}
        if with_usage and "usage" not in extra:
            obj["usage"] = None
        return sse_event(None, obj)

    def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    lo, hi = DELTA_CHARS[plan.fmt]
    chunks = [chunk([choice({"role": "assistant", "content": "", "refusal": None})])]
    template = Template(chunk([choice({"content": slot(0)})]).decode())
    chunks += [template.fill(p).encode() for p in split_text(plan.text, rng, lo, hi)]
    chunks.append(chunk([choice({}, _finish(plan))]))
    usage_after = None
    if with_usage:
        chunks.append(chunk([], usage=_usage(plan.usage)))
        usage_after = len(chunks)
    chunks.append(b"data: [DONE]\n\n")
    return chunks, usage_after


def body(plan: AnswerPlan) -> bytes:
    """A whole (non-streamed) chat completion."""
    rng = plan.rng
    return json.dumps(
        {
            "id": "chatcmpl-" + random_id(rng, 29),
            "object": "chat.completion",
            "created": 1_750_000_000 + rng.randrange(10_000_000),
            "model": plan.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": plan.text,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": _finish(plan),
                }
            ],
            "usage": _usage(plan.usage),
            "service_tier": "default",
            "system_fingerprint": "fp_" + random_hex(rng, 10),
        },
        ensure_ascii=False,
        indent=2,
    ).encode()


#: what OpenAI also answers about the account and the edge: organisation and project
#: ids, a load balancer's cookie, rate limits (constants: the draws stay as they were)
_ACCOUNT_HEADERS = {
    "openai-organization": "org-fake-operator",
    "openai-project": "proj_fake_operator",
    "openai-version": "2020-10-01",
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-remaining-tokens": "29999000",
    "x-ratelimit-reset-requests": "6ms",
    "set-cookie": "__cf_bm=fake-edge-cookie; path=/; HttpOnly; Secure",
    "cf-ray": "8f00fake0000-AMS",
}


def headers(rng: random.Random) -> dict[str, str]:
    """OpenAI's response headers (both APIs): a request id, the time taken, the account's."""
    return {
        "x-request-id": "req_" + random_hex(rng, 32),
        "openai-processing-ms": str(rng.randint(80, 2_000)),
        **_ACCOUNT_HEADERS,
    }


#: status -> (type, code, message) of OpenAI's error bodies (both APIs)
ERRORS = {
    400: ("invalid_request_error", None, "We could not parse the JSON body of your request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model does not exist or you do not have access to it.",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


def error(status: int, rng: random.Random, message: str | None) -> ErrorAnswer:
    """OpenAI's JSON error for ``status`` (both APIs)."""
    answer_headers = headers(rng)
    kind, code, default = ERRORS.get(status, ("server_error", None, "Server error"))
    text = message or default
    error_body = {"error": {"message": text, "type": kind, "param": None, "code": code}}
    return error_body, answer_headers, f"{kind}: {text}"


def stream_error(plan: AnswerPlan, after: int) -> tuple[str, bytes]:
    """The error chunk Chat Completions sends inside a stream (a server error)."""
    kind, code, text = ERRORS[500]
    obj = {"error": {"message": text, "type": kind, "param": None, "code": code}}
    return f"{kind}: {text}", sse_event(None, obj)


PROVIDER = Provider(
    fmt="openai-chat",
    request=build_request,
    body=body,
    stream=stream,
    headers=headers,
    error=error,
    stream_error=stream_error,
)

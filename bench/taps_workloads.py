"""The responses bench_taps times each format's tap on: realistic bodies and streams
(text deltas of one token each, usage where the provider puts it), built for ``n`` output
tokens: ``BUILDERS[fmt](n)`` is (request, stream events, whole body)."""

from __future__ import annotations

import json
from collections.abc import Callable

from ingest.taps.eventstream import encode_message

WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def _sse(event: str | None, obj: object, *, crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    head = f"event: {event}{nl}" if event else ""
    return f"{head}data: {json.dumps(obj, separators=(',', ':'))}{nl}{nl}".encode()


def anthropic(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    model = "claude-sonnet-4-5-20250929"
    usage = {"input_tokens": 1200, "cache_read_input_tokens": 0, "output_tokens": n}
    events = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        ),
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for i in range(n):
        events.append(
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": WORDS[i % 10]},
                },
            )
        )
        if i % 50 == 0:
            events.append(_sse("ping", {"type": "ping"}))
    events += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    body = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "".join(WORDS[i % 10] for i in range(n))}],
        "stop_reason": "end_turn",
        "usage": usage,
    }
    request: dict[str, object] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    return request, events, json.dumps(body).encode()


def openai_chat(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    base = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1741569952,
        "model": "gpt-4o-2024-08-06",
        "service_tier": "default",
        "system_fingerprint": "fp_f9f4fb6dbf",
    }
    events = [
        _sse(
            None,
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": "", "refusal": None},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "usage": None,
            },
        )
    ]
    for i in range(n):
        events.append(
            _sse(
                None,
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": WORDS[i % 10]},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    "usage": None,
                    "obfuscation": "xQ3",
                },
            )
        )
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": n,
        "total_tokens": 1200 + n,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    events += [
        _sse(
            None,
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                "usage": None,
            },
        ),
        _sse(None, {**base, "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]
    body = {
        **base,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "".join(WORDS[i % 10] for i in range(n)),
                },
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }
    request: dict[str, object] = {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    return request, events, json.dumps(body).encode()


def openai_responses(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    resp = {
        "id": "resp_67c9fdcecf488190bdd9a0409de3a1ec",
        "object": "response",
        "created_at": 1741290958,
        "status": "in_progress",
        "model": "gpt-4.1-2025-04-14",
        "output": [],
        "usage": None,
    }
    text = "".join(WORDS[i % 10] for i in range(n))
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1200 + n,
    }
    item = {
        "id": "msg_67c9fdcf37fc8190ba82116e33fb28c5",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    events = [
        _sse(
            "response.created", {"type": "response.created", "sequence_number": 0, "response": resp}
        ),
        _sse(
            "response.in_progress",
            {"type": "response.in_progress", "sequence_number": 1, "response": resp},
        ),
    ]
    for i in range(n):
        events.append(
            _sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 2,
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": WORDS[i % 10],
                    "logprobs": [],
                    "obfuscation": "k3Xq9a",
                },
            )
        )
    done = {**resp, "status": "completed", "output": [item], "usage": usage}
    events += [
        _sse(
            "response.output_text.done",
            {"type": "response.output_text.done", "item_id": item["id"], "text": text},
        ),
        _sse("response.output_item.done", {"type": "response.output_item.done", "item": item}),
        _sse("response.completed", {"type": "response.completed", "response": done}),
    ]
    request: dict[str, object] = {"model": "gpt-4.1", "stream": True, "input": "Tell me a story."}
    return request, events, json.dumps(done).encode()


def gemini(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    events = []
    step = 8  # Gemini streams several tokens per chunk
    for i in range(0, n, step):
        text = "".join(WORDS[k % 10] for k in range(i, min(n, i + step)))
        last = i + step >= n
        chunk: dict[str, object] = {
            "candidates": [
                {
                    "content": {"parts": [{"text": text}], "role": "model"},
                    "index": 0,
                    **({"finishReason": "STOP"} if last else {}),
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 1200,
                "candidatesTokenCount": min(n, i + step),
                "totalTokenCount": 1200 + min(n, i + step),
            },
            "modelVersion": "gemini-2.5-flash",
            "responseId": "mGpAaO2tG4SnqtsP_4qB8Q4",
        }
        events.append(_sse(None, chunk, crlf=True))
    body = {
        "candidates": [
            {
                "content": {
                    "parts": [{"text": "".join(WORDS[i % 10] for i in range(n))}],
                    "role": "model",
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 1200,
            "candidatesTokenCount": n,
            "totalTokenCount": 1200 + n,
        },
        "modelVersion": "gemini-2.5-flash",
    }
    request: dict[str, object] = {
        "contents": [{"role": "user", "parts": [{"text": "Tell me a story."}]}]
    }
    return request, events, json.dumps(body).encode()


def bedrock(n: int) -> tuple[dict[str, object], list[bytes], bytes]:
    def frame(event: str, payload: dict[str, object]) -> bytes:
        return encode_message(
            {":event-type": event, ":content-type": "application/json", ":message-type": "event"},
            json.dumps({**payload, "p": "abcdefghijkl"}).encode(),
        )

    usage = {"inputTokens": 1200, "outputTokens": n, "totalTokens": 1200 + n}
    events = [frame("messageStart", {"role": "assistant"})]
    for i in range(n):
        events.append(
            frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": WORDS[i % 10]}})
        )
    events += [
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("messageStop", {"stopReason": "end_turn"}),
        frame("metadata", {"usage": usage, "metrics": {"latencyMs": 1500}}),
    ]
    body = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [{"text": "".join(WORDS[i % 10] for i in range(n))}],
            }
        },
        "stopReason": "end_turn",
        "usage": usage,
        "metrics": {"latencyMs": 1500},
    }
    request: dict[str, object] = {
        "messages": [{"role": "user", "content": [{"text": "Tell me a story."}]}],
        "inferenceConfig": {"maxTokens": 4096},
    }
    return request, events, json.dumps(body).encode()


BUILDERS: dict[str, Callable[[int], tuple[dict[str, object], list[bytes], bytes]]] = {
    "anthropic-messages": anthropic,
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "gemini": gemini,
    "bedrock-converse": bedrock,
}

"""Hostile answers (issue 32): an upstream whose usage reads lower than it billed.

Each shape keeps the provider's bytes but reports the usage so that a reader keeping one
value of a repeated key, or the latest report, would charge less than what was billed
(the stats still count what was billed, ``FakeExchange.usage``: the ground truth a tap
is checked against). Applied to the answer as built, before any cut, error or gzip:

=====================  ===================================================================
``repeat-usage``       the usage object given a second time in the same object, all zero
                       (Bedrock invoke streams: the ``chunk``'s ``bytes`` given twice, the
                       second a zero ``message_delta``)
``repeat-escaped``     the same, its key written with a ``\\u`` escape (``"\\u0075sage"``)
``repeat-count``       inside the usage, the input and output counts given again as 0
``zero-after``         streams: the usage reported once more after the real one, zero
                       (a chunk, a ``message_delta``, a second terminal event, a
                       ``metadata`` frame); bodies: as ``repeat-usage``
``cheaper-model``      the answer names a cheaper model than the one requested
=====================  ===================================================================

A request picks one with the ``x-fake-hostile`` header (server.py; unknown names are
ignored), or ``synthesize(..., hostile=...)``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .eventstream import decode_message, event_stream_message
from .formats import EVENT_STREAMS, check_fmt

SHAPES: tuple[str, ...] = (
    "repeat-usage",
    "repeat-escaped",
    "repeat-count",
    "zero-after",
    "cheaper-model",
)

#: format -> the path of the usage object in a body (and in the event that carries it)
_BODY_USAGE: dict[str, tuple[str, ...]] = {
    "anthropic-messages": ("usage",),
    "openai-chat": ("usage",),
    "openai-responses": ("usage",),
    "gemini": ("usageMetadata",),
    "bedrock-converse": ("usage",),
    "bedrock-invoke": ("usage",),
}
#: format -> a usage object of that format with every count zero
ZERO_USAGE: dict[str, dict[str, int]] = {
    "anthropic-messages": {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    },
    "openai-chat": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    "openai-responses": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    "gemini": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
    "bedrock-converse": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
    "bedrock-invoke": {"input_tokens": 0, "output_tokens": 0},
}
#: format -> the input and output counts ``repeat-count`` gives again
_COUNTS: dict[str, tuple[str, str]] = {
    "anthropic-messages": ("input_tokens", "output_tokens"),
    "openai-chat": ("prompt_tokens", "completion_tokens"),
    "openai-responses": ("input_tokens", "output_tokens"),
    "gemini": ("promptTokenCount", "candidatesTokenCount"),
    "bedrock-converse": ("inputTokens", "outputTokens"),
    "bedrock-invoke": ("input_tokens", "output_tokens"),
}
#: format -> a model cheaper than any the fake is asked for in that format
CHEAPER: dict[str, str] = {
    "anthropic-messages": "claude-3-haiku-20240307",
    "openai-chat": "gpt-4o-mini",
    "openai-responses": "gpt-4o-mini",
    "gemini": "gemini-2.0-flash-lite",
    "bedrock-invoke": "claude-3-haiku-20240307",
}


def check_shape(shape: str) -> None:
    """Raise ValueError unless ``shape`` is one of :data:`SHAPES`."""
    if shape not in SHAPES:
        raise ValueError(f"unknown hostile shape {shape!r}; expected one of {', '.join(SHAPES)}")


# -- JSON with a key given twice ---------------------------------------------------------------
Extra = list[tuple[str, Any]]


def escaped(key: str) -> str:
    """``key`` as a JSON string whose first character is a ``\\u`` escape."""
    return f'"\\u{ord(key[0]):04x}' + json.dumps(key[1:])[1:]


def dumps_with(obj: Any, at: tuple[str, ...], extra: Extra) -> str:
    """``obj`` as compact JSON, the object at ``at`` followed by the ``extra`` members
    (each ``(key as written, value)``: the key may repeat one the object has)."""

    def dump(value: Any, path: tuple[str, ...]) -> str:
        if isinstance(value, dict):
            parts = [json.dumps(k) + ":" + dump(v, (*path, k)) for k, v in value.items()]
            if path == at:
                parts += [key + ":" + json.dumps(v, separators=(",", ":")) for key, v in extra]
            return "{" + ",".join(parts) + "}"
        if isinstance(value, list):
            return "[" + ",".join(dump(v, path) for v in value) + "]"
        return json.dumps(value, ensure_ascii=False)

    return dump(obj, ())


def _repeated(fmt: str, shape: str, obj: Any, usage_at: tuple[str, ...]) -> str:
    """``obj`` (a document carrying its usage at ``usage_at``) in a ``repeat-*`` shape."""
    zero = ZERO_USAGE[fmt]
    key = usage_at[-1]
    if shape == "repeat-count":
        first, second = _COUNTS[fmt]
        return dumps_with(obj, usage_at, [(json.dumps(first), 0), (json.dumps(second), 0)])
    written = escaped(key) if shape == "repeat-escaped" else json.dumps(key)
    return dumps_with(obj, usage_at[:-1], [(written, zero)])


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


# -- bodies ----------------------------------------------------------------------------------
def body(fmt: str, shape: str, data: bytes) -> bytes:
    """A whole (non-streamed) body in ``shape``."""
    check_fmt(fmt)
    check_shape(shape)
    obj = json.loads(data)
    if shape == "cheaper-model":
        return json.dumps(_cheaper(fmt, obj)).encode() if fmt in CHEAPER else data
    return _repeated(fmt, shape, obj, _BODY_USAGE[fmt]).encode()


def _cheaper(fmt: str, obj: Any) -> Any:
    """The document naming :data:`CHEAPER` wherever it names its model."""
    cheap = CHEAPER[fmt]
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for key in ("model", "modelVersion"):
        if key in out:
            out[key] = cheap
    for key in ("message", "response"):
        if isinstance(out.get(key), dict) and "model" in out[key]:
            out[key] = {**out[key], "model": cheap}
    return out


# -- streams ---------------------------------------------------------------------------------
def _sse(chunk: bytes) -> tuple[str | None, Any, bool]:
    """(event name, data parsed, CRLF) of one of the fake's own SSE events."""
    crlf = chunk.endswith(b"\r\n\r\n")
    text = chunk.decode()
    name = None
    data = ""
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
    return name, (json.loads(data) if data and data != "[DONE]" else data), crlf


def _event(name: str | None, data: str, crlf: bool) -> bytes:
    eol = "\r\n" if crlf else "\n"
    head = f"event: {name}{eol}" if name else ""
    return f"{head}data: {data}{eol}{eol}".encode()


def _usage_at(fmt: str, name: str | None, obj: Any) -> tuple[str, ...] | None:
    """Where the SSE event ``obj`` carries its (final) usage, or None."""
    if not isinstance(obj, dict):
        return None
    if fmt == "openai-responses":
        terminal = name in ("response.completed", "response.incomplete", "response.failed")
        usage = _get(obj, ("response", "usage"))
        return ("response", "usage") if terminal and usage is not None else None
    if fmt == "anthropic-messages":
        return ("usage",) if obj.get("type") == "message_delta" else None
    key = _BODY_USAGE[fmt][0]
    return (key,) if obj.get(key) is not None else None


def stream(
    fmt: str, shape: str, chunks: list[bytes], usage_after: int | None
) -> tuple[list[bytes], int | None]:
    """A streamed answer's chunks in ``shape``; the chunk whose usage is whole stays where
    it was (``usage_after``)."""
    check_fmt(fmt)
    check_shape(shape)
    if fmt in EVENT_STREAMS:
        frames, inserted = _frames(fmt, shape, chunks)
        return frames, _shifted(usage_after, inserted)
    out = list(chunks)
    last = None
    for i, chunk in enumerate(chunks):  # the last event carrying usage: the final one
        name, obj, _ = _sse(chunk)
        if _usage_at(fmt, name, obj) is not None:
            last = i
    if shape == "cheaper-model":
        if fmt in CHEAPER:
            for i, chunk in enumerate(chunks):
                name, obj, crlf = _sse(chunk)
                if isinstance(obj, dict):
                    out[i] = _event(name, json.dumps(_cheaper(fmt, obj)), crlf)
        return out, usage_after
    if last is None:  # no usage (chat without include_usage): nothing to repeat
        return out, usage_after
    name, obj, crlf = _sse(chunks[last])
    at = _usage_at(fmt, name, obj)
    assert at is not None
    if shape != "zero-after":
        out[last] = _event(name, _repeated(fmt, shape, obj, at), crlf)
        return out, usage_after
    again = _set(obj, at, ZERO_USAGE[fmt])
    if fmt == "gemini":  # the last chunk again, its text spent
        again = {**again, "candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}}]}
    out.insert(last + 1, _event(name, json.dumps(again), crlf))
    return out, _shifted(usage_after, last + 1)


def _shifted(usage_after: int | None, inserted: int | None) -> int | None:
    """``usage_after`` once a chunk is inserted at ``inserted`` (None: none was)."""
    if usage_after is None or inserted is None or inserted >= usage_after:
        return usage_after
    return usage_after + 1


def _set(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``path``."""
    if not path:
        return value
    return {**obj, path[0]: _set(obj.get(path[0], {}), path[1:], value)}


def _frames(fmt: str, shape: str, frames: list[bytes]) -> tuple[list[bytes], int | None]:
    """Bedrock's event-stream frames in ``shape``, and where a frame was inserted."""
    out = list(frames)
    decoded = [decode_message(frame) for frame in frames]
    if fmt == "bedrock-converse":
        where = [i for i, (h, _) in enumerate(decoded) if h.get(":event-type") == "metadata"]
        if not where or shape == "cheaper-model":  # Converse names no model
            return out, None
        i = where[-1]
        headers, payload = decoded[i]
        obj = json.loads(payload)
        if shape == "zero-after":
            again = {**obj, "usage": ZERO_USAGE[fmt]}
            out.insert(i + 1, event_stream_message(headers, json.dumps(again).encode()))
            return out, i + 1
        text = _repeated(fmt, shape, obj, ("usage",))
        out[i] = event_stream_message(headers, text.encode())
        return out, None
    # bedrock-invoke: each chunk's payload {"bytes": base64 of an Anthropic event, "p"}
    events = [(h, json.loads(p)) for h, p in decoded]

    def inner(payload: dict[str, Any]) -> Any:
        return json.loads(base64.b64decode(payload["bytes"]))

    def wrap(headers: dict[str, str], payload: dict[str, Any], event: str) -> bytes:
        new = {**payload, "bytes": base64.b64encode(event.encode()).decode()}
        return event_stream_message(headers, json.dumps(new).encode())

    deltas = [i for i, (_, p) in enumerate(events) if inner(p).get("type") == "message_delta"]
    if shape == "cheaper-model":
        for i, (headers, payload) in enumerate(events):
            event = inner(payload)
            if event.get("type") == "message_start":
                out[i] = wrap(headers, payload, json.dumps(_cheaper("anthropic-messages", event)))
        return out, None
    if not deltas:
        return out, None
    i = deltas[-1]
    headers, payload = events[i]
    event = inner(payload)
    zero_delta = {**event, "usage": ZERO_USAGE[fmt]}
    if shape == "repeat-usage":  # the chunk's bytes given twice, the second a zero delta
        second = base64.b64encode(json.dumps(zero_delta).encode()).decode()
        text = dumps_with(payload, (), [('"bytes"', second)])
        out[i] = event_stream_message(headers, text.encode())
    elif shape == "zero-after":
        out.insert(i + 1, wrap(headers, payload, json.dumps(zero_delta)))
        return out, i + 1
    else:
        out[i] = wrap(headers, payload, _repeated(fmt, shape, event, ("usage",)))
    return out, None

"""OpenAI Chat Completions (``POST /v1/chat/completions``) and compatible servers.

Streamed: SSE of ``data:`` chunks ending with ``data: [DONE]``. Usage arrives
only with ``stream_options.include_usage``, in a last chunk whose ``choices``
is empty (``[]``; ``null`` or absent on some compatible servers). Servers that
put a cumulative ``usage`` in every chunk are read too (each a report, the
maximum charged), and the usage is final once the ``choices``-less chunk, ``[DONE]`` or a normal end of the
stream (not after an error chunk) says so. Chunks have no event type, so each is parsed (its ``model``,
``error``, ``usage``, and the text of ``choices[].delta`` for the estimate).

With ``delta_text="payload_bytes"`` chunks are not parsed as they pass: the
last few are kept (bounded) and parsed at the end, where the usage chunk is,
and every chunk counts as a delta with its payload bytes as text.

Not streamed: one ``chat.completion`` JSON object with ``model`` and ``usage``.

Every ``usage`` is a report: the call is charged the field-wise maximum of all of
them (``Handler.report``), so a usage chunk repeated later with zero counts, or a
``usage`` (or a count in it) given twice in one chunk or body, lowers nothing.
With ``payload_bytes`` a chunk pushed out of the kept few is read all the same
when it may carry usage (its bytes name ``usage`` other than as ``null``).

``prompt_tokens`` includes ``prompt_tokens_details.cached_tokens`` (subtracted
for ``input_tokens``); ``completion_tokens`` includes
``completion_tokens_details.reasoning_tokens``. There are no cache writes.
"""

from __future__ import annotations

from typing import Any

from .base import (
    Handler,
    Path,
    RecentPayloads,
    describe_error,
    may_repeat,
    read_shape,
    read_shaped_run,
    shape_decoder,
    text_len,
)
from .estimate import EstimatorConfig
from .fastjson import loads
from .request import RequestInfo
from .shapes import ChatChunk
from .usage import Usage, modality_units, openai_usage

_PATHS = frozenset({("usage",), ("model",), ("error",), ("choices",), ("service_tier",)})


_read_chunk = shape_decoder(ChatChunk)
#: the keys a chunk (or a body) carrying usage gives at most once
REPEAT_KEYS = (
    b'"usage"',
    b'"prompt_tokens"',
    b'"completion_tokens"',
    b'"prompt_tokens_details"',
    b'"completion_tokens_details"',
    b'"cached_tokens"',
    b'"reasoning_tokens"',
)
_USAGE_KEY = b'"usage"'
_NULL_USAGE = b'"usage":null'


def usage_from(raw: Any) -> Usage:
    return openai_usage(raw, "prompt_tokens", "completion_tokens")


class OpenAIChatHandler(Handler):
    fmt = "openai-chat"
    body_paths = frozenset({("usage",), ("model",), ("error",), ("service_tier",)})
    repeat_keys = REPEAT_KEYS

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)
        self._usage: Any = None
        self._usage_final = False
        self._done = False
        self._body = False
        self._recent = RecentPayloads()
        self._first = True

    def usage_from(self, raw: Any) -> Usage:
        return usage_from(raw)

    # -- streamed ------------------------------------------------------------
    def on_event(self, name: bytes, data: bytes) -> None:
        if data[:6] == b"[DONE]" and data.strip() == b"[DONE]":
            self._done = True
            return
        if self.parse_deltas:
            chunk = read_shape(_read_chunk, data) if self.model is not None else None
            if chunk is not None:
                self.delta_events += 1
                delta = chunk.choices[0].delta
                reasoning = len(delta.reasoning_content or "") + len(delta.reasoning or "")
                self.reasoning_chars += reasoning
                self.text_chars += reasoning + len(delta.content or "") + len(delta.refusal or "")
                return
            obj, problem = loads(data)
            if type(obj) is not dict:
                if problem is not None:
                    self.problem(problem)
                return
            if may_repeat(data, REPEAT_KEYS):
                found = self.each_reading(data, obj)
                if len(found) > 1 or found[0] is not obj:
                    self._readings(found)
                    return
            choices = obj.get("choices")
            if (  # the common chunk: one choice's delta, no usage, no error
                type(choices) is list
                and len(choices) == 1
                and obj.get("usage") is None
                and not obj.get("error")
                and self.model is not None
            ):
                self.delta_events += 1
                choice = choices[0]
                delta = choice.get("delta") if type(choice) is dict else None
                if type(delta) is dict:
                    self._delta(delta)
                return
            self._chunk(obj)
            return
        # payload_bytes: parse the first chunk (model) and the last few at the end.
        self.delta_events += 1
        self.text_chars += len(data)
        if self._first:
            self._first = False
            obj = self.parse(data)
            if isinstance(obj, dict):
                self.set_model(obj.get("model"))
        out = self._recent.push(data)
        if out is not None:
            for old in out:
                if _may_carry_usage(old):  # every usage report counts, not the last few
                    self._readings(self.parse_each(old, REPEAT_KEYS), count=False)

    def on_events(self, events: list[tuple[bytes, bytes]]) -> None:
        if not self.parse_deltas:
            super().on_events(events)
            return
        self.on_datas([data for _, data in events])  # chunks have no event names

    def on_datas(self, datas: list[bytes]) -> None:
        if not self.parse_deltas:
            for data in datas:
                self.on_event(b"", data)
            return
        # The first chunk (the model) one by one; then runs of the common chunk at once.
        start = 0
        while self.model is None and start < len(datas):
            self.on_event(b"", datas[start])
            start += 1
        if start < len(datas):
            run = datas[start:] if start else datas
            read_shaped_run(_read_chunk, run, self._common_chunks, self._other_chunk)

    def _common_chunks(self, chunks: list[Any], payloads: list[bytes]) -> None:
        """What ``on_event`` does for each chunk read as ``ChatChunk``, added up."""
        text = 0
        reasoning = 0
        for chunk in chunks:
            delta = chunk.choices[0].delta
            reasoning += len(delta.reasoning_content or "") + len(delta.reasoning or "")
            text += len(delta.content or "") + len(delta.refusal or "")
        self.delta_events += len(chunks)
        self.reasoning_chars += reasoning
        self.text_chars += reasoning + text

    def _other_chunk(self, data: bytes) -> None:
        self.on_event(b"", data)

    def _readings(self, found: list[Any], count: bool = True) -> None:
        """The readings of one chunk (repeats.py), each a chunk; counted once."""
        for obj in found:
            if isinstance(obj, dict):
                self._chunk(obj, count=count)
            count = False

    def _chunk(self, obj: dict[str, Any], *, count: bool = True) -> None:
        self.set_model(obj.get("model"))
        self.set_service_tier(obj.get("service_tier"))
        if obj.get("error"):
            self.error(describe_error(obj))
        choices = obj.get("choices")
        if choices and count:
            self.delta_events += 1
            if isinstance(choices, list):
                for choice in choices:
                    delta = choice.get("delta") if isinstance(choice, dict) else None
                    if isinstance(delta, dict):
                        self._delta(delta)
        if "usage" in obj and obj["usage"] is not None:
            self._report(obj["usage"])
            self._usage_final = not choices

    def _report(self, usage: Any) -> None:
        self._usage = usage
        if self.report(usage) is not None:
            self.count_units(modality_units(usage, "prompt_tokens", "completion_tokens"))

    def _delta(self, delta: dict[str, Any]) -> None:
        if len(delta) == 1:
            content = delta.get("content")
            if type(content) is str:
                self.text_chars += len(content)
                return
        reasoning = text_len(delta.get("reasoning_content")) + text_len(delta.get("reasoning"))
        self.reasoning_chars += reasoning
        chars = reasoning + text_len(delta.get("content")) + text_len(delta.get("refusal"))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    chars += text_len(function.get("arguments")) + text_len(function.get("name"))
        audio = delta.get("audio")
        if isinstance(audio, dict):
            chars += text_len(audio.get("transcript"))
        self.text_chars += chars

    def large_event_paths(self, name: bytes) -> frozenset[Path]:
        return _PATHS

    def on_large_event(
        self, name: bytes, obj: dict[str, Any], size: int, ended: bool, count: bool = True
    ) -> None:
        if count and not ("choices" in obj and not obj["choices"]):  # unless a usage chunk
            self.delta_events += 1
            self.text_chars += size  # bytes bound the text from above
        if ended:
            self._chunk(obj, count=False)

    # -- not streamed --------------------------------------------------------
    def on_body(self, obj: Any, size: int) -> None:
        self._body = True
        if not isinstance(obj, dict):
            self.problem("unreadable: the body is not a JSON object")
            return
        self.set_model(obj.get("model"))
        self.set_service_tier(obj.get("service_tier"))
        if obj.get("error"):
            self.error(describe_error(obj))
        usage = obj.get("usage")
        if usage is not None:
            self._report(usage)

    # -- end -----------------------------------------------------------------
    def final_usage(self, cut: str | None) -> Usage | None:
        for data in self._recent.drain():  # oldest first
            self._readings(self.parse_each(data, REPEAT_KEYS), count=False)
        usage = self.reported
        if usage is None:
            return None
        if self._body:
            return usage
        self.partial = usage
        ended = cut is None and self.upstream_error is None
        return usage if self._usage_final or self._done or ended else None

    def incomplete_reason(self) -> str:
        if self._body:
            return "no_usage: the body carries no usage"
        if self._done:
            return "no_usage: no usage chunk (was stream_options.include_usage set?)"
        return "stream_incomplete: the stream ended without [DONE]"


def _may_carry_usage(data: bytes) -> bool:
    """Whether a chunk's bytes could give a usage other than ``null`` (not a reading:
    a test of whether to read it, as ``may_repeat``)."""
    named = data.count(_USAGE_KEY)
    return (named > 0 and named != data.count(_NULL_USAGE)) or may_repeat(data, ())

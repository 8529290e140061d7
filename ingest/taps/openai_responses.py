"""OpenAI Responses API (``POST /v1/responses``).

Streamed: SSE with ``event:`` lines naming the ``type`` of each JSON event.
The usage is in ``response.usage`` of the terminal event:
``response.completed``, ``response.incomplete`` or ``response.failed`` (the
last may have none). ``response.created`` gives the model early; ``error``
events may follow a 200. Those are parsed, plus ``*.delta`` events for the
estimate's text (``delta``), unless ``delta_text="payload_bytes"``; audio deltas
count as one token each (their base64 is not text). Everything else (output
items, content parts, ``*.done`` events repeating the text) is not parsed.

Not streamed: one ``response`` JSON object with ``model``, ``status`` and
``usage`` (a ``background`` response is ``queued`` with no usage yet: it is
estimated, and the request's background mode lifts the input floor).

``input_tokens`` includes ``input_tokens_details.cached_tokens``;
``output_tokens`` includes ``output_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from .base import (
    Handler,
    Path,
    describe_error,
    may_repeat,
    read_shape,
    shape_decoder,
    text_len,
)
from .estimate import EstimatorConfig
from .fastjson import loads
from .request import RequestInfo
from .shapes import ResponsesTextDelta
from .usage import Usage, modality_units, openai_usage

TERMINAL = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})
_EARLY = frozenset({b"response.created", b"response.in_progress", b"response.queued"})
_AUDIO = frozenset({b"response.output_audio.delta", b"response.audio.delta"})
_REASONING = frozenset({b"response.reasoning_text.delta", b"response.reasoning_summary_text.delta"})
_RESPONSE_PATHS = frozenset(
    {
        ("response", "usage"),
        ("response", "model"),
        ("response", "status"),
        ("response", "error"),
        ("response", "service_tier"),
        # whole (a sparse "*" path keeps one element): tool calls are counted from it;
        # above the capture limit (64 KiB of output) they are not (README, "Billed units")
        ("response", "output"),
    }
)
#: output item types billed per call -> the unit they count (schemas/billed_units.py)
TOOL_CALL_UNITS = {
    "web_search_call": "web_search",
    "file_search_call": "file_search",
    "code_interpreter_call": "code_interpreter",
    "image_generation_call": "image_generation",
}
_ERROR_PATHS = frozenset({("code",), ("message",), ("error",), ("type",)})
#: the keys a response object (an event's or the body) carrying usage gives at most once
REPEAT_KEYS = (
    b'"usage"',
    b'"input_tokens"',
    b'"output_tokens"',
    b'"input_tokens_details"',
    b'"output_tokens_details"',
    b'"cached_tokens"',
    b'"reasoning_tokens"',
    b'"output"',
)


def _may_repeat_event(data: bytes, named: bool) -> bool:
    """``may_repeat`` for an event: its usage keys (not the response on the way to them: a
    response given twice gives "usage" twice, or an escape), and for one read by its type
    (no ``event:`` name) a type given twice beside a usage (which type a reader keeps
    decides whether the usage is read)."""
    if may_repeat(data, REPEAT_KEYS):
        return True
    return not named and data.count(b'"type"') > 1 and b'"usage"' in data


_read_text_delta = shape_decoder(ResponsesTextDelta)
_delta_of = attrgetter("delta")
#: The common event, read in runs (``on_events``).
_OUTPUT_TEXT_DELTA = b"response.output_text.delta"


def usage_from(raw: Any) -> Usage:
    return openai_usage(raw, "input_tokens", "output_tokens")


class OpenAIResponsesHandler(Handler):
    fmt = "openai-responses"
    repeat_keys = REPEAT_KEYS
    body_paths = frozenset(
        {
            ("usage",),
            ("model",),
            ("status",),
            ("error",),
            ("service_tier",),
            ("output",),
        }
    )

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)
        self._usage: Any = None
        self._terminal: str | None = None
        self._status: str | None = None
        self._body = False

    def usage_from(self, raw: Any) -> Usage:
        return usage_from(raw)

    # -- streamed ------------------------------------------------------------
    def on_event(self, name: bytes, data: bytes) -> None:
        if name.endswith(b".delta"):
            self.delta_events += 1
            if name in _AUDIO:
                return
            if not self.parse_deltas:
                self.text_chars += len(data)
                return
            event = read_shape(_read_text_delta, data)
            if event is not None:
                chars = len(event.delta)
                self.text_chars += chars
                if name in _REASONING:
                    self.reasoning_chars += chars
                return
            obj = self.parse(data)
            if isinstance(obj, dict):
                self._delta(name, obj)
        elif name in TERMINAL or name in _EARLY or name == b"error" or not name:
            obj, problem = loads(data)
            if problem is not None:
                self.problem(problem)
            if not isinstance(obj, dict):
                return
            repeats = _may_repeat_event(data, bool(name))
            found = self.each_reading(data, obj) if repeats else [obj]
            counted = False
            for reading in found:  # one event, or each reading of its repeated keys
                if isinstance(reading, dict):
                    counted = self._event(name, reading, counted)

    def _event(self, name: bytes, obj: dict[str, Any], counted: bool) -> bool:
        """One event read whole (``name`` b"": by its type); whether a delta was counted
        (a delta is counted once, whatever readings it has)."""
        if not name:
            kind = obj.get("type")
            if not isinstance(kind, str):
                return counted
            name = kind.encode()
            if name.endswith(b".delta"):
                if not counted:
                    self.delta_events += 1
                    if name not in _AUDIO:
                        self._delta(name, obj)
                return True
        self._on(name, obj)
        return counted

    def on_events(self, events: list[tuple[bytes, bytes]]) -> None:
        # Runs of output text deltas are read at once; the rest one by one, in order.
        on_event = self.on_event
        run: list[bytes] = []
        for name, data in events:
            if name == _OUTPUT_TEXT_DELTA:
                run.append(data)
                continue
            if run:
                self._text_deltas(run)
                run = []
            on_event(name, data)
        if run:
            self._text_deltas(run)

    def _text_deltas(self, run: list[bytes]) -> None:
        self.read_delta_run(run, _read_text_delta, self._shaped_deltas, self._other_delta)

    def _shaped_deltas(self, events: list[ResponsesTextDelta], payloads: list[bytes]) -> None:
        self.delta_events += len(events)
        self.text_chars += sum(map(len, map(_delta_of, events)))

    def _other_delta(self, data: bytes) -> None:
        self.on_event(_OUTPUT_TEXT_DELTA, data)

    def _delta(self, name: bytes, obj: dict[str, Any]) -> None:
        chars = text_len(obj.get("delta"))
        self.text_chars += chars
        if name in _REASONING:
            self.reasoning_chars += chars

    def _on(self, name: bytes, obj: dict[str, Any]) -> None:
        if name == b"error":
            self.error(describe_error(obj) if obj.get("error") else _error_event(obj))
            return
        response = obj.get("response")
        if not isinstance(response, dict):
            return
        self.set_model(response.get("model"))
        if name in TERMINAL:
            self._terminal = name.decode()
            self._read_response(response)

    def _read_response(self, response: dict[str, Any]) -> None:
        status = response.get("status")
        self._status = status if isinstance(status, str) else None
        if response.get("error"):
            self.error(describe_error(response))
        usage = response.get("usage")
        if usage is not None:
            self._usage = usage
            if self.report(usage) is not None:
                self.count_units(modality_units(usage, "input_tokens", "output_tokens"))
        self.set_service_tier(response.get("service_tier"))
        output = response.get("output")
        if isinstance(output, list):
            counts: dict[str, int] = {}
            containers: set[str] = set()
            unnamed = False
            for item in output:
                kind = item.get("type") if isinstance(item, dict) else None
                unit = TOOL_CALL_UNITS.get(kind) if isinstance(kind, str) else None
                if unit is not None:
                    counts[unit] = counts.get(unit, 0) + 1
                if kind == "code_interpreter_call":
                    container = item.get("container_id")
                    if isinstance(container, str) and container:
                        containers.add(container)
                    else:
                        unnamed = True  # a session all the same: counted once
            if containers or unnamed:
                # a container the request named by id was made by the Containers API,
                # which bills it; the others were made for this response
                made = containers.difference(self.request.containers)
                counts["code_interpreter_session"] = len(made) + (1 if unnamed else 0)
            if counts:  # the terminal response lists every call; response.created none
                self.count_units(counts)

    def large_event_paths(self, name: bytes) -> frozenset[Path]:
        if name in TERMINAL or name in _EARLY:
            return _RESPONSE_PATHS
        if name == b"error":
            return _ERROR_PATHS
        if not name:
            return _RESPONSE_PATHS | _ERROR_PATHS
        return frozenset()

    def on_large_event(
        self, name: bytes, obj: dict[str, Any], size: int, ended: bool, count: bool = True
    ) -> None:
        if not name and isinstance(obj.get("type"), str):
            name = obj["type"].encode()
        if name.endswith(b".delta") or not name:
            if count:
                self.delta_events += 1
                if name not in _AUDIO:
                    self.text_chars += size  # bytes bound the text from above
        elif ended and (name in TERMINAL or name in _EARLY or name == b"error"):
            self._on(name, obj)

    # -- not streamed --------------------------------------------------------
    def on_body(self, obj: Any, size: int) -> None:
        self._body = True
        if not isinstance(obj, dict):
            self.problem("unreadable: the body is not a JSON object")
            return
        self.set_model(obj.get("model"))
        self._read_response(obj)

    # -- end -----------------------------------------------------------------
    def final_usage(self, cut: str | None) -> Usage | None:
        usage = self.reported
        if usage is None:
            return None
        if self._body or self._terminal is not None:
            return usage
        self.partial = usage
        return None

    def incomplete_reason(self) -> str:
        if self._body:
            return f"no_usage: the response is {self._status or 'without usage'}"
        if self._terminal is not None:
            return f"no_usage: {self._terminal} carries no usage"
        return "stream_incomplete: the stream ended before response.completed"


def _error_event(obj: dict[str, Any]) -> str:
    parts = [str(obj[k]) for k in ("code", "message") if isinstance(obj.get(k), str | int)]
    return ": ".join(parts) or "error event"

"""Anthropic Messages API (``POST /v1/messages``).

Streamed: SSE with ``event:`` lines. ``message_start`` carries
``message.model`` and ``message.usage`` (input counts final, output so far);
each ``message_delta`` carries a cumulative ``usage`` (several with server
tools): the latest value of each field wins, never a sum. ``message_stop``
ends the message. ``error`` events may follow a 200. Only those events are
parsed, plus ``content_block_start`` (for a ``fallback`` block) and
``content_block_delta`` for the estimate's text (text, partial_json, thinking)
unless ``delta_text="payload_bytes"``.

Not streamed: one JSON message with ``model`` and ``usage``.

Every usage the response gives is a report, cumulative: each field's latest value
replaces the last (``message_delta`` may omit fields), and the call is charged the
field-wise maximum of the usage after each report (``Handler.report``), so a later
``message_delta`` with lower or zero counts, or a ``usage`` (or a count in it) given
twice in one event or body, lowers nothing.

The serving model. With server-side fallback (beta
``server-side-fallback-2026-07-01``) another model may answer: a stream's
``message_start`` names the requested model, then a ``fallback`` content block
(``from``, ``to``, ``trigger``; via ``content_block_start``, no deltas) marks each
hop and ``usage.iterations`` holds a ``fallback_message`` entry for the hop that
served. The tap relabels the call to the serving model as the SDK does: the
``fallback_message`` iteration's ``model``, else the last block's ``to.model``.
A non-streamed body already names the serving model in ``model``. The relabel is
priced (``Handler.relabelled_to``) only for a request that allowed fallback
(``fallbacks``): an answer to any other that names another model is priced as
requested (usage.py, ``priced_model``).

``input_tokens`` already excludes cache reads and writes;
``cache_creation_input_tokens`` is every cache write and
``cache_creation.ephemeral_1h_input_tokens`` its 1-hour part. Thinking tokens
are inside ``output_tokens`` (which stays the billed total);
``output_tokens_details.thinking_tokens``, when the response carries it, is
their count: ``reasoning_tokens``.
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
from .shapes import AnthropicTextDelta
from .usage import InvalidUsage, TapResult, Usage, sub, tok

_SKIP = frozenset({b"ping", b"content_block_stop"})
_START = frozenset({("message", "usage"), ("message", "model")})
_BLOCK_START = frozenset({("content_block", "type"), ("content_block", "to", "model")})
_DELTA = frozenset({("usage",)})
_ERROR = frozenset({("error",)})
_ANY = _START | _DELTA | _ERROR | _BLOCK_START | {("type",)}


#: the keys an event (or the body) carrying usage gives at most once (not the objects on
#: the way to the usage: one of those given twice gives "usage" twice, or an escape)
REPEAT_KEYS = (
    b'"usage"',
    b'"input_tokens"',
    b'"output_tokens"',
    b'"cache_read_input_tokens"',
    b'"cache_creation_input_tokens"',
    b'"cache_creation"',
    b'"ephemeral_5m_input_tokens"',
    b'"ephemeral_1h_input_tokens"',
    b'"output_tokens_details"',
    b'"thinking_tokens"',
    b'"server_tool_use"',
    b'"iterations"',
)
_TYPE_KEY = b'"type"'
_USAGE_KEY = b'"usage"'


def may_repeat_event(data: bytes | bytearray, named: bool) -> bool:
    """``may_repeat`` for an event: its usage keys, and for one read by its type (no
    ``event:`` name; Bedrock's chunks) a type given twice beside a usage (which type a
    reader keeps decides whether the usage is read)."""
    if may_repeat(data, REPEAT_KEYS):
        return True
    return not named and data.count(_TYPE_KEY) > 1 and _USAGE_KEY in data


_read_text_delta = shape_decoder(AnthropicTextDelta)
_delta_text = attrgetter("delta.text")
_DELTA_EVENT = b"content_block_delta"


def usage_from(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        raise InvalidUsage("usage is not an object")
    cache_write = tok(raw, "cache_creation_input_tokens")
    breakdown = raw.get("cache_creation") if isinstance(raw, dict) else None
    write_1h = tok(breakdown, "ephemeral_1h_input_tokens")
    write_5m = tok(breakdown, "ephemeral_5m_input_tokens")
    # The breakdown should add up to the total; if it adds up to more, charge more.
    cache_write = max(cache_write, write_1h + write_5m)
    output = tok(raw, "output_tokens", required=True)
    thinking = tok(raw.get("output_tokens_details"), "thinking_tokens")
    sub(output, thinking, "output_tokens", "output_tokens_details.thinking_tokens")  # validates
    return Usage(
        input_tokens=tok(raw, "input_tokens", required=True),
        cache_read_tokens=tok(raw, "cache_read_input_tokens"),
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=write_1h,
        output_tokens=output,
        reasoning_tokens=thinking,
    )


def served_by_iterations(usage: Any) -> str | None:
    """The model of the ``fallback_message`` entry of ``usage.iterations`` (the hop that
    served a server-side fallback request), or None."""
    iterations = usage.get("iterations") if isinstance(usage, dict) else None
    if not isinstance(iterations, list):
        return None
    served = None
    for item in iterations:
        if isinstance(item, dict) and item.get("type") == "fallback_message":
            model = item.get("model")
            if isinstance(model, str) and model:
                served = model
    return served


def declined_hops(usage: Any) -> list[tuple[str, Any]]:
    """The ``usage.iterations`` entries of hops that were declined after writing output,
    as (model, entry): every entry before the last ``fallback_message`` (the hop that
    served, charged as the call) with output tokens. Anthropic bills each at its own
    model's rates; a hop declined before any output is not billed."""
    iterations = usage.get("iterations") if isinstance(usage, dict) else None
    if not isinstance(iterations, list):
        return []
    served = -1
    for i, item in enumerate(iterations):
        if isinstance(item, dict) and item.get("type") == "fallback_message":
            served = i
    hops: list[tuple[str, Any]] = []
    for item in iterations[: max(served, 0)]:
        if not isinstance(item, dict):
            continue
        model = item.get("model")
        output = item.get("output_tokens")
        if isinstance(model, str) and model and output != 0 and output is not None:
            hops.append((model[:200], item))
    return hops


def fallback_target(block: Any) -> str | None:
    """``to.model`` of a ``fallback`` content block, or None for any other block."""
    if not isinstance(block, dict) or block.get("type") != "fallback":
        return None
    target = block.get("to")
    model = target.get("model") if isinstance(target, dict) else None
    return model if isinstance(model, str) and model else None


class AnthropicHandler(Handler):
    fmt = "anthropic-messages"
    body_paths = frozenset({("usage",), ("model",), ("type",), ("error",)})
    repeat_keys = REPEAT_KEYS

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)
        self._usage: dict[str, Any] = {}
        self._started = False
        self._delta_usage = False
        self._stopped = False
        self._body = False

    def usage_from(self, raw: Any) -> Usage:
        return usage_from(raw)

    # -- streamed ------------------------------------------------------------
    def on_event(self, name: bytes, data: bytes) -> None:
        if name == b"content_block_delta":
            self.delta_events += 1
            if not self.parse_deltas:
                self.text_chars += len(data)
                return
            event = read_shape(_read_text_delta, data)
            if event is not None:
                self.text_chars += len(event.delta.text)
                return
            obj, problem = loads(data)
            delta = obj.get("delta") if type(obj) is dict else None
            if type(delta) is dict:
                text = delta.get("text")
                if type(text) is str:  # the common case, kept short
                    self.text_chars += len(text)
                else:
                    self._on("content_block_delta", obj)
            elif problem is not None:
                self.problem(problem)
            return
        if name in _SKIP:
            return
        obj, problem = loads(data)
        if problem is not None:
            self.problem(problem)
            return
        found = self.each_reading(data, obj) if may_repeat_event(data, bool(name)) else [obj]
        self.on_parsed(name, found)

    def on_parsed(self, name: bytes, found: list[Any]) -> None:
        """One event (``name`` b"": by its type), as each reading of its repeated keys;
        a delta is counted once."""
        counted = False
        for obj in found:
            if not isinstance(obj, dict):
                continue
            kind = name.decode("ascii", "replace") if name else obj.get("type")
            if kind == "content_block_delta":
                if counted:
                    continue
                counted = True
                if not name:
                    self.delta_events += 1
            self._on(kind, obj)

    def on_events(self, events: list[tuple[bytes, bytes]]) -> None:
        # Runs of content_block_delta are read at once; the rest one by one, in order.
        on_event = self.on_event
        run: list[bytes] = []
        for name, data in events:
            if name == _DELTA_EVENT:
                run.append(data)
                continue
            if run:
                self._deltas(run)
                run = []
            on_event(name, data)
        if run:
            self._deltas(run)

    def _deltas(self, run: list[bytes]) -> None:
        self.read_delta_run(run, _read_text_delta, self._text_deltas, self._other_delta)

    def _text_deltas(self, events: list[AnthropicTextDelta], payloads: list[bytes]) -> None:
        self.delta_events += len(events)
        self.text_chars += sum(map(len, map(_delta_text, events)))

    def _other_delta(self, data: bytes) -> None:
        self.on_event(_DELTA_EVENT, data)

    def _on(self, kind: Any, obj: dict[str, Any]) -> None:
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                thinking = text_len(delta.get("thinking"))
                self.reasoning_chars += thinking
                self.text_chars += (
                    thinking + text_len(delta.get("text")) + text_len(delta.get("partial_json"))
                )
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self.set_model(message.get("model"))
                self._merge(message.get("usage"))
            self._started = True
        elif kind == "content_block_start":
            self.relabel(fallback_target(obj.get("content_block")))
        elif kind == "message_delta":
            if self._merge(obj.get("usage")):
                self._delta_usage = True
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            self.error(describe_error(obj) or "error event")

    def relabel(self, model: str | None) -> None:
        """The serving model a server-side fallback names: the call's model, priced as
        served when the request allowed fallback (its ``fallbacks``), else noted and
        priced as requested (``priced_model``)."""
        if model is not None:
            self.set_model(model)
            if self.request.fallbacks:
                self.relabelled_to = self.model

    def _merge(self, usage: Any) -> bool:
        """Cumulative usage: each field's latest value replaces the previous; the usage
        after each report is one (``Handler.report``: the maximum is charged)."""
        if isinstance(usage, dict):
            self._usage.update((k, v) for k, v in usage.items() if v is not None)
            self.report(self._usage)
            tools = usage.get("server_tool_use")
            if tools is not None:
                self._read_units(tools)
            self.relabel(served_by_iterations(usage))
            return True
        if usage is not None:
            self.problem("invalid_usage: usage is not an object")
        return False

    def large_event_paths(self, name: bytes) -> frozenset[Path]:
        if name == b"message_start":
            return _START
        if name == b"message_delta":
            return _DELTA
        if name == b"error":
            return _ERROR
        if name == b"content_block_start":
            return _BLOCK_START
        return _ANY if not name else frozenset()

    def on_large_event(
        self, name: bytes, obj: dict[str, Any], size: int, ended: bool, count: bool = True
    ) -> None:
        kind: Any = name.decode("ascii", "replace") if name else obj.get("type")
        if kind == "content_block_delta" or (not name and kind is None):
            if count:
                self.delta_events += 1
                self.text_chars += size  # bytes bound the text from above
        elif ended and kind not in ("ping", "content_block_stop"):
            self._on(kind, obj)

    # -- not streamed --------------------------------------------------------
    def on_body(self, obj: Any, size: int) -> None:
        self._body = True
        if not isinstance(obj, dict):
            self.problem("unreadable: the body is not a JSON object")
            return
        self.set_model(obj.get("model"))
        if obj.get("type") == "error" or "error" in obj:
            self.error(describe_error(obj))
        self._merge(obj.get("usage"))

    # -- end -----------------------------------------------------------------
    def _read_units(self, tools: Any) -> None:
        """A report's ``server_tool_use.<tool>_requests`` counts (web_search, web_fetch,
        ...): each unit is charged the most any report counted."""
        counts: dict[str, int] = {}
        if isinstance(tools, dict):
            for key in tools:
                if isinstance(key, str) and key.endswith("_requests"):
                    try:
                        counts[key[: -len("_requests")]] = tok(tools, key)
                    except InvalidUsage as exc:
                        self.problem(f"invalid_usage: server_tool_use: {exc}")
        else:
            self.problem("invalid_usage: server_tool_use is not an object")
        self.count_units(counts)

    def _read_declined_hops(self) -> None:
        """Each declined hop that wrote output, as a charge of its own at its model."""
        for index, (model, entry) in enumerate(declined_hops(self._usage)):
            try:
                usage = usage_from(entry)
            except InvalidUsage as exc:
                self.problem(f"invalid_usage: iterations[{index}]: {exc}")
                continue
            self.charges.append(TapResult.from_usage(model, usage, "reported"))

    def final_usage(self, cut: str | None) -> Usage | None:
        self.set_service_tier(self._usage.get("service_tier"))
        self._read_declined_hops()
        usage = self.reported
        if usage is None:
            return None
        if self._body:
            return usage
        self.partial = usage
        return usage if self._stopped and self._delta_usage else None

    def incomplete_reason(self) -> str:
        if self._body:
            return "no_usage: the body carries no usage"
        if not self._started:
            return "no_usage: the stream has no message_start"
        if not self._stopped:
            return "stream_incomplete: the stream ended before message_stop"
        return "no_usage: the stream has no message_delta usage"

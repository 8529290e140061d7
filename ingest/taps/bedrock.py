"""Amazon Bedrock Converse (``/model/{id}/converse`` and ``/converse-stream``).

Streamed: AWS event-stream binary messages (``eventstream.py`` checks both
CRCs). ``:message-type`` ``event`` messages are named by ``:event-type``:
``messageStart``, ``contentBlockStart``, ``contentBlockDelta`` (text,
``toolUse.input``, ``reasoningContent.text``), ``contentBlockStop``,
``messageStop``, then ``metadata`` whose JSON payload holds ``usage``.
``exception`` messages (``:exception-type``, e.g. ``throttlingException``,
``modelStreamErrorException``) and ``error`` messages can arrive after the 200:
they become ``upstream_error``; without a ``metadata`` usage the response is
estimated. Only ``metadata``, errors and (for the estimate) deltas are parsed.

Not streamed: one JSON object with ``usage`` (no model: it is in the URL, so
the proxy passes it as the model hint).

Every ``usage`` is a report (a ``metadata`` event, the body): the call is charged
the field-wise maximum of them (``Handler.report``), so a second ``metadata`` event
with zero counts, or a ``usage`` (or a count in it) given twice, lowers nothing.

``inputTokens`` excludes ``cacheReadInputTokens`` and ``cacheWriteInputTokens``
(``totalTokens`` adds all four); ``cacheDetails`` lists cache writes per TTL
(``5m`` / ``1h``): the ``1h`` entries are the 1-hour part. Reasoning is inside
``outputTokens`` and not reported apart.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from .base import (
    Handler,
    describe_error,
    read_shape,
    shape_decoder,
    text_len,
)
from .estimate import EstimatorConfig
from .eventstream import message_kind
from .fastjson import loads
from .request import RequestInfo
from .shapes import BedrockTextDelta
from .usage import InvalidUsage, Usage, tok

_read_text_delta = shape_decoder(BedrockTextDelta)
_delta_text = attrgetter("delta.text")
#: The headers of a text delta message, the common one (read in runs by on_frames).
_DELTA_HEADERS = {":event-type": "contentBlockDelta", ":message-type": "event"}
#: the keys a ``metadata`` event (or a body) carrying usage gives at most once
REPEAT_KEYS = (
    b'"usage"',
    b'"inputTokens"',
    b'"outputTokens"',
    b'"cacheReadInputTokens"',
    b'"cacheWriteInputTokens"',
    b'"cacheDetails"',
)


def usage_from(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        raise InvalidUsage("usage is not an object")
    cache_write = tok(raw, "cacheWriteInputTokens")
    details = raw.get("cacheDetails")
    write_1h = detailed = 0
    if details is not None:
        if not isinstance(details, list):
            raise InvalidUsage("cacheDetails is not a list")
        for detail in details:
            tokens = tok(detail, "inputTokens", required=True)
            detailed += tokens
            if detail.get("ttl") == "1h":
                write_1h += tokens
    return Usage(
        input_tokens=tok(raw, "inputTokens", required=True),
        cache_read_tokens=tok(raw, "cacheReadInputTokens"),
        cache_write_tokens=max(cache_write, detailed),
        cache_write_1h_tokens=write_1h,
        output_tokens=tok(raw, "outputTokens", required=True),
    )


def stream_error(kind: str, name: str, headers: dict[str, Any], payload: bytes) -> str:
    """What an ``exception`` (payload ``message``) or ``error`` (``:error-message``)
    message after the 200 says, e.g. ``throttlingException: Too many requests``."""
    message = None
    if kind == "error":
        message = headers.get(":error-message")
    elif payload:
        obj, _ = loads(payload)
        message = describe_error(obj)
    return f"{name or kind}: {message}" if message else name or kind


class BedrockHandler(Handler):
    fmt = "bedrock-converse"
    body_paths = frozenset({("usage",), ("message",), ("Message",)})
    repeat_keys = REPEAT_KEYS

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)
        self._usage: Any = None
        self._metadata = False
        self._stopped = False
        self._body = False

    def usage_from(self, raw: Any) -> Usage:
        return usage_from(raw)

    # -- streamed ------------------------------------------------------------
    def on_frame(self, headers: dict[str, Any], payload: bytes) -> None:
        kind, name = message_kind(headers)
        if kind == "event":
            if name == "contentBlockDelta":
                self.delta_events += 1
                if not self.parse_deltas:
                    self.text_chars += len(payload)
                    return
                event = read_shape(_read_text_delta, payload)
                if event is not None:
                    self.text_chars += len(event.delta.text or "")
                    return
                obj = self.parse(payload)
                delta = obj.get("delta") if isinstance(obj, dict) else None
                if isinstance(delta, dict):
                    self._delta(delta)
            elif name == "metadata":
                for obj in self.parse_each(payload, REPEAT_KEYS):
                    if isinstance(obj, dict):
                        self._metadata = True
                        usage = obj.get("usage")
                        if usage is not None:
                            self._usage = usage
                            self.report(usage)
            elif name == "messageStop":
                self._stopped = True
        elif kind in ("exception", "error"):
            self.error(stream_error(kind, name, headers, payload))

    def on_frames(self, frames: list[tuple[dict[str, Any], bytes]]) -> None:
        """Several messages in stream order: runs of contentBlockDelta read at once, the
        rest one by one, as ``on_frame`` reads each."""
        run: list[bytes] = []
        delta_headers: Any = None
        for headers, payload in frames:
            if headers is delta_headers or (
                headers.get(":event-type") == "contentBlockDelta"
                and message_kind(headers)[0] == "event"
            ):
                delta_headers = headers  # the decoder shares one dict per header set
                run.append(payload)
                continue
            if run:
                self._deltas(run)
                run = []
            self.on_frame(headers, payload)
        if run:
            self._deltas(run)

    def _deltas(self, run: list[bytes]) -> None:
        self.read_delta_run(run, _read_text_delta, self._text_deltas, self._other_delta)

    def _text_deltas(self, events: list[BedrockTextDelta], payloads: list[bytes]) -> None:
        self.delta_events += len(events)
        self.text_chars += sum(map(len, filter(None, map(_delta_text, events))))

    def _other_delta(self, payload: bytes) -> None:
        self.on_frame(_DELTA_HEADERS, payload)

    def _delta(self, delta: dict[str, Any]) -> None:
        chars = text_len(delta.get("text"))
        tool = delta.get("toolUse")
        if isinstance(tool, dict):
            chars += text_len(tool.get("input"))
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            thought = text_len(reasoning.get("text"))
            self.reasoning_chars += thought
            chars += thought
        self.text_chars += chars

    # -- not streamed --------------------------------------------------------
    def on_body(self, obj: Any, size: int) -> None:
        self._body = True
        if not isinstance(obj, dict):
            self.problem("unreadable: the body is not a JSON object")
            return
        if "usage" not in obj:
            self.error(describe_error(obj))
        usage = obj.get("usage")
        if usage is not None:
            self._usage = usage
            self.report(usage)

    # -- end -----------------------------------------------------------------
    def final_usage(self, cut: str | None) -> Usage | None:
        return self.reported

    def incomplete_reason(self) -> str:
        if self._body:
            return "no_usage: the body carries no usage"
        if self._metadata:
            return "no_usage: the metadata event carries no usage"
        if self._stopped:
            return "no_usage: the stream ended after messageStop without metadata"
        return "stream_incomplete: the stream ended before the metadata event"

"""Anthropic Messages on Amazon Bedrock (``/model/{id}/invoke`` and
``/invoke-with-response-stream``).

The request and the response are Anthropic's Messages body (with
``anthropic_version: bedrock-2023-05-31``, no ``model``: it is in the URL).

Streamed (``invoke-with-response-stream``): AWS event-stream messages
(``eventstream.py``, both CRCs checked). Each ``:event-type: chunk`` event's JSON
payload is ``{"bytes": "<base64>"}`` and the bytes are one Anthropic stream event
(``message_start``, ``content_block_delta``, ``message_delta``, ``message_stop``...),
read exactly as ``anthropic.py`` reads it from SSE. Bedrock adds
``amazon-bedrock-invocationMetrics`` to ``message_stop``; the Anthropic usage of
``message_start`` / ``message_delta`` is what is charged (it has the cache
fields the metrics lack). ``exception`` messages after the 200
(``modelStreamErrorException``, ``throttlingException``...) become
``upstream_error``, as for Converse.

Not streamed (``invoke``): the Anthropic message body, read as ``anthropic.py``
reads it.

The model charged is the URL's, never the body's ``model``: on Bedrock the price
depends on the endpoint (a regional ``anthropic.``/``us.`` id costs more than
``global.``), which only the URL's id says.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .anthropic import AnthropicHandler, may_repeat_event
from .base import describe_error
from .bedrock import stream_error
from .estimate import EstimatorConfig
from .eventstream import message_kind
from .fastjson import loads
from .request import RequestInfo

#: the keys a ``chunk`` message's payload gives at most once
_CHUNK_KEYS = (b'"bytes"',)


class BedrockInvokeHandler(AnthropicHandler):
    fmt = "bedrock-invoke"
    body_paths = AnthropicHandler.body_paths | {("message",), ("Message",)}

    def __init__(self, request: RequestInfo, config: EstimatorConfig) -> None:
        super().__init__(request, config)

    def set_model(self, value: Any) -> None:
        """The body's model is not the priced id: the URL's (the tap's model hint) is."""

    def on_body(self, obj: Any, size: int) -> None:
        super().on_body(obj, size)
        if isinstance(obj, dict) and "usage" not in obj and self.upstream_error is None:
            self.error(describe_error(obj))  # Bedrock's own errors: {"message": ...}

    def on_frame(self, headers: dict[str, Any], payload: bytes) -> None:
        kind, name = message_kind(headers)
        if kind in ("exception", "error"):
            self.error(stream_error(kind, name, headers, payload))
            return
        if kind != "event" or name != "chunk":
            return
        counted = False
        for event in self._chunk_events(payload):  # one, or each reading of its repeats
            event_type = event.get("type")
            if event_type == "content_block_delta":
                if counted:
                    continue
                counted = True
                self.delta_events += 1
                if not self.parse_deltas:
                    self.text_chars += len(payload)
                    continue
            elif event_type in ("ping", "content_block_stop"):
                continue
            self._on(event_type, event)

    def _chunk_events(self, payload: bytes) -> list[dict[str, Any]]:
        """The Anthropic event a ``chunk`` carries (what cannot be read is recorded as
        unreadable); one per reading of repeated keys, of the chunk (``bytes`` given
        twice) or of its event."""
        events: list[dict[str, Any]] = []
        for outer in self.parse_each(payload, _CHUNK_KEYS):
            if not isinstance(outer, dict):
                if outer is not None:
                    self.problem("unreadable: a chunk payload is not a JSON object")
                continue
            encoded = outer.get("bytes")
            if not isinstance(encoded, str):
                self.problem("unreadable: a chunk carries no base64 bytes")
                continue
            try:
                inner = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                self.problem("unreadable: a chunk's bytes are not base64")
                continue
            event, problem = loads(inner)
            if problem is not None:
                self.problem(problem)
                continue
            found = self.each_reading(inner, event) if may_repeat_event(inner, False) else [event]
            for reading in found:
                if isinstance(reading, dict):
                    events.append(reading)
                else:
                    self.problem("unreadable: a chunk's event is not a JSON object")
        return events

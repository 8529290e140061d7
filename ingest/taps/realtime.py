"""OpenAI Realtime API sessions (WebSocket), one usage per response.

The proxy feeds each text message the server sends (``feed_message``) and,
optionally, each one the client sends (``feed_client_message``, only counted,
for the input estimate). Server events read:

- ``session.created`` / ``session.updated``: ``session.model`` and
  ``session.max_response_output_tokens`` / ``max_output_tokens`` (the cap of
  an estimate);
- ``response.created``: a response starts (``response.id``);
- ``*.delta`` events with a ``response_id``: text, transcript and function
  argument deltas count for the estimate (audio deltas count one each);
- ``response.done``: ``response.usage`` (``input_tokens`` includes
  ``input_token_details.cached_tokens``; cancelled and failed responses carry
  usage too) gives one result; without usage the response is estimated.

A response still open when the session ends is estimated (``finish``). The
conversation is server-side state, so estimated input is at least the floor.
A ``response.done`` that gives a key of its usage (or the usage, or the response)
twice is read every way (repeats.py) and charged the field-wise maximum. The model
priced is the URL's; the session's is taken only when it is that model or a dated
snapshot of it (``usage.priced_model``).
Messages larger than the whole-parse limit are scanned for the paths above.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

from .base import WHOLE_PARSE_LIMIT, Path, clip, describe_error, may_repeat, text_len
from .estimate import EstimatorConfig, Observed, estimate_usage
from .fastjson import loads
from .jsonscan import JsonPathScanner
from .repeats import TooManyReadings, has_repeats, loads_keeping_repeats, readings
from .request import RequestInfo
from .usage import (
    InvalidUsage,
    TapResult,
    Usage,
    modality_units,
    priced_model,
    sub,
    tok,
    usage_max,
)

_TEXT_DELTAS = frozenset(
    {
        "response.text.delta",
        "response.output_text.delta",
        "response.audio_transcript.delta",
        "response.output_audio_transcript.delta",
        "response.function_call_arguments.delta",
    }
)
_LARGE_PATHS: frozenset[Path] = frozenset(
    {
        ("type",),
        ("response_id",),
        ("response", "id"),
        ("response", "usage"),
        ("response", "status"),
        ("response", "status_details"),
        ("session", "model"),
    }
)
_PIECE = 64 * 1024
#: stands for a message read in more ways than ``repeats.MAX_READINGS``
_TOO_MANY: Any = object()
#: the keys a ``response.done`` gives at most once (its usage's: a response given twice
#: gives "usage" twice, or an escape)
_REPEAT_KEYS = (
    b'"usage"',
    b'"input_tokens"',
    b'"output_tokens"',
    b'"input_token_details"',
    b'"output_token_details"',
    b'"cached_tokens"',
)


def usage_from(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        raise InvalidUsage("usage is not an object")
    total_in = tok(raw, "input_tokens", required=True)
    cached = tok(raw.get("input_token_details"), "cached_tokens")
    return Usage(
        input_tokens=sub(total_in, cached, "input_tokens", "cached_tokens"),
        cache_read_tokens=cached,
        output_tokens=tok(raw, "output_tokens", required=True),
    )


class _Response:
    __slots__ = ("chars", "deltas")

    def __init__(self) -> None:
        self.deltas = 0
        self.chars = 0


class RealtimeTap:
    """Meters one Realtime WebSocket session. Methods never raise."""

    def __init__(
        self,
        *,
        model: str | None = None,
        estimator: EstimatorConfig | None = None,
        max_in_flight: int = 64,
    ) -> None:
        self.config = estimator or EstimatorConfig()
        self.model_hint = model
        self.max_in_flight = max_in_flight
        self.session_model: str | None = None
        self.max_output_tokens: int | None = None
        self.upstream_error: str | None = None
        self._open: OrderedDict[str, _Response] = OrderedDict()
        self._client_bytes = 0
        self._finished = False

    # -- public --------------------------------------------------------------
    def feed_client_message(self, message: str | bytes) -> None:
        """A message the client sent (counted toward the input estimate)."""
        with contextlib.suppress(Exception):
            self._client_bytes += len(message.encode() if isinstance(message, str) else message)

    def feed_message(self, message: str | bytes) -> list[TapResult]:
        """A message the server sent; returns one result per ``response.done``."""
        if self._finished:
            return []
        try:
            return self._message(message)
        except Exception as exc:
            return [self._fallback(f"unreadable: tap internal error ({type(exc).__name__})")]

    def finish(self, *, cut: str | None = None) -> list[TapResult]:
        """The session ended: responses still open are estimated."""
        if self._finished:
            return []
        self._finished = True
        reason = cut or "stream_incomplete: the session ended before response.done"
        try:
            results = [self._estimate(state, reason) for state in self._open.values()]
        except Exception as exc:  # pragma: no cover - defensive
            results = [self._fallback(f"unreadable: tap internal error ({type(exc).__name__})")]
        self._open.clear()
        return results

    # -- reading -------------------------------------------------------------
    def _message(self, message: str | bytes) -> list[TapResult]:
        size = len(message)
        if size > WHOLE_PARSE_LIMIT:
            obj = self._scan(message)
            large = True
        else:
            obj, problem = loads(message)
            if problem is not None:
                return []  # an unreadable event names no response: nothing to charge
            large = False
        if not isinstance(obj, dict):
            return []
        kind = obj.get("type")
        if not isinstance(kind, str):
            return []
        if kind.endswith(".delta"):
            state = self._state(obj.get("response_id"))
            results = self._evicted()
            state.deltas += 1
            if kind in _TEXT_DELTAS:
                state.chars += size if large else text_len(obj.get("delta"))
            return results
        if kind == "response.created":
            response = obj.get("response")
            if isinstance(response, dict):
                self._state(response.get("id"))
            return self._evicted()
        if kind == "response.done":
            response = obj.get("response")
            others = [] if large else self._other_usages(message)
            return [self._done(response if isinstance(response, dict) else {}, others)]
        if kind in ("session.created", "session.updated"):
            self._session(obj.get("session"))
        elif kind == "error":
            self.upstream_error = describe_error(obj) or "error event"
        return []

    def _scan(self, message: str | bytes) -> Any:
        scanner = JsonPathScanner(_LARGE_PATHS)
        for start in range(0, len(message), _PIECE):
            piece = message[start : start + _PIECE]
            scanner.feed(piece.encode() if isinstance(piece, str) else piece)
        return scanner.sparse() if scanner.finish() is None else None

    def _session(self, session: Any) -> None:
        if not isinstance(session, dict):
            return
        model = session.get("model")
        if isinstance(model, str) and model:
            self.session_model = model[:200]
        for key in ("max_response_output_tokens", "max_output_tokens"):
            value = session.get(key)
            if type(value) is int and value > 0:
                self.max_output_tokens = value
            elif value == "inf":
                self.max_output_tokens = None

    def _state(self, response_id: Any) -> _Response:
        key = response_id if isinstance(response_id, str) else ""
        state = self._open.get(key)
        if state is None:
            state = self._open[key] = _Response()
        return state

    def _evicted(self) -> list[TapResult]:
        results = []
        while len(self._open) > self.max_in_flight:
            _, state = self._open.popitem(last=False)
            results.append(self._estimate(state, "unreadable: too many responses in flight"))
        return results

    def _done(self, response: dict[str, Any], others: list[Any]) -> TapResult:
        """One ``response.done``; ``others``: the usage of its other readings (repeats)."""
        response_id = response.get("id")
        state = self._open.pop(response_id if isinstance(response_id, str) else "", None)
        state = state or _Response()
        status = response.get("status")
        details = response.get("status_details")
        error = describe_error(details) if isinstance(details, dict) else None
        raw = response.get("usage")
        if raw is None and others:
            raw = others[-1]  # a reading that has one: the usage to charge
        if raw is not None:
            if others and others[0] is _TOO_MANY:
                reason = "invalid_usage: the message repeats keys in more ways than are read"
                return self._estimate(state, reason, error)
            try:
                usage = usage_from(raw)
                for other in others:  # the field-wise maximum of every reading's
                    usage = usage_max(usage, usage_from(other))
            except InvalidUsage as exc:
                return self._estimate(state, f"invalid_usage: {exc}", error)
            return TapResult.from_usage(
                self._model(),
                usage,
                "reported",
                upstream_error=error,
                units={
                    k: n for k, n in modality_units(raw, "input_token", "output_token").items() if n
                },
            )
        return self._estimate(
            state, f"no_usage: response.done ({clip(str(status), 40)}) carries no usage", error
        )

    def _other_usages(self, message: str | bytes) -> list[Any]:
        """The usage of every reading of a ``response.done`` that repeats keys
        (repeats.py): ``[]`` when it repeats none; too many readings is ``TOO_MANY``."""
        data = message.encode() if isinstance(message, str) else message
        if not may_repeat(data, _REPEAT_KEYS):
            return []
        full, problem = loads_keeping_repeats(data)
        if problem is not None or not has_repeats(full):
            return []
        try:
            found = readings(full)
        except (TooManyReadings, RecursionError):
            return [_TOO_MANY]
        usages = []
        for reading in found:
            response = reading.get("response") if isinstance(reading, dict) else None
            if isinstance(response, dict) and response.get("usage") is not None:
                usages.append(response["usage"])
        return usages

    # -- results -------------------------------------------------------------
    def _model(self) -> str | None:
        return priced_model(self.model_hint, self.session_model, None)[0]

    def _request(self) -> RequestInfo:
        size, self._client_bytes = self._client_bytes, 0
        return RequestInfo(
            size=size,
            max_output_tokens=self.max_output_tokens,
            server_state=("realtime conversation",),
        )

    def _estimate(self, state: _Response, reason: str, error: str | None = None) -> TapResult:
        seen = Observed(streaming=True, delta_events=state.deltas, text_chars=state.chars)
        usage = estimate_usage(self._request(), seen, self.config)
        return TapResult.from_usage(
            self._model(),
            usage,
            "estimated",
            reason=reason,
            upstream_error=error or self.upstream_error,
        )

    def _fallback(self, reason: str) -> TapResult:
        usage = Usage(
            input_tokens=self.config.server_state_input_floor,
            output_tokens=self.max_output_tokens or self.config.output_cap,
        )
        return TapResult.from_usage(self._model(), usage, "estimated", reason=reason)


def open_realtime_tap(
    *, model: str | None = None, estimator: EstimatorConfig | None = None
) -> RealtimeTap:
    """A tap for one Realtime WebSocket session (``model``: from the URL)."""
    return RealtimeTap(model=model, estimator=estimator)

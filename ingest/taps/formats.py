"""The formats a tap reads, and opening a tap for one (compiled: once a response)."""

from __future__ import annotations

from typing import Any

from .anthropic import AnthropicHandler
from .base import Handler
from .bedrock import BedrockHandler
from .bedrock_invoke import BedrockInvokeHandler
from .estimate import EstimatorConfig
from .gemini import GeminiHandler
from .openai_chat import OpenAIChatHandler
from .openai_responses import OpenAIResponsesHandler
from .request import RequestInfo, read_request
from .tap import Tap, resolve_mode

_HANDLERS: dict[str, type[Handler]] = {
    handler.fmt: handler
    for handler in (
        AnthropicHandler,
        OpenAIChatHandler,
        OpenAIResponsesHandler,
        GeminiHandler,
        BedrockHandler,
        BedrockInvokeHandler,
    )
}

#: The response formats a tap reads.
FORMATS: tuple[str, ...] = tuple(_HANDLERS)

_DEFAULT_ESTIMATOR = EstimatorConfig()


def open_tap(
    fmt: str,
    request: bytes | bytearray | str | dict[str, Any] | RequestInfo | None,
    *,
    streaming: bool | None = None,
    content_encoding: str | None = None,
    content_type: str | None = None,
    status: int | None = None,
    model: str | None = None,
    estimator: EstimatorConfig = _DEFAULT_ESTIMATOR,
) -> Tap:
    """A tap for one upstream response of format ``fmt`` (one of ``FORMATS``).

    ``request`` is the request body sent upstream (bytes, text or parsed), or
    what :func:`read_request` already read from it (a proxy that reads the
    request before forwarding it passes that, so the body is parsed once).
    ``streaming`` None detects it: from ``content_type``, else the request's
    ``stream`` flag, else the first bytes. ``content_encoding`` is the
    response's Content-Encoding header. ``status`` is the upstream HTTP status
    (None: 2xx). ``model`` is the model when the body does not name it (Gemini
    and Bedrock put it in the URL). Raises ValueError on an unknown ``fmt``
    (a programming error, found before any response flows); never afterwards.
    """
    handler_type = _HANDLERS.get(fmt)
    if handler_type is None:
        raise ValueError(f"unknown tap format {fmt!r}; expected one of {', '.join(FORMATS)}")
    info = request if isinstance(request, RequestInfo) else read_request(fmt, request)
    mode = resolve_mode(
        fmt,
        streaming=streaming,
        content_type=content_type,
        request_stream=info.stream,
        status=status,
    )
    return Tap(
        handler_type(info, estimator),
        mode=mode,
        request=info,
        config=estimator,
        content_encoding=content_encoding,
        status=status,
        model_hint=model,
    )

"""The formats a tap reads, and opening a tap for one (compiled: once a response)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.billed_units import GEMINI_SERVICE_TIER_HEADER

from .anthropic import AnthropicHandler
from .base import Handler
from .bedrock import BedrockHandler
from .bedrock_invoke import BedrockInvokeHandler
from .estimate import EstimatorConfig
from .gemini import GeminiHandler
from .openai_chat import OpenAIChatHandler
from .openai_responses import OpenAIResponsesHandler
from .request import RequestInfo, gemini_tier, read_request
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
    response_headers: Mapping[str, str] | None = None,
) -> Tap:
    """A tap for one upstream response of format ``fmt`` (one of ``FORMATS``).

    ``request`` is the request body sent upstream (bytes, text or parsed), or
    what :func:`read_request` already read from it (a proxy that reads the
    request before forwarding it passes that, so the body is parsed once).
    ``streaming`` None detects it: from ``content_type``, else the request's
    ``stream`` flag, else the first bytes. ``content_encoding`` is the
    response's Content-Encoding header. ``status`` is the upstream HTTP status
    (None: 2xx). ``model`` is the model when the body does not name it (Gemini
    and Bedrock put it in the URL). ``response_headers`` (case-insensitive, as the
    proxy's client gives them, or lower-case keys) are read for the tier that served
    the call where the provider names it in a header (Gemini: :data:`GEMINI_SERVICE_TIER_HEADER`);
    a discounted one is charged only if the request asked for it, as any tier. Raises
    ValueError on an unknown ``fmt`` (a programming error, found before any response
    flows); never afterwards.
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
    handler = handler_type(info, estimator)
    if fmt == "gemini" and response_headers is not None:
        handler.set_service_tier(gemini_tier(response_headers.get(GEMINI_SERVICE_TIER_HEADER)))
    return Tap(
        handler,
        mode=mode,
        request=info,
        config=estimator,
        content_encoding=content_encoding,
        status=status,
        model_hint=model,
    )

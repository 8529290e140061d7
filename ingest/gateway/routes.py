"""Which provider API a request path is, and what the path itself says.

==================================================  =========  ====================  =======
path (POST unless said)                             family     tap format            metered
==================================================  =========  ====================  =======
``/v1/chat/completions``                            openai     openai-chat           yes
``/v1/responses``                                   openai     openai-responses      yes
``GET /v1/realtime`` (WebSocket)                    openai     realtime tap          yes
``/v1/messages``                                    anthropic  anthropic-messages    yes
``/v1/messages/count_tokens``                       anthropic  -                     never
``/v1beta/models/{model}:generateContent``          gemini     gemini                yes
``/v1beta/models/{model}:streamGenerateContent``    gemini     gemini (streamed)     yes
``/v1beta/models/{model}:countTokens``              gemini     -                     never
``/model/{modelId}/converse``                       bedrock    bedrock-converse      yes
``/model/{modelId}/converse-stream``                bedrock    bedrock-converse      yes
``/model/{modelId}/invoke``                         bedrock    bedrock-invoke        yes
``/model/{modelId}/invoke-with-response-stream``    bedrock    bedrock-invoke        yes
==================================================  =========  ====================  =======

Gemini paths are also served under ``/v1/models/``. Bedrock ``invoke`` paths carry
Anthropic Messages bodies (Claude on Bedrock; other vendors' InvokeModel bodies are
not read). Token counting costs
nothing at the providers, so it is neither checked nor charged: it is
forwarded with the principal's credential and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from .families import Api

#: The ``api`` written on events of a Realtime session.
REALTIME_API = "openai-realtime"


@dataclass(frozen=True, slots=True)
class Route:
    """One routed request: its API family, tap format, and what the URL fixes."""

    family: Api
    #: the tap format (ingest.taps.FORMATS); None for a pass-through that is never metered
    fmt: str | None
    #: the model named by the URL (Gemini, Bedrock), else None (the body names it)
    model: str | None = None
    #: True/False when the URL decides streaming, None when the body does
    streaming: bool | None = None

    @property
    def metered(self) -> bool:
        return self.fmt is not None


_FIXED: dict[str, Route] = {
    "/v1/chat/completions": Route("openai", "openai-chat"),
    "/v1/responses": Route("openai", "openai-responses"),
    "/v1/messages": Route("anthropic", "anthropic-messages"),
    "/v1/messages/count_tokens": Route("anthropic", None),
}
_GEMINI_ACTIONS = {
    "generateContent": False,
    "streamGenerateContent": True,
}


def resolve(path: str) -> Route | None:
    """The route of a POST path, or None when the gateway does not serve it."""
    fixed = _FIXED.get(path)
    if fixed is not None:
        return fixed
    for prefix in ("/v1beta/models/", "/v1/models/"):
        if path.startswith(prefix):
            model, _, action = path[len(prefix) :].rpartition(":")
            if not model or "/" in model:
                return None
            if action == "countTokens":
                return Route("gemini", None, model=model)
            if action in _GEMINI_ACTIONS:
                return Route("gemini", "gemini", model=model, streaming=_GEMINI_ACTIONS[action])
            return None
    if path.startswith("/model/"):
        model_id, _, action = path[len("/model/") :].rpartition("/")
        if not model_id or "/" in model_id:
            return None
        if action == "converse":
            return Route("bedrock", "bedrock-converse", model=unquote(model_id), streaming=False)
        if action == "converse-stream":
            return Route("bedrock", "bedrock-converse", model=unquote(model_id), streaming=True)
        if action == "invoke":
            return Route("bedrock", "bedrock-invoke", model=unquote(model_id), streaming=False)
        if action == "invoke-with-response-stream":
            return Route("bedrock", "bedrock-invoke", model=unquote(model_id), streaming=True)
    return None

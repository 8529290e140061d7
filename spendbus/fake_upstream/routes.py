"""The providers' paths the fake serves (as named in ``/stats``), the format each
speaks, and :class:`Call`: one request as routed."""

from __future__ import annotations

from dataclasses import dataclass

ANTHROPIC = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
#: a background response fetched (never billed; not in ROUTES: no request format)
RESPONSES_RETRIEVE = "/v1/responses/{id}"
GEMINI = "/v1beta/models/{model}:generateContent"
GEMINI_STREAM = "/v1beta/models/{model}:streamGenerateContent"
CONVERSE = "/model/{modelId}/converse"
COUNT_TOKENS = "/v1/messages/count_tokens"
CONVERSE_STREAM = "/model/{modelId}/converse-stream"
INVOKE = "/model/{modelId}/invoke"
INVOKE_STREAM = "/model/{modelId}/invoke-with-response-stream"
#: OpenAI Realtime over WebSocket (realtime.py; not in ROUTES: no HTTP body format)
REALTIME = "/v1/realtime"

#: The route (as named in /stats) -> the provider format it serves.
ROUTES: dict[str, str] = {
    ANTHROPIC: "anthropic-messages",
    CHAT: "openai-chat",
    RESPONSES: "openai-responses",
    GEMINI: "gemini",
    GEMINI_STREAM: "gemini",
    CONVERSE: "bedrock-converse",
    CONVERSE_STREAM: "bedrock-converse",
    INVOKE: "bedrock-invoke",
    INVOKE_STREAM: "bedrock-invoke",
}


@dataclass(frozen=True)
class Call:
    """One request as routed: which format, model and framing it asks for."""

    route: str
    fmt: str
    model: str | None
    stream: bool | None  # None: the body's "stream" flag says
    gemini_sse: bool = True

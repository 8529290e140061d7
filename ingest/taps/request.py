"""What a request tells the estimate: its size, limits, reasoning, server state.

Requests are read structurally (dict keys and JSON paths, never substrings of
text), so what a user writes in a message cannot change an estimate. The
request is already in the proxy's memory; it is parsed once per response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .fastjson import json_loads
from .references import references

#: Containers visited when looking for server-side state in a request; a larger
#: request is assumed to name server-side state (pessimistic).
WALK_BUDGET = 200_000

#: candidates counted at most (OpenAI allows n up to 128; a larger n is refused upstream,
#: and the product with an output cap stays within the token bounds)
MAX_CANDIDATES = 128

#: ``json.dumps(obj, separators=(",", ":"), default=str)`` without making an encoder per call
_compact_json = json.JSONEncoder(separators=(",", ":"), default=str).encode


@dataclass(frozen=True, slots=True, init=False)
class RequestInfo:
    """The parts of a request an estimate needs.

    ``size`` is the request body in bytes (None: no request was given);
    ``readable`` is False when the body was not a JSON object. ``server_state``
    names what in the request refers to state kept by the provider (empty when
    none), each as a short phrase for analysts. ``candidates`` is how many
    completions one call generates (OpenAI Chat ``n``, Gemini
    ``generationConfig.candidateCount``; 1 otherwise): every output cap is per
    candidate. ``background`` is a Responses request run in background mode (its
    answer is a ``queued`` response without usage; the result is fetched later).
    ``stream_usage`` is False for a streamed OpenAI Chat request that does not ask for
    usage (``stream_options.include_usage``): the gateway may ask for it upstream
    (None when the question does not arise). ``containers`` are the
    code-interpreter containers the request names by id (made earlier through the
    Containers API). ``unit_caps`` are the billed units the request can be charged at
    most, known before it is sent (a server tool's ``max_uses``; a grounded prompt):
    the enforcer's worst case adds them. ``fallbacks`` is an Anthropic request that
    allows server-side fallback to another model (its ``fallbacks``): only then is an
    answer relabelled to the model that served priced as that model. ``service_tier`` is
    the tier the request asks for (OpenAI's and Anthropic's ``service_tier``, Gemini's
    ``service_tier`` / ``serviceTier`` as :func:`gemini_tier` reads it): only then is an
    answer naming a discounted tier (flex, batch) charged at that tier.
    """

    size: int | None
    readable: bool
    model: str | None
    stream: bool | None
    max_output_tokens: int | None
    reasoning: bool
    thinking_budget: int | None
    server_state: tuple[str, ...]
    containers: tuple[str, ...]
    unit_caps: tuple[tuple[str, int], ...]
    candidates: int
    background: bool
    stream_usage: bool | None
    fallbacks: bool
    service_tier: str | None

    def __init__(  # one a response: compiled, not dataclass's (see usage.Usage)
        self,
        size: int | None = None,
        readable: bool = True,
        model: str | None = None,
        stream: bool | None = None,
        max_output_tokens: int | None = None,
        reasoning: bool = False,
        thinking_budget: int | None = None,
        server_state: tuple[str, ...] = (),
        containers: tuple[str, ...] = (),
        unit_caps: tuple[tuple[str, int], ...] = (),
        candidates: int = 1,
        background: bool = False,
        stream_usage: bool | None = None,
        fallbacks: bool = False,
        service_tier: str | None = None,
    ) -> None:
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "readable", readable)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "max_output_tokens", max_output_tokens)
        object.__setattr__(self, "reasoning", reasoning)
        object.__setattr__(self, "thinking_budget", thinking_budget)
        object.__setattr__(self, "server_state", server_state)
        object.__setattr__(self, "containers", containers)
        object.__setattr__(self, "unit_caps", unit_caps)
        object.__setattr__(self, "candidates", candidates)
        object.__setattr__(self, "background", background)
        object.__setattr__(self, "stream_usage", stream_usage)
        object.__setattr__(self, "fallbacks", fallbacks)
        object.__setattr__(self, "service_tier", service_tier)


def read_request(fmt: str, request: bytes | bytearray | str | dict[str, Any] | None) -> RequestInfo:
    """Read a request body (bytes, text or an already-parsed dict) of ``fmt``."""
    if request is None:
        return RequestInfo()
    if isinstance(request, dict):
        obj: Any = request
        size = len(_compact_json(request).encode())
    else:
        raw = request.encode() if isinstance(request, str) else bytes(request)
        size = len(raw)
        try:
            obj = json_loads(raw)
        except (ValueError, RecursionError):
            return RequestInfo(size=size, readable=False)
    if not isinstance(obj, dict):
        return RequestInfo(size=size, readable=False)
    reader = _READERS.get(fmt)
    fields: dict[str, Any] = reader(obj) if reader is not None else {}
    found: list[str] = list(fields.get("server_state", ()))
    found.extend(references(obj, WALK_BUDGET))
    # by position, not **fields: a compiled call instead of parsing keywords (~6k
    # instructions); test_taps_request holds the readers' keys to RequestInfo's fields
    return RequestInfo(
        size,
        True,
        fields.get("model"),
        fields.get("stream"),
        fields.get("max_output_tokens"),
        fields.get("reasoning", False),
        fields.get("thinking_budget"),
        tuple(dict.fromkeys(found)),
        tuple(fields.get("containers", ())),
        tuple(sorted(fields.get("unit_caps", {}).items())),
        min(fields.get("candidates") or 1, MAX_CANDIDATES),
        fields.get("background", False),
        fields.get("stream_usage"),
        fields.get("fallbacks", False),
        fields.get("service_tier"),
    )


def _pos_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _tools(tools: Any) -> Iterator[dict[str, Any]]:
    """The tools of a request that are objects with a string ``type``."""
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("type"), str):
                yield tool


def _tool_types(tools: Any) -> Iterator[str]:
    for tool in _tools(tools):
        yield tool["type"]


def _anthropic(obj: dict[str, Any]) -> dict[str, Any]:
    state: list[str] = []
    reasoning, budget = False, None
    thinking = obj.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        reasoning, budget = True, _pos_int(thinking.get("budget_tokens"))
    caps: dict[str, int] = {}
    for tool in _tools(obj.get("tools")):
        kind = tool["type"]
        if kind.startswith(("web_search", "web_fetch", "code_execution", "tool_search", "mcp")):
            state.append(f"server tool {kind}")
        uses = _pos_int(tool.get("max_uses"))
        for unit in ("web_search", "web_fetch"):
            if kind.startswith(unit + "_") and uses is not None:
                caps[unit] = caps.get(unit, 0) + uses
    if obj.get("mcp_servers"):
        state.append("MCP servers")
    if obj.get("container"):
        state.append("code execution container")
    return {
        "model": _str(obj.get("model")),
        "stream": _bool(obj.get("stream")),
        "max_output_tokens": _pos_int(obj.get("max_tokens")),
        "reasoning": reasoning,
        "thinking_budget": budget,
        "server_state": state,
        "unit_caps": caps,
        "fallbacks": bool(obj.get("fallbacks")),
        "service_tier": _str(obj.get("service_tier")),
    }


def openai_reasoning_model(model: str | None) -> bool:
    """An OpenAI model that reasons by default (o1, o3, o4-mini..., gpt-5 and later but
    their ``-chat`` snapshots), after any ``provider/`` prefix of a router."""
    if not model:
        return False
    name = model.rsplit("/", 1)[-1].lower()
    if len(name) > 1 and name[0] == "o" and name[1].isdigit():
        return True
    if name.startswith("gpt-") and len(name) > 4 and "5" <= name[4] <= "9":
        return "-chat" not in name
    return False


def _openai_reasoning(effort: Any, model: str | None) -> bool:
    """Reasoning on: an effort other than ``none``, or none given to a reasoning model."""
    if isinstance(effort, str):
        return effort != "none"
    return effort is None and openai_reasoning_model(model)


def _openai_chat(obj: dict[str, Any]) -> dict[str, Any]:
    state: list[str] = []
    if obj.get("web_search_options") is not None:
        state.append("server tool web_search")
    model = _str(obj.get("model"))
    stream = _bool(obj.get("stream"))
    stream_usage = None
    if stream:
        options = obj.get("stream_options")
        if options is None or isinstance(options, dict):
            stream_usage = isinstance(options, dict) and options.get("include_usage") is True
    return {
        "model": model,
        "stream": stream,
        "max_output_tokens": _pos_int(obj.get("max_completion_tokens"))
        or _pos_int(obj.get("max_tokens")),
        "reasoning": _openai_reasoning(obj.get("reasoning_effort"), model),
        "server_state": state,
        "candidates": _pos_int(obj.get("n")),
        "stream_usage": stream_usage,
        "service_tier": _str(obj.get("service_tier")),
    }


_RESPONSES_SERVER_TOOLS = (
    "web_search",
    "file_search",
    "mcp",
    "code_interpreter",
    "image_generation",
)


def _openai_responses(obj: dict[str, Any]) -> dict[str, Any]:
    state: list[str] = []
    if obj.get("previous_response_id"):
        state.append("previous_response_id")
    if obj.get("conversation"):
        state.append("conversation")
    if obj.get("prompt"):
        state.append("stored prompt")
    background = obj.get("background") is True
    if background:
        state.append("background mode")
    containers: list[str] = []
    caps: dict[str, int] = {}
    calls = _pos_int(obj.get("max_tool_calls"))  # bounds all built-in tool calls together
    for tool in _tools(obj.get("tools")):
        kind = tool["type"]
        if kind.startswith(_RESPONSES_SERVER_TOOLS):
            state.append(f"server tool {kind}")
        if kind == "code_interpreter":
            container = tool.get("container")
            if isinstance(container, str) and container:
                containers.append(container)
            else:  # auto: a container is made for the response
                caps["code_interpreter_session"] = caps.get("code_interpreter_session", 0) + 1
        for unit in ("web_search", "file_search"):
            if kind.startswith(unit) and calls is not None:
                caps[unit] = calls
    reasoning = obj.get("reasoning")
    model = _str(obj.get("model"))
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    return {
        "model": model,
        "stream": _bool(obj.get("stream")),
        "max_output_tokens": _pos_int(obj.get("max_output_tokens")),
        # a reasoning object without an effort: the model's default effort (on)
        "reasoning": (isinstance(reasoning, dict) and effort is None)
        or _openai_reasoning(effort, model),
        "server_state": state,
        "containers": containers,
        "unit_caps": caps,
        "background": background,
        "service_tier": _str(obj.get("service_tier")),
    }


_GEMINI_SERVER_TOOLS = {
    "googleSearch": "google_search",
    "googleSearchRetrieval": "google_search_retrieval",
    "codeExecution": "code_execution",
    "urlContext": "url_context",
    "fileSearch": "file_search",
    "googleMaps": "google_maps",
    "retrieval": "retrieval",
}


def _either(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


#: the prefix of Gemini's enum spelling of a tier (``SERVICE_TIER_FLEX``)
_GEMINI_TIER_ENUM = "service_tier_"


def gemini_tier(value: Any) -> str | None:
    """A Gemini service tier as the price file names it: Google's docs spell the
    request's ``flex``, ``FLEX`` and ``SERVICE_TIER_FLEX`` alike, and the response header
    ``standard``; lower case, without the enum prefix. None for anything not a string."""
    if not isinstance(value, str) or not value:
        return None
    return value.strip().lower().removeprefix(_GEMINI_TIER_ENUM)


def _gemini(obj: dict[str, Any]) -> dict[str, Any]:
    state: list[str] = []
    caps: dict[str, int] = {}
    if _either(obj, "cachedContent", "cached_content"):
        state.append("cached content")
    tools = obj.get("tools")
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                for camel, snake in _GEMINI_SERVER_TOOLS.items():
                    if camel in tool or snake in tool:
                        state.append(f"server tool {camel}")
                        if camel.startswith("googleSearch"):  # Gemini 2.x: per prompt
                            caps["grounded_prompt"] = 1
    config = _either(obj, "generationConfig", "generation_config")
    config = config if isinstance(config, dict) else {}
    thinking = _either(config, "thinkingConfig", "thinking_config")
    reasoning, budget = False, None
    if isinstance(thinking, dict):
        raw_budget = _either(thinking, "thinkingBudget", "thinking_budget")
        level = _either(thinking, "thinkingLevel", "thinking_level")
        reasoning = (type(raw_budget) is int and raw_budget != 0) or bool(level)
        budget = _pos_int(raw_budget)
    return {
        "model": _str(obj.get("model")),
        "max_output_tokens": _pos_int(_either(config, "maxOutputTokens", "max_output_tokens")),
        "candidates": _pos_int(_either(config, "candidateCount", "candidate_count")),
        "reasoning": reasoning,
        "thinking_budget": budget,
        "server_state": state,
        "unit_caps": caps,
        "service_tier": gemini_tier(_either(obj, "serviceTier", "service_tier")),
    }


def _bedrock(obj: dict[str, Any]) -> dict[str, Any]:
    state: list[str] = []
    if obj.get("promptVariables"):
        state.append("stored prompt")
    inference = obj.get("inferenceConfig")
    extra = obj.get("additionalModelRequestFields")
    reasoning, budget = False, None
    if isinstance(extra, dict):
        for key in ("thinking", "reasoning_config", "reasoningConfig"):
            block = extra.get(key)
            if isinstance(block, dict) and block.get("type") in ("enabled", "adaptive"):
                reasoning = True
                budget = _pos_int(block.get("budget_tokens")) or _pos_int(block.get("budgetTokens"))
    return {
        "model": _str(obj.get("modelId")),
        "max_output_tokens": _pos_int(inference.get("maxTokens"))
        if isinstance(inference, dict)
        else None,
        "reasoning": reasoning,
        "thinking_budget": budget,
        "server_state": state,
    }


def _bedrock_invoke(obj: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's body on Bedrock: the model is the URL's, whatever the body says."""
    return {**_anthropic(obj), "model": None}


_READERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "anthropic-messages": _anthropic,
    "openai-chat": _openai_chat,
    "openai-responses": _openai_responses,
    "gemini": _gemini,
    "bedrock-converse": _bedrock,
    "bedrock-invoke": _bedrock_invoke,
}

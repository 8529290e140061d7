"""What a client's request asks of the provider: its output limit, stream flag,
reasoning, a 1-hour cache TTL, server tools (the usage and the answer follow them)."""

from __future__ import annotations

from typing import Any

from .formats import ANTHROPIC_BODIES


def max_output_tokens(fmt: str, request: dict[str, Any]) -> int | None:
    """The request's output limit, if it names one."""
    value: Any = None
    if fmt in ANTHROPIC_BODIES:
        value = request.get("max_tokens")
    elif fmt == "openai-chat":
        value = request.get("max_completion_tokens") or request.get("max_tokens")
    elif fmt == "openai-responses":
        value = request.get("max_output_tokens")
    elif fmt == "gemini":
        config = request.get("generationConfig") or request.get("generation_config")
        if isinstance(config, dict):
            value = config.get("maxOutputTokens") or config.get("max_output_tokens")
    elif fmt == "bedrock-converse":
        config = request.get("inferenceConfig")
        if isinstance(config, dict):
            value = config.get("maxTokens")
    return value if type(value) is int and value > 0 else None


def request_streams(fmt: str, request: dict[str, Any]) -> bool:
    """The request's stream flag (Gemini and Bedrock say it in the URL: False)."""
    return request.get("stream") is True


_REASONING_MODELS = ("o1", "o3", "o4", "gpt-5")


def reasoning_enabled(fmt: str, request: dict[str, Any], model: str | None) -> bool:
    """Whether the model reasons on this request (asked for, or the model's default)."""
    if fmt in ANTHROPIC_BODIES:
        thinking = request.get("thinking")
        return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    if fmt in ("openai-chat", "openai-responses"):
        name = str(model or request.get("model") or "")
        if fmt == "openai-chat":
            effort = request.get("reasoning_effort")
        else:
            block = request.get("reasoning")
            effort = block.get("effort", "medium") if isinstance(block, dict) else None
        if effort is not None:
            return bool(effort != "none")
        return name.startswith(_REASONING_MODELS)
    if fmt == "gemini":
        config = request.get("generationConfig")
        thinking = config.get("thinkingConfig") if isinstance(config, dict) else None
        if isinstance(thinking, dict):
            budget = thinking.get("thinkingBudget")
            return bool(thinking.get("thinkingLevel")) or (type(budget) is int and budget != 0)
        return "2.5" in str(model or "") and "lite" not in str(model or "")
    extra = request.get("additionalModelRequestFields")
    thinking = extra.get("thinking") if isinstance(extra, dict) else None
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def asks_1h_ttl(fmt: str, request: dict[str, Any]) -> bool:
    """A cache breakpoint with a 1-hour TTL anywhere in the request's structure."""
    key = "cache_control" if fmt in ANTHROPIC_BODIES else "cachePoint"
    stack: list[Any] = [request]
    budget = 10_000
    while stack and budget > 0:
        budget -= 1
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            marker = node.get(key)
            if isinstance(marker, dict) and marker.get("ttl") == "1h":
                return True
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return False


def server_tools(fmt: str, request: dict[str, Any]) -> int:
    """Server tool calls the answer makes: one when the request offers a search tool."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return 0
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if fmt == "anthropic-messages" and isinstance(kind, str) and kind.startswith("web_search"):
            return 1
        if fmt == "openai-responses" and isinstance(kind, str) and kind.startswith("web_search"):
            return 1
        if fmt == "gemini" and ("googleSearch" in tool or "google_search" in tool):
            return 1
    return 0

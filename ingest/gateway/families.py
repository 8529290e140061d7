"""The provider API families the gateway speaks (each a set of routes, see routes.py)."""

from __future__ import annotations

from typing import Literal

Api = Literal["openai", "anthropic", "gemini", "bedrock"]

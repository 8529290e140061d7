"""The spendbus contract: every constant two stages must agree on, defined once.

Avro schemas and their codec, money units, periods, counter keys, canonical
ids, topic names and the UsageEvent rules. Imports nothing from the stages.

The names below load on first use (PEP 562): a module that needs only
``schemas.errors`` or ``schemas.pricing`` does not build every codec (the CLI's
``spendbus price`` and ``--help`` among them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.codec import (
        ALERT,
        BUDGET_POLICY,
        DEAD_LETTER,
        PRICE_TABLE,
        PRICED_USAGE,
        USAGE_EVENT,
        VERDICT,
        Codec,
        codec_for,
    )
    from schemas.errors import ConfigError, ContractError, DecodeError, InvalidRecord, SpendbusError
    from schemas.topics import Topics

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "ALERT",
            "BUDGET_POLICY",
            "DEAD_LETTER",
            "PRICED_USAGE",
            "PRICE_TABLE",
            "USAGE_EVENT",
            "VERDICT",
            "Codec",
            "codec_for",
        ),
        "schemas.codec",
    ),
    **dict.fromkeys(
        ("ConfigError", "ContractError", "DecodeError", "InvalidRecord", "SpendbusError"),
        "schemas.errors",
    ),
    "Topics": "schemas.topics",
}


def __getattr__(name: str) -> object:
    # runtime.faces does the same for the other faces; the contract may not import it
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "ALERT",
    "BUDGET_POLICY",
    "DEAD_LETTER",
    "PRICED_USAGE",
    "PRICE_TABLE",
    "USAGE_EVENT",
    "VERDICT",
    "Codec",
    "ConfigError",
    "ContractError",
    "DecodeError",
    "InvalidRecord",
    "SpendbusError",
    "Topics",
    "codec_for",
]

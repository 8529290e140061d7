"""The spendbus contract: every constant two stages must agree on, defined once.

Avro schemas and their codec, money units, periods, counter keys, canonical
ids, topic names and the UsageEvent rules. Imports nothing from the stages.
"""

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

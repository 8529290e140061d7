"""The root of every error spendbus raises.

Each room (ingest, aggregator, enforcer) derives its own errors from these in
its ``errors.py``; callers branch on the class or on ``retriable``::

    SpendbusError
    ├── ContractError                 a message or a value breaks the contract in schemas/
    │   ├── DecodeError               bytes that cannot be read (reason: bad_magic, unknown_fingerprint, ...)
    │   └── InvalidRecord             a readable record with a bad field (names the field)
    └── ConfigError                   a config/price/budget file that cannot be used (names file and field)
"""

from __future__ import annotations


class SpendbusError(Exception):
    """Root of all spendbus errors. ``retriable`` tells whether trying again may succeed."""

    retriable: bool = False


class ContractError(SpendbusError):
    """A message or value does not follow the contract defined in ``schemas/``."""

    #: a short machine-readable code, stored with dead letters
    reason: str = "contract"

    def __init__(self, detail: str, *, reason: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if reason is not None:
            self.reason = reason


class DecodeError(ContractError):
    """Bytes that cannot be decoded into a known record."""

    reason = "malformed"


class InvalidRecord(ContractError):
    """A decoded record whose field values are not acceptable (negative tokens, absurd values...)."""

    reason = "invalid_field"

    def __init__(self, field: str, detail: str, *, record_id: str | None = None) -> None:
        where = f"event {record_id!r}: " if record_id else ""
        super().__init__(f"{where}field {field!r}: {detail}")
        self.field = field
        self.record_id = record_id


class ConfigError(SpendbusError):
    """A configuration, price or budget file that cannot be used; the message names file and field."""

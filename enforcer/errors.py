"""Errors the enforcer raises, under the one spendbus root::

    SpendbusError                        (schemas.errors)
    └── EnforcerError                    anything the enforcer room raises
        ├── InvalidContext               a request context the enforcer will not evaluate
        │                                (names the field; answer 400, never a guess)
        ├── NotReady          retriable  state was not caught up in time (wait longer, or
        │                                let fail_mode decide per request)
        └── TopicsMissing     retriable  a topic the enforcer reads does not exist (yet)

Config problems are :class:`schemas.errors.ConfigError` (pydantic validation of
:class:`enforcer.config.EnforcerConfig`, re-raised with the field named).
"""

from __future__ import annotations

from schemas.errors import SpendbusError


class EnforcerError(SpendbusError):
    """Root of the enforcer's errors."""


class InvalidContext(EnforcerError):
    """A request context with a missing, malformed or oversized field."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"context field {field!r}: {detail}")
        self.field = field
        self.detail = detail


class NotReady(EnforcerError):
    """The enforcer did not catch up with its topics within the time given."""

    retriable = True


class TopicsMissing(EnforcerError):
    """A topic the enforcer reads does not exist; create the topics (``spendbus topics``)."""

    retriable = True

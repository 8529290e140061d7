"""Errors of the ingest room, all under :class:`schemas.errors.SpendbusError`.

Callers branch on the class or on ``retriable`` (trying again later may succeed)::

    SpendbusError
    ├── ContractError
    │   └── InvalidRecord          (schemas) an event breaks the contract: names the field
    └── IngestError                 anything else the ingest room raises
        ├── SpoolError              the on-disk spool cannot be used
        │   ├── SpoolLocked         another process holds the spool directory
        │   └── SpoolFull           no room for the event within the policy (retriable)
        ├── PublishTimeout          the broker did not acknowledge in time; the events
        │                           stay spooled and will be sent (retriable)
        └── PublisherClosed         publish() after stop(), or before start()
"""

from __future__ import annotations

from schemas.errors import InvalidRecord, SpendbusError

__all__ = [
    "IngestError",
    "InvalidRecord",
    "PublishTimeout",
    "PublisherClosed",
    "SpoolError",
    "SpoolFull",
    "SpoolLocked",
    "reason_of",
]


class IngestError(SpendbusError):
    """Root of the errors of the ingest room (other than contract errors)."""


class SpoolError(IngestError):
    """The on-disk spool cannot be opened or written."""


class SpoolLocked(SpoolError):
    """Another process (or publisher) already owns this spool directory."""


class SpoolFull(SpoolError):
    """The spool has no room for the events within the configured policy.

    Nothing of the refused call was written. Retriable: the spool drains once
    the broker is reachable again.
    """

    retriable = True


class PublishTimeout(IngestError):
    """The broker did not acknowledge in time.

    The events are safe in the spool and the sender keeps trying; waiting or
    publishing them again (same event ids) is safe.
    """

    retriable = True


class PublisherClosed(IngestError):
    """The publisher is not running (not started yet, or stopped)."""


def reason_of(exc: InvalidRecord) -> str:
    """The reason an InvalidRecord gives, without its "event ...: field ...:" prefix."""
    text = str(exc)
    marker = f"field {exc.field!r}: "
    return text.split(marker, 1)[1] if marker in text else text

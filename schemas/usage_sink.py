"""Where usage events go: the :class:`UsageSink` shape, shared by the rooms that emit them.

``ingest.publisher.UsagePublisher`` satisfies it (its spool and retries); the
gateway publishes each request's UsageEvent through one and the enforcer's
sidecar its refusal events, so neither imports the publisher itself (the
commands in ``spendbus/commands/`` wire the real one in).
"""

from __future__ import annotations

from typing import Protocol

from schemas.records import UsageEvent


class UsageSink(Protocol):
    """Where usage events go (``ingest.publisher.UsagePublisher``)."""

    async def publish(self, event: UsageEvent) -> None: ...

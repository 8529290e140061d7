"""What the gateway needs from a budget gate and from a usage sink, as protocols.

``enforcer.Enforcer`` satisfies :class:`BudgetGate` structurally and
``ingest.publisher.UsagePublisher`` satisfies ``schemas.usage_sink.UsageSink``; the gateway
depends on these shapes only, so the ingest room never imports the enforcer
(the composition in ``spendbus/commands/gateway.py`` wires the real ones, and
mypy checks there that they fit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from schemas.records import UsageEvent
from schemas.usage_sink import UsageSink as UsageSink  # defined in schemas: the sidecar shares it


class GateDecision(Protocol):
    """One check's answer (``enforcer.Decision``)."""

    hold_id: int | None

    @property
    def allowed(self) -> bool: ...

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Refusal headers, or warning headers (X-Spend-Budget) on an allowed request."""
        ...

    @property
    def body(self) -> dict[str, Any] | None: ...

    def usage_fields(self) -> dict[str, Any]:
        """outcome, decision, decision_budget_id for the request's UsageEvent."""
        ...

    def refusal_event(
        self, *, gateway_id: str | None = None, event_id: str | None = None, **fields: Any
    ) -> UsageEvent | None:
        """The UsageEvent of a refused request (None when allowed)."""
        ...


class CounterReport(Protocol):
    """One counter as the gate enforces it (``enforcer.CounterStatus``)."""

    def to_json(self) -> dict[str, Any]: ...


class BudgetGate(Protocol):
    """Reserve-and-settle budget checks (``enforcer.Enforcer``).

    ``context`` validates the request's fields and raises a ``SpendbusError``
    naming the bad one; ``check`` holds an estimate for an allowed request
    until ``settle`` (the usage event is published) or ``release`` (the
    request never reached the provider).
    """

    def context(self, **fields: Any) -> Any: ...

    def check(self, ctx: Any, *, reserve: bool = True) -> GateDecision: ...

    def usage(self, ctx: Any) -> Sequence[CounterReport]:
        """Every counter ``ctx`` counts in, from the gate's memory (``GET /v1/spend``)."""
        ...

    @property
    def ready(self) -> bool: ...

    @property
    def stale(self) -> bool: ...

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool: ...

    def release(self, hold_id: int | None) -> bool: ...

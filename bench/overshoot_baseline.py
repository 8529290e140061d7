"""The comparator of bench_overshoot: the polling budget gate spendbus's design criticises.

What most gateways do (docs/design.md, "Why it is built this way"): each replica adds
the cost of the calls it served to a local counter; every ``flush_interval_s``
it adds that counter to a shared total (Redis ``INCRBY`` or a database row in
real deployments; :class:`SharedTotal` here, an in-process stand-in, which only
flatters the baseline: no network round trip) and reads the total back into
a cache. A request is allowed while ``cached total < cap``: a post-paid check
against a number up to two flush intervals old, with nothing held for calls in
flight.

:class:`PollGate` satisfies ``ingest.gateway.gate.BudgetGate``, so the same
reference gateway runs with it in place of the enforcer. It is a benchmark
comparator, never product code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.gateway.gate import BudgetGate, CounterReport
from schemas.pricing import PriceBook
from schemas.records import UsageEvent
from schemas.usage import ALLOWED, BUDGET_EXCEEDED, new_usage_event


@dataclass
class SharedTotal:
    """The shared spend of one budget (what Redis or a database row holds)."""

    nanos: int = 0
    flushes: int = 0


@dataclass(frozen=True)
class PollContext:
    """The request fields the gate is given (kept whole for the refusal event)."""

    fields: Mapping[str, Any]


@dataclass
class PollDecision:
    """One answer of the poll gate, in the shape the gateway reads (``GateDecision``)."""

    allowed: bool
    ctx: PollContext
    budget_id: str
    cached_nanos: int
    cap_nanos: int
    hold_id: int | None = None
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def status(self) -> int:
        return 200 if self.allowed else 402

    @property
    def body(self) -> dict[str, Any] | None:
        if self.allowed:
            return None
        return {
            "error": BUDGET_EXCEEDED,
            "budget_id": self.budget_id,
            "limit_nanos": self.cap_nanos,
            "spent_nanos": self.cached_nanos,
        }

    def usage_fields(self) -> dict[str, Any]:
        return {
            "outcome": "allowed" if self.allowed else "refused",
            "decision": ALLOWED if self.allowed else BUDGET_EXCEEDED,
            "decision_budget_id": None if self.allowed else self.budget_id,
        }

    def refusal_event(
        self, *, gateway_id: str | None = None, event_id: str | None = None, **fields: Any
    ) -> UsageEvent | None:
        """The zero-token UsageEvent of a refusal, like the enforcer's (same Kafka traffic)."""
        if self.allowed:
            return None
        ctx = self.ctx.fields
        optional = {
            name: ctx.get(name) for name in ("project_id", "grant_id", "user_id", "session_id")
        }
        optional.update(fields)
        return new_usage_event(
            provider=ctx.get("provider") or "unknown",
            api=ctx.get("api") or "unknown",
            model=ctx.get("model") or "unknown",
            secret_id=ctx["secret_id"],
            org_id=ctx["org_id"],
            gateway_id=gateway_id or "poll-gate",
            input_tokens=0,
            output_tokens=0,
            status_code=self.status,
            event_id=event_id,
            groups=list(ctx.get("groups") or ()),
            tags=dict(ctx.get("tags") or {}),
            usage_source="none",
            **self.usage_fields(),
            **optional,
        )


@dataclass
class PollGate:
    """One replica's polling gate: local spend, flushed and re-read every ``flush_interval_s``.

    ``first_flush_s`` is this replica's phase (replicas started together would
    otherwise flush in lock-step; staggering them is the kinder case for the baseline).
    """

    shared: SharedTotal
    prices: PriceBook
    budget_id: str
    cap_nanos: int
    flush_interval_s: float = 5.0
    first_flush_s: float = 5.0
    #: cost of calls served here and not yet flushed to the shared total
    local_nanos: int = 0
    #: the shared total as of this replica's last flush
    cached_nanos: int = 0
    checks: int = 0
    refusals: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    # -- lifecycle (the flush timer) ---------------------------------------------------------
    async def start(self) -> None:
        self.cached_nanos = self.shared.nanos
        self._task = asyncio.create_task(self._flush_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.flush()

    async def _flush_loop(self) -> None:
        due = time.monotonic() + self.first_flush_s
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self.flush()
            due += self.flush_interval_s

    def flush(self) -> None:
        """INCRBY the local spend into the shared total, then GET it back into the cache."""
        self.shared.nanos += self.local_nanos
        self.shared.flushes += 1
        self.local_nanos = 0
        self.cached_nanos = self.shared.nanos

    # -- BudgetGate --------------------------------------------------------------------------
    def context(self, **fields: Any) -> PollContext:
        for name in ("org_id", "secret_id"):
            if not isinstance(fields.get(name), str) or not fields[name].strip():
                raise ValueError(f"{name} must be a non-empty string")
        return PollContext(fields)

    def check(self, ctx: PollContext, *, reserve: bool = True) -> PollDecision:
        self.checks += 1
        allowed = self.cached_nanos < self.cap_nanos
        if not allowed:
            self.refusals += 1
        return PollDecision(allowed, ctx, self.budget_id, self.cached_nanos, self.cap_nanos)

    def settle(self, hold_id: int | None, event: Mapping[str, Any]) -> bool:
        """The call's usage event was published: add its cost (priced as the aggregator does)."""
        self.local_nanos += self.prices.price_event(event).cost_nanos
        return True

    def release(self, hold_id: int | None) -> bool:
        return False  # nothing is ever held

    def usage(self, ctx: PollContext) -> list[CounterReport]:
        """``GET /v1/spend``: none; the baseline keeps one shared total, no counters."""
        return []

    @property
    def ready(self) -> bool:
        return True  # it decides from its cache from the start

    @property
    def stale(self) -> bool:
        return False  # stale by design, never by state: its cache is always "current"


def _fits_the_gateway(gate: PollGate) -> BudgetGate:
    """mypy checks here that PollGate is a BudgetGate (the gateway's Protocol)."""
    return gate

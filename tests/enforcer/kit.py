"""Builders shared by the enforcer tests: budgets, prices and verdicts as topic records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from enforcer import Enforcer, EnforcerConfig
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, PRICE_TABLE
from schemas.ids import counter_key
from schemas.periods import parse_window, period_end, period_key
from schemas.pricing import ModelPrice, PriceTable
from schemas.raises import BudgetRaise
from schemas.records import BudgetAction, BudgetPolicy, Verdict
from schemas.records import BudgetRaise as BudgetRaiseRecord
from schemas.records import PriceTable as PriceTableRecord

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"
#: $3 / $15 per Mtok: 1000 input + 1000 output tokens = 3_000_000 + 15_000_000 nanos
PRICES = PriceTable(
    version="2026-01-01",
    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    models=(ModelPrice.of("claude-sonnet-4-5", "3", "15"), ModelPrice.of("gpt-4o", "2.5", "10")),
)


class FakeClock:
    """An injectable clock (seconds since the epoch) that only moves when told."""

    def __init__(self, at: datetime = NOW) -> None:
        self.t = at.timestamp()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def set(self, at: datetime) -> None:
        self.t = at.timestamp()

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


def budget(
    budget_id: str,
    scope: str = "org",
    *,
    window: str = "month",
    limit_usd: int | None = None,
    limit_nanos: int | None = None,
    limit_tokens: int | None = None,
    limit_requests: int | None = None,
    action: str = "enforce",
    match: dict[str, Sequence[str]] | None = None,
    alert_at: Sequence[float] = (),
    count_denied: bool = False,
) -> Budget:
    if limit_usd is not None:
        limit_nanos = limit_usd * 1_000_000_000
    return Budget(
        budget_id=budget_id,
        scope=scope,
        window=parse_window(window),
        action=action,
        match={k: tuple(v) for k, v in (match or {}).items()},
        limit_nanos=limit_nanos,
        limit_tokens=limit_tokens,
        limit_requests=limit_requests,
        alert_at=tuple(alert_at),
        count_denied=count_denied,
    )


def verdict(
    b: Budget,
    scope_values: Sequence[str],
    *,
    spent_nanos: int = 0,
    spent_tokens: int = 0,
    spent_requests: int = 0,
    seq: int = 1,
    at: datetime = NOW,
    period: str | None = None,
    emitted_at: datetime | None = None,
    buckets: Mapping[int, tuple[int, int, int]] | None = None,
) -> Verdict:
    """A Verdict record for counter (b, scope_values) in the period of ``at``; a rolling
    window's ``buckets`` by age (buckets before ``at``'s) -> (nanos, tokens, requests),
    its spend their sums (none given: a v2 record's, no buckets)."""
    ages = sorted(buckets or {}, reverse=True)
    if buckets:
        spent_nanos = sum(buckets[a][0] for a in ages)
        spent_tokens = sum(buckets[a][1] for a in ages)
        spent_requests = sum(buckets[a][2] for a in ages)
    exceeded = any(
        limit is not None and spent >= limit
        for spent, limit in (
            (spent_nanos, b.limit_nanos),
            (spent_tokens, b.limit_tokens),
            (spent_requests, b.limit_requests),
        )
    )
    return {
        "counter_key": counter_key(b.budget_id, scope_values),
        "budget_id": b.budget_id,
        "scope": b.scope,
        "scope_values": list(scope_values),
        "period": period or period_key(b.window, at),
        "state": "exceeded" if exceeded else "ok",
        "spent_nanos": spent_nanos,
        "spent_tokens": spent_tokens,
        "spent_requests": spent_requests,
        "limit_nanos": b.limit_nanos,
        "limit_tokens": b.limit_tokens,
        "limit_requests": b.limit_requests,
        # Budget.action is a str, checked against ACTIONS where a budget is parsed
        "action": cast(BudgetAction, b.action),
        "refusal": b.refusal,
        "reset_at": period_end(b.window, at),
        "as_of": at,
        "seq": seq,
        "emitted_at": emitted_at or at + timedelta(milliseconds=50),
        # a verdict without a forecast (a v1 counter's, or a rolling window's)
        "burn_nanos": None,
        "burn_tokens": None,
        "burn_requests": None,
        "burn_span_us": None,
        "exhausts_at": None,
        "bucket_ages": ages,
        "bucket_nanos": [buckets[a][0] for a in ages] if buckets else [],
        "bucket_tokens": [buckets[a][1] for a in ages] if buckets else [],
        "bucket_requests": [buckets[a][2] for a in ages] if buckets else [],
    }


def policy_record(b: Budget, applied_at: datetime = NOW) -> BudgetPolicy:
    """``b``'s BudgetPolicy record as the enforcer reads it from budget.policies."""
    return BUDGET_POLICY.decode(BUDGET_POLICY.encode(b.to_record(applied_at)))


def price_record(table: PriceTable = PRICES) -> PriceTableRecord:
    """``table``'s PriceTable record as the enforcer reads it from the pricing topic."""
    return PRICE_TABLE.decode(PRICE_TABLE.encode(table.to_record()))


def raise_record(r: BudgetRaise) -> BudgetRaiseRecord:
    """``r``'s BudgetRaise record as the enforcer reads it from budget.raises."""
    return BUDGET_RAISE.decode(BUDGET_RAISE.encode(r.to_record()))


def loaded_enforcer(
    budgets: Sequence[Budget] = (),
    verdicts: Sequence[Verdict] = (),
    *,
    clock: FakeClock | None = None,
    **config: Any,
) -> tuple[Enforcer, FakeClock]:
    """An enforcer whose state is fed directly (no Kafka), ready and fresh."""
    clock = clock or FakeClock()
    # a policy's job keys need a secret (one given whether or not a policy is configured)
    enforcer = Enforcer(EnforcerConfig(**config), clock=clock, job_key_secret=b"test-job-secret")
    for b in budgets:
        enforcer.state.apply_policy(b.budget_id, policy_record(b))
    enforcer.state.apply_price(PRICES.version, price_record())
    for v in verdicts:
        enforcer.state.apply_verdict(v["counter_key"], v)
    enforcer.state.ready = True
    enforcer.state.fresh_at_us = int(clock() * 1_000_000)
    return enforcer, clock


def ctx(**fields: Any) -> Any:
    from enforcer import Context

    base: dict[str, Any] = {
        "org_id": "acme",
        "secret_id": "sk-1",
        "provider": "anthropic",
        "model": MODEL,
        "input_tokens": 1000,
        "max_output_tokens": 1000,
    }
    base.update(fields)
    return Context(**base)


def refresh(enforcer: Enforcer) -> None:
    """Mark the verdict stream confirmed as of the enforcer's clock (what the follower does)."""
    enforcer.state.fresh_at_us = int(enforcer.clock() * 1_000_000)

"""The enforcer benches' state: 100k live counters fed in memory as the follower feeds
them, the contexts that hit them, and the helpers every section shares (percentiles, the
collector's pauses). Importing it first puts SPENDBUS_BENCH_ROOT's code on the path."""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

# SPENDBUS_BENCH_ROOT: whose enforcer/ and schemas/ to load (--baseline runs this harness
# over another checkout's code, so both servers are measured the same way)
sys.path.insert(0, os.environ.get("SPENDBUS_BENCH_ROOT") or str(Path(__file__).parent.parent))

from pydantic import SecretStr

from enforcer import Context, Enforcer, EnforcerConfig
from schemas.budgets import Budget
from schemas.ids import counter_key
from schemas.periods import parse_window, period_end, period_key
from schemas.pricing import ModelPrice, PriceTable

if TYPE_CHECKING:  # types only: a --baseline checkout may predate schemas.records
    from schemas.records import BudgetAction, BudgetPolicy, Verdict
    from schemas.records import PriceTable as PriceTableRecord

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
USD = 1_000_000_000
ORGS, USERS_PER_ORG, SESSIONS_PER_USER = 1000, 45, 1
TOKEN = "bench-token"


def _budget(
    budget_id: str, scope: str, window: str, action: str = "enforce", **limits: Any
) -> Budget:
    return Budget(
        budget_id=budget_id,
        scope=scope,
        window=parse_window(window),
        action=action,
        alert_at=(0.8,),
        **limits,
    )


BUDGETS = [
    _budget("org-monthly", "org", "month", limit_nanos=1000 * USD),
    _budget("user-daily", "user", "day", limit_nanos=20 * USD, limit_tokens=5_000_000),
    _budget("job-ceiling", "session", "total", limit_nanos=5 * USD),
    _budget("team-warn", "group", "week", action="warn", limit_nanos=200 * USD),
    _budget("hourly-rpm", "secret", "rolling:1h", limit_requests=100_000),
]


def _verdict(b: Budget, values: tuple[str, ...], spent: int, seq: int) -> Verdict:
    return {
        "counter_key": counter_key(b.budget_id, values),
        "budget_id": b.budget_id,
        "scope": b.scope,
        "scope_values": list(values),
        "period": period_key(b.window, NOW),
        "state": "ok",
        "spent_nanos": spent,
        "spent_tokens": spent // 20_000,  # ~$20 per million tokens
        "spent_requests": seq,
        "limit_nanos": b.limit_nanos,
        "limit_tokens": b.limit_tokens,
        "limit_requests": b.limit_requests,
        # Budget.action is a str, checked against ACTIONS where a budget is parsed
        "action": cast("BudgetAction", b.action),
        "refusal": b.refusal,
        "reset_at": period_end(b.window, NOW),
        "as_of": NOW,
        "seq": seq,
        "emitted_at": NOW + timedelta(milliseconds=30),
        # no forecast (a v1 counter's verdict, or a rolling window's)
        "burn_nanos": None,
        "burn_tokens": None,
        "burn_requests": None,
        "burn_span_us": None,
        "exhausts_at": None,
        # no buckets: a rolling counter's spend then counts in its newest bucket, which
        # leaves the window an hour after NOW, so every check reads the spend as it is
        "bucket_ages": [],
        "bucket_nanos": [],
        "bucket_tokens": [],
        "bucket_requests": [],
    }


def loaded(
    counters: int = 100_000,
    *,
    moving_clock: bool = False,
    hold_timeout_s: float = 600.0,
    policy_file: Path | None = None,
) -> tuple[Enforcer, list[Context]]:
    """An enforcer holding ``counters`` live verdicts, and contexts that hit them.

    The clock reads NOW (12:00 UTC, so no period rolls over during a run); with
    ``moving_clock`` it starts at NOW and advances with wall time (holds can expire)."""
    rng = random.Random(7)
    clock_t = NOW.timestamp()
    clock = (lambda: clock_t) if not moving_clock else moving_clock_from(clock_t)
    config = EnforcerConfig(
        sidecar_token=SecretStr(TOKEN), hold_timeout_s=hold_timeout_s, policy_file=policy_file
    )
    # with a policy: every check evaluates it (its approval requests are never published here)
    e = Enforcer(config, clock=clock, job_key_secret=b"bench-job-key-secret")
    for b in BUDGETS:
        # to_record builds the BudgetPolicy record, typed as a plain dict
        e.state.apply_policy(b.budget_id, cast("BudgetPolicy", b.to_record(NOW)))
    prices = PriceTable(
        version="v1",
        effective_from=NOW - timedelta(days=300),
        models=(
            ModelPrice.of("claude-sonnet-4-5", "3", "15"),
            ModelPrice.of("gpt-4o", "2.5", "10"),
        ),
    )
    e.state.apply_price("v1", cast("PriceTableRecord", prices.to_record()))  # as above
    by = {b.budget_id: b for b in BUDGETS}
    contexts: list[Context] = []
    n = 0
    for o in range(ORGS):
        org = f"org-{o}"
        e.state.apply_verdict(*_pair(by["org-monthly"], (org,), rng.randrange(900 * USD), 1))
        n += 1
        for g in range(3):
            e.state.apply_verdict(
                *_pair(by["team-warn"], (org, f"team-{g}"), rng.randrange(250 * USD), 1)
            )
            n += 1
        for u in range(USERS_PER_ORG):
            user = f"user-{o}-{u}@example.com"
            secret = f"sk-{o}-{u}"
            session = f"run-{o}-{u}"
            # one user in ten has spent their day: those checks are refusals
            spent = 20 * USD if u % 10 == 0 else rng.randrange(15 * USD)
            for b, values, s in (
                (by["user-daily"], (org, user), spent),
                (by["job-ceiling"], (org, user, session), rng.randrange(4 * USD)),
            ):
                e.state.apply_verdict(*_pair(b, values, s, 1))
                n += 1
            contexts.append(
                Context(
                    org_id=org,
                    secret_id=secret,
                    user_id=user,
                    session_id=session,
                    groups=(f"team-{u % 3}",),
                    provider="anthropic",
                    api="messages",
                    model="claude-sonnet-4-5",
                    input_tokens=2000,
                    max_output_tokens=1024,
                )
            )
            if n >= counters:
                break
        if n >= counters:
            break
    while n < counters:  # top up with secrets' rolling counters
        e.state.apply_verdict(*_pair(by["hourly-rpm"], (f"org-{n % ORGS}", f"sk-x{n}"), 0, 1))
        n += 1
    e.state.ready = True
    e.state.fresh_at_us = int(clock_t * 1_000_000)
    rng.shuffle(contexts)
    return e, contexts


def moving_clock_from(start: float) -> Callable[[], float]:
    offset = start - time.time()
    wall = time.time
    return lambda: wall() + offset


class GcPauses:
    """Garbage collections and their pauses while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.pauses_ns: list[int] = []
        self._started = 0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.pauses_ns.append(time.perf_counter_ns() - self._started)
            self.collections[info["generation"]] += 1

    def summary(self, operations: int) -> dict[str, Any]:
        pauses = self.pauses_ns
        return {
            "collections_gen012": list(self.collections),
            "pause_total_ms": round(sum(pauses) / 1e6, 2),
            "pause_max_ms": round(max(pauses, default=0) / 1e6, 3),
            "pause_ns_per_op": round(sum(pauses) / operations, 1) if operations else None,
        }


def _pair(b: Budget, values: tuple[str, ...], spent: int, seq: int) -> tuple[str, Verdict]:
    record = _verdict(b, values, spent, seq)
    return record["counter_key"], record


def pct(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]

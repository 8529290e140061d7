"""The table of cases the TypeScript client is held to (clients/node/test/cases.json).

Each check case is budgets, prices, raises and verdicts as the topics carry them (Avro
single-object bytes, hex), the follower's clock when they were applied and when the request
is checked, the enforcer settings, the requests checked before (admitted: they hold their
worst case, take rates and open sessions) and the request; the expected answer is what the Python enforcer decides for it (``Enforcer.peek``:
the check of a request with nothing in flight), as the sidecar's JSON, or the
:class:`enforcer.InvalidContext` field it names.

The encoding cases are UsageEvents with the key and value the Python publisher writes, and
the partition Kafka's murmur2 gives the key; the released-version cases are records written
with every older version of each schema the client reads, and what the Python codec reads
them as. ``python -m tests.clients.node_cases`` writes
the file; tests/clients/test_node_client.py regenerates it and compares, so neither side
drifts.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_writer

from enforcer import Context, Enforcer, EnforcerConfig, InvalidContext
from ingest.publisher.sender import partition_index
from schemas.avro_schemas import fingerprint, history_versions
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, PRICE_TABLE, USAGE_EVENT, VERDICT, codec_for
from schemas.periods import to_micros
from schemas.pricing import PriceTable, price_table_from_yaml
from schemas.raises import BudgetRaise
from schemas.records import UsageEvent
from schemas.topics import usage_raw_key
from schemas.usage import new_usage_event
from tests.enforcer.kit import verdict

ROOT = Path(__file__).resolve().parents[2]
CASES_PATH = ROOT / "clients" / "node" / "test" / "cases.json"
#: what the Node client's counters show of the sidecar's (no forecast)
COUNTER_FIELDS = (
    "budget_id",
    "scope",
    "scope_values",
    "counter",
    "action",
    "window",
    "period",
    "state",
    "spent_nanos",
    "spent_tokens",
    "spent_requests",
    "held_nanos",
    "held_tokens",
    "held_requests",
    "limit_nanos",
    "limit_tokens",
    "limit_requests",
    "base_limit_nanos",
    "base_limit_tokens",
    "base_limit_requests",
    "raise",
    "remaining",
    "used_pct",
    "reset_at",
    "as_of",
    "seq",
)
USD = 1_000_000_000
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BASE_CTX: dict[str, Any] = {
    "org_id": "acme",
    "secret_id": "sk-1",
    "provider": "anthropic",
    "model": "claude-sonnet-4-5",
    "input_tokens": 1000,
    "max_output_tokens": 1000,
}
#: the enforcer settings a case may change (EnforcerConfig names -> the Node client's)
CONFIG_NAMES = {
    "fail_mode": "failMode",
    "grace_s": "graceS",
    "refusal_style": "refusalStyle",
    "default_max_output_tokens": "defaultMaxOutputTokens",
    "replicas": "replicas",
    "unpriced_models": "unpricedModels",
    "max_sessions_per_key": "maxSessionsPerKey",
}
#: the price versions every case's pricing topic holds (unless it says otherwise): a model
#: with a long-context tier and a unit price, one by its snapshot forms, a fallback in a
#: later version, and a version not yet in force
PRICES_YAML: dict[str, Any] = {
    "versions": [
        {
            "version": "2026-01-01",
            "effective_from": "2026-01-01T00:00:00Z",
            "models": [
                {
                    "match": "claude-sonnet-4-5",
                    "input_per_mtok": "3.00",
                    "output_per_mtok": "15.00",
                    "long_context": {
                        "above_input_tokens": 200000,
                        "input_per_mtok": "6.00",
                        "output_per_mtok": "22.50",
                    },
                    "unit_prices": {"web_search": "0.01"},
                },
                {"match": "gpt-4o", "input_per_mtok": "2.5", "output_per_mtok": "10"},
                {"match": "gpt-4o-mini", "input_per_mtok": "0.15", "output_per_mtok": "0.6"},
                {
                    "match": "odd-rates",
                    "input_per_mtok": "0.000333",
                    "output_per_mtok": "1.0000005",
                },
                {"match": "half-nano", "input_per_mtok": "0.0005", "output_per_mtok": "0.0015"},
            ],
        },
        {
            "version": "2026-12-01",
            "effective_from": "2026-12-01T00:00:00Z",
            "models": [
                {"match": "claude-sonnet-4-5", "input_per_mtok": "30", "output_per_mtok": "150"}
            ],
            "fallback": {"input_per_mtok": "1", "output_per_mtok": "2"},
        },
    ]
}


def price_tables() -> list[PriceTable]:
    tables = price_table_from_yaml(PRICES_YAML, source="node cases")
    return tables if isinstance(tables, list) else [tables]


def budgets(yaml_list: list[dict[str, Any]]) -> list[Budget]:
    return budgets_from_yaml(yaml_list)


def one(spec: dict[str, Any]) -> Budget:
    return budgets([spec])[0]


class Case:
    """One check case: what the topics hold, the clocks, the settings and the request."""

    def __init__(
        self,
        name: str,
        policies: Sequence[Budget] = (),
        verdicts: Sequence[Mapping[str, Any]] = (),
        ctx: Mapping[str, Any] | None = None,
        *,
        applied_at: datetime = NOW,
        checked_at: datetime | None = None,
        raises: Sequence[BudgetRaise] = (),
        prices: Sequence[PriceTable] | None = None,
        before: Sequence[Mapping[str, Any]] = (),
        settled: Sequence[tuple[int, Mapping[str, Any]]] = (),
        verdicts_after: Sequence[Mapping[str, Any]] = (),
        ready: bool = True,
        fresh_at: datetime | None = NOW,
        config: Mapping[str, Any] | None = None,
        **ctx_fields: Any,
    ) -> None:
        self.name = name
        self.policies = list(policies)
        self.verdicts = list(verdicts)
        self.ctx = dict(BASE_CTX if ctx is None else ctx) | ctx_fields
        self.applied_at = applied_at
        self.checked_at = checked_at or applied_at
        self.raises = list(raises)
        self.prices = price_tables() if prices is None else list(prices)
        self.before = [dict(BASE_CTX) | dict(b) for b in before]
        #: (index into before, the usage event's fields) of requests whose usage came
        self.settled = [(i, usage_event(fields)) for i, fields in settled]
        #: verdicts that arrive after the requests before (a settled hold's may cover it)
        self.verdicts_after = list(verdicts_after)
        self.ready = ready
        self.fresh_at = fresh_at
        self.config = dict(config or {})

    def expected(self) -> dict[str, Any]:
        """What the Python enforcer answers (or the field its InvalidContext names)."""
        clock = Clock(self.applied_at)
        enforcer = Enforcer(EnforcerConfig(**self.config), clock=clock)
        state = enforcer.state
        for t in self.prices:
            state.apply_price(t.version, PRICE_TABLE.decode(PRICE_TABLE.encode(t.to_record())))
        for b in self.policies:
            state.apply_policy(b.budget_id, BUDGET_POLICY.decode(policy_bytes(b)))
        for r in self.raises:
            state.apply_raise(r.raise_id, BUDGET_RAISE.decode(BUDGET_RAISE.encode(r.to_record())))
        for v in self.verdicts:
            state.apply_verdict(v["counter_key"], VERDICT.decode(VERDICT.encode(v)))
        state.ready = self.ready
        state.fresh_at_us = None if self.fresh_at is None else to_micros(self.fresh_at)
        clock.at = self.checked_at
        # admitted: they hold, take rates and open sessions
        decisions = [enforcer.check(Context.from_mapping(earlier)) for earlier in self.before]
        for i, event in self.settled:
            assert enforcer.settle(decisions[i].hold_id, event)
        for v in self.verdicts_after:
            state.apply_verdict(v["counter_key"], VERDICT.decode(VERDICT.encode(v)))
        try:
            ctx = Context.from_mapping(self.ctx)
        except InvalidContext as exc:
            return {"invalid_context": exc.field}
        decision = enforcer.peek(ctx)
        answer = decision.to_json(counters=True)
        answer["counters"] = [{k: c[k] for k in COUNTER_FIELDS} for c in answer["counters"]]
        refused = decision.refusal_event(gateway_id="node", event_id="refused")
        answer["refusal_event"] = None if refused is None else as_json(dict(refused))
        return answer

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "applied_at_us": to_micros(self.applied_at),
            "checked_at_us": to_micros(self.checked_at),
            "ready": self.ready,
            "fresh_at_us": None if self.fresh_at is None else to_micros(self.fresh_at),
            "config": {CONFIG_NAMES[k]: v for k, v in self.config.items()},
            "prices": [[t.version, PRICE_TABLE.encode(t.to_record()).hex()] for t in self.prices],
            "policies": [[b.budget_id, policy_bytes(b).hex()] for b in self.policies],
            "raises": [[r.raise_id, BUDGET_RAISE.encode(r.to_record()).hex()] for r in self.raises],
            "verdicts": [[v["counter_key"], VERDICT.encode(v).hex()] for v in self.verdicts],
            "before": self.before,
            "settled": [[i, as_json(dict(event))] for i, event in self.settled],
            "verdicts_after": [
                [v["counter_key"], VERDICT.encode(v).hex()] for v in self.verdicts_after
            ],
            "ctx": self.ctx,
            "expected": self.expected(),
        }


class Clock:
    """The enforcer's clock, set by the case (seconds since the epoch)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> float:
        return to_micros(self.at) / 1_000_000


def usage_event(fields: Mapping[str, Any]) -> UsageEvent:
    """A request's usage event (the case's fields over a plain one at NOW)."""
    base: dict[str, Any] = {
        "event_id": "settled",
        "provider": "anthropic",
        "api": "anthropic-messages",
        "model": "claude-sonnet-4-5",
        "secret_id": "sk-1",
        "org_id": "acme",
        "gateway_id": "node",
        "input_tokens": 1000,
        "output_tokens": 100,
        "occurred_at": NOW,
    }
    return new_usage_event(**(base | dict(fields)))


def policy_bytes(b: Budget) -> bytes:
    return BUDGET_POLICY.encode(b.to_record(NOW))


def check_cases() -> list[Case]:
    tokens = one({"id": "org-tokens", "scope": "org", "window": "month", "limit_tokens": 10_000})
    requests = one({"id": "org-requests", "scope": "org", "window": "day", "limit_requests": 10})
    alerting = one(
        {
            "id": "secret-tokens",
            "scope": "secret",
            "window": "week",
            "limit_tokens": 100_000,
            "alert_at": [0.5, 0.9],
        }
    )
    usd = one({"id": "org-usd", "scope": "org", "window": "month", "limit_usd": "5"})
    eighths = one({"id": "eighths", "scope": "org", "window": "month", "limit_tokens": 800})
    free = one(
        {
            "id": "free-unpriced",
            "scope": "org",
            "window": "month",
            "limit_usd": "5",
            "unpriced": "allow_free",
        }
    )
    warn = one(
        {"id": "warn-usd", "scope": "org", "window": "total", "limit_usd": "1", "action": "warn"}
    )
    daily = one({"id": "daily-tokens", "scope": "org", "window": "day", "limit_tokens": 5_000})
    new_york = one(
        {
            "id": "ny-daily",
            "scope": "org",
            "window": "day",
            "limit_tokens": 5_000,
            "timezone": "America/New_York",
        }
    )
    sunday_weeks = one(
        {
            "id": "sun-weeks",
            "scope": "org",
            "window": "week",
            "limit_tokens": 5_000,
            "week_start": "sunday",
            "timezone": "Asia/Kolkata",
        }
    )
    cycle = one(
        {
            "id": "cycle-15",
            "scope": "org",
            "window": "month",
            "limit_requests": 3,
            "month_start_day": 15,
        }
    )
    groups = one({"id": "per-group", "scope": "group", "window": "month", "limit_tokens": 3_000})
    users = one({"id": "per-user", "scope": "user", "window": "total", "limit_requests": 2})
    projects = one(
        {
            "id": "per-project",
            "scope": "project",
            "window": "month",
            "limit_tokens": 4_000,
            "match": {"model": ["claude-sonnet-4-5"]},
        }
    )
    team = one({"id": "per-team", "scope": "tag:team", "window": "month", "limit_tokens": 3_000})
    pinned = one(
        {
            "id": "globex-only",
            "scope": "secret",
            "window": "month",
            "limit_tokens": 1,
            "match": {"org_id": ["globex"]},
        }
    )
    total = one({"id": "lifetime", "scope": "org", "window": "total", "limit_tokens": 2_000})
    odd_id = one({"id": "team; a,b é", "scope": "org", "window": "month", "limit_tokens": 100})
    session = one({"id": "per-job", "scope": "session", "window": "total", "limit_tokens": 1_000})
    rolling = one(
        {"id": "rolling-5h", "scope": "org", "window": "rolling:5h", "limit_tokens": 10_000}
    )
    rolling_usd = one(
        {"id": "rolling-usd", "scope": "secret", "window": "rolling:1h", "limit_usd": "1"}
    )
    #: a 5 h window's buckets by age (375 s each): 6,000 tokens 4 h ago, 4,000 just now
    old_and_new = {38: (0, 6_000, 3), 0: (0, 4_000, 2)}
    rated = one(
        {
            "id": "rated",
            "scope": "org",
            "window": "month",
            "limit_tokens": 1_000_000,
            "rate": {"requests_per_second": 2, "tokens_per_minute": 6_000},
        }
    )
    rate_only = one({"id": "rate-only", "scope": "secret", "rate": {"requests_per_minute": 120}})
    yesterday = NOW - timedelta(days=1)
    late_evening = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)

    def raised(raise_id: str, scope: tuple[str, ...], mode: str, **fields: Any) -> BudgetRaise:
        values: dict[str, Any] = {
            "raise_nanos": None,
            "raise_tokens": None,
            "raise_requests": None,
            "starts_at_us": to_micros(NOW - timedelta(hours=1)),
            "until_us": to_micros(NOW + timedelta(hours=1)),
        } | fields
        return BudgetRaise(
            raise_id=raise_id,
            budget_id="org-tokens",
            scope_values=scope,
            mode=mode,
            reason="launch day",
            **values,
        )

    by_50k = raised("r-by", ("acme",), "by", raise_tokens=50_000)
    to_12k = raised("r-to", (), "to", raise_tokens=12_000)
    revoked = raised("r-revoked", ("acme",), "by", raise_tokens=1, revoked_at_us=to_micros(NOW))
    later = raised("r-later", ("acme",), "to", raise_tokens=99_000, starts_at_us=to_micros(NOW) + 1)
    return [
        Case("no budget: allowed", []),
        Case("tokens: room left", [tokens], [verdict(tokens, ["acme"], spent_tokens=5_000)]),
        Case("tokens: exhausted", [tokens], [verdict(tokens, ["acme"], spent_tokens=10_000)]),
        Case(
            "tokens: worst case too large",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=8_500)],
        ),
        Case(
            "tokens: too large with 3 candidates",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=1_000)],
            candidates=3,
            max_output_tokens=4_000,
        ),
        Case(
            "tokens: too large for a replica's share",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=4_001)],
            config={"replicas": 3},
        ),
        Case(
            "tokens: not even the input fits",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=9_500)],
        ),
        Case(
            "tokens: estimate from request bytes, default max output",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=1_000)],
            ctx={"org_id": "acme", "secret_id": "sk-1", "request_bytes": 3_001},
        ),
        Case("requests: one left", [requests], [verdict(requests, ["acme"], spent_requests=9)]),
        Case("requests: none left", [requests], [verdict(requests, ["acme"], spent_requests=10)]),
        Case(
            "alert threshold passed",
            [alerting],
            [verdict(alerting, ["acme", "sk-1"], spent_tokens=60_000)],
        ),
        Case(
            "a used share half a hundredth of a percent (rounded to even)",
            [eighths],
            [verdict(eighths, ["acme"], spent_tokens=1)],
            max_output_tokens=10,
            input_tokens=10,
        ),
        Case("warn budget past its limit", [warn], [verdict(warn, ["acme"], spent_nanos=2 * USD)]),
        Case("usd: exhausted", [usd, warn], [verdict(usd, ["acme"], spent_nanos=5 * USD)]),
        Case("usd: room left", [usd], [verdict(usd, ["acme"], spent_nanos=USD)]),
        Case(
            "usd: worst case too large",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 10_000_000)],
            max_output_tokens=4_000,
        ),
        Case(
            "usd: too large for a replica's share, beside a token budget",
            [usd, tokens],
            [
                verdict(usd, ["acme"], spent_nanos=5 * USD - 100_000_000),
                verdict(tokens, ["acme"], spent_tokens=4_000),
            ],
            config={"replicas": 4},
            max_output_tokens=2_500,
        ),
        Case(
            "usd: rates the slope guesses wrong",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 3_333_333)],
            model="odd-rates",
            input_tokens=7,
            max_output_tokens=100_000,
        ),
        Case(
            "usd: a worst case half a nano past a whole one (rounded to even)",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 1_000)],
            model="half-nano",
            input_tokens=1,
            max_output_tokens=1_000,
        ),
        Case(
            "usd: the long-context tier prices a long prompt",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=4 * USD)],
            input_tokens=200_001,
            max_output_tokens=30_000,
        ),
        Case(
            "usd: billed units in the worst case",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 40_000_000)],
            units={"web_search": 3, "unknown_unit": 2, "zero": 0},
        ),
        Case(
            "usd: a snapshot and a Bedrock id of a priced model",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 17_999_999)],
            model="us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ),
        Case(
            "usd: another version, not a snapshot, is unpriced",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=USD)],
            model="gpt-4o-mini-realtime",
        ),
        Case(
            "usd: unpriced natively (openai)",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=USD)],
            model="mystery-9",
            provider="openai",
            config={"refusal_style": "native"},
        ),
        Case(
            "usd: unpriced allowed free",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=USD)],
            model="mystery-9",
            config={"unpriced_models": "allow_free"},
        ),
        Case(
            "usd: a budget that lets unpriced models pass free",
            [free],
            [verdict(free, ["acme"], spent_nanos=USD)],
            model="mystery-9",
        ),
        Case(
            "usd: the next price version and its fallback",
            [usd],
            [
                verdict(
                    usd,
                    ["acme"],
                    spent_nanos=5 * USD - 200_000_000,
                    at=datetime(2026, 12, 2, tzinfo=UTC),
                )
            ],
            applied_at=datetime(2026, 12, 2, tzinfo=UTC),
            fresh_at=datetime(2026, 12, 2, tzinfo=UTC),
            model="mystery-9",
            max_output_tokens=100_000,
        ),
        Case(
            "usd: no price version in force",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=USD)],
            prices=[],
        ),
        Case(
            "a verdict of yesterday counts zero today",
            [daily],
            [verdict(daily, ["acme"], spent_tokens=5_000, at=yesterday)],
        ),
        Case(
            "a lower seq is ignored",
            [daily],
            [
                verdict(daily, ["acme"], spent_tokens=5_000, seq=5),
                verdict(daily, ["acme"], spent_tokens=0, seq=4),
            ],
        ),
        Case(
            "a verdict of tomorrow waits, today's is enforced",
            [daily],
            [
                verdict(daily, ["acme"], spent_tokens=100, seq=1, at=late_evening),
                verdict(
                    daily,
                    ["acme"],
                    spent_tokens=5_000,
                    seq=2,
                    at=late_evening + timedelta(seconds=2),
                ),
            ],
            applied_at=late_evening,
            fresh_at=late_evening,
        ),
        Case(
            "the verdict kept ahead takes over at midnight",
            [daily],
            [
                verdict(daily, ["acme"], spent_tokens=100, seq=1, at=late_evening),
                verdict(
                    daily,
                    ["acme"],
                    spent_tokens=5_000,
                    seq=2,
                    at=late_evening + timedelta(seconds=2),
                ),
            ],
            applied_at=late_evening,
            checked_at=late_evening + timedelta(seconds=5),
            fresh_at=late_evening,
        ),
        Case(
            "a local day (New York) is not the UTC day",
            [new_york],
            [
                verdict(
                    new_york,
                    ["acme"],
                    spent_tokens=5_000,
                    at=datetime(2026, 12, 1, 3, 0, tzinfo=UTC),
                )
            ],
            applied_at=datetime(2026, 12, 1, 3, 0, tzinfo=UTC),
            fresh_at=datetime(2026, 12, 1, 3, 0, tzinfo=UTC),
        ),
        Case(
            "a local day across the DST change",
            [new_york],
            [
                verdict(
                    new_york,
                    ["acme"],
                    spent_tokens=4_500,
                    at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
                )
            ],
            applied_at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
            fresh_at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
        ),
        Case(
            "weeks from Sunday in Kolkata",
            [sunday_weeks],
            [verdict(sunday_weeks, ["acme"], spent_tokens=5_000)],
        ),
        Case(
            "a billing cycle from the 15th",
            [cycle],
            [verdict(cycle, ["acme"], spent_requests=3)],
        ),
        Case(
            "groups: the exhausted one refuses",
            [groups],
            [
                verdict(groups, ["acme", "eng"], spent_tokens=100),
                verdict(groups, ["acme", "ml"], spent_tokens=3_000),
            ],
            groups=[" eng ", "ml", "eng"],
        ),
        Case(
            "users are case-insensitive",
            [users],
            [verdict(users, ["acme", "ann@example.com"], spent_requests=2)],
            user_id="  Ann@Example.COM ",
        ),
        Case(
            "a project budget matching the model",
            [projects],
            [verdict(projects, ["acme", "p1"], spent_tokens=3_500)],
            project_id="p1",
        ),
        Case(
            "a project budget another model escapes",
            [projects],
            [verdict(projects, ["acme", "p1"], spent_tokens=3_500)],
            project_id="p1",
            model="gpt-4o",
        ),
        Case(
            "a tag scope",
            [team],
            [verdict(team, ["acme", "search"], spent_tokens=3_000)],
            tags={"team": "search "},
        ),
        Case(
            "a budget pinned to another org",
            [pinned, tokens],
            [verdict(tokens, ["acme"], spent_tokens=100)],
        ),
        Case(
            "pinned to this org",
            [pinned, tokens],
            [verdict(pinned, ["globex", "sk-1"], spent_tokens=1)],
            org_id="globex",
        ),
        Case(
            "the refusal that resets last is reported",
            [total, tokens, daily],
            [
                verdict(daily, ["acme"], spent_tokens=5_000),
                verdict(tokens, ["acme"], spent_tokens=10_000),
                verdict(total, ["acme"], spent_tokens=2_000),
            ],
        ),
        Case(
            "a hard refusal beats a soft one",
            [tokens, daily],
            [
                verdict(tokens, ["acme"], spent_tokens=9_900),
                verdict(daily, ["acme"], spent_tokens=5_000),
            ],
        ),
        Case(
            "an id that needs quoting in a header",
            [odd_id],
            [verdict(odd_id, ["école-42"], spent_tokens=100)],
            org_id="école-42",
        ),
        *[
            Case(
                f"native refusal: {provider}",
                [tokens],
                [verdict(tokens, ["acme"], spent_tokens=10_000)],
                config={"refusal_style": "native"},
                provider=provider,
            )
            for provider in ("anthropic", "OpenAI", "vertex", "bedrock", "someone-else")
        ],
        Case(
            "seed000 refusal",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD + 1)],
            config={"refusal_style": "seed000"},
        ),
        Case("not loaded: fail open", [], ready=False, fresh_at=None),
        Case(
            "not loaded: fail closed",
            [],
            ready=False,
            fresh_at=None,
            config={"fail_mode": "closed"},
        ),
        Case(
            "stale verdicts: fail closed on an enforce budget",
            [tokens, warn],
            [verdict(tokens, ["acme"], spent_tokens=10)],
            fresh_at=NOW - timedelta(seconds=901),
            config={"fail_mode": "closed"},
        ),
        Case(
            "stale verdicts: fail closed natively",
            [tokens],
            fresh_at=NOW - timedelta(seconds=61),
            config={"fail_mode": "closed", "grace_s": 60, "refusal_style": "native"},
            provider="gemini",
        ),
        Case(
            "stale verdicts: warn budgets are checked anyway",
            [warn],
            [verdict(warn, ["acme"], spent_nanos=2 * USD)],
            fresh_at=NOW - timedelta(seconds=901),
            config={"fail_mode": "closed"},
        ),
        Case("invalid: a blank org", [], ctx={"org_id": "  ", "secret_id": "sk-1"}),
        Case("invalid: an unknown field", [], ctx={"org_id": "a", "secret_id": "s", "x": 1}),
        Case("invalid: groups not a list", [], groups="eng"),
        Case("invalid: a negative count", [], input_tokens=-1),
        Case("invalid: too many candidates", [], candidates=129),
        Case("invalid: a unit name", [], units={"Web": 1}),
        Case("invalid: a unit count", [], units={"web_search": -1}),
        Case(
            "sessions: a job's budget exhausted",
            [session],
            [verdict(session, ["acme", "sk-1", "job-1"], spent_tokens=1_000)],
            session_id="job-1",
        ),
        Case(
            "sessions: a job's worst case too large, per user",
            [session, tokens],
            [verdict(session, ["acme", "ann", "job-1"], spent_tokens=500)],
            session_id=" job-1",
            user_id="Ann",
            max_output_tokens=400,
        ),
        Case(
            "sessions: a new id past the key's bound",
            [session],
            session_id="job-3",
            before=[{"session_id": "job-1"}, {"session_id": "job-2"}, {"session_id": "job-1"}],
            config={"max_sessions_per_key": 2},
            max_output_tokens=10,
            input_tokens=10,
        ),
        Case(
            "sessions: an id the key opened passes",
            [session],
            session_id="job-2",
            before=[{"session_id": "job-1"}, {"session_id": "job-2"}],
            config={"max_sessions_per_key": 2},
            max_output_tokens=10,
            input_tokens=10,
        ),
        Case(
            "sessions: another key has its own bound",
            [session],
            secret_id="sk-2",
            session_id="job-3",
            before=[{"session_id": "job-1"}, {"session_id": "job-2"}],
            config={"max_sessions_per_key": 2},
            max_output_tokens=10,
            input_tokens=10,
        ),
        Case(
            "rolling: exhausted, reopens as its old buckets leave",
            [rolling],
            [verdict(rolling, ["acme"], buckets=old_and_new)],
        ),
        Case(
            "rolling: the old buckets left by the check's clock",
            [rolling],
            [verdict(rolling, ["acme"], buckets=old_and_new)],
            checked_at=NOW + timedelta(hours=2),
            fresh_at=NOW + timedelta(hours=2),
        ),
        Case(
            "rolling: a request no wait lets fit",
            [rolling],
            [verdict(rolling, ["acme"], buckets={0: (0, 1_000, 1)})],
            max_output_tokens=9_500,
        ),
        Case(
            "rolling: a v2 verdict without buckets",
            [rolling],
            [verdict(rolling, ["acme"], spent_tokens=9_000)],
            checked_at=NOW + timedelta(minutes=10),
            fresh_at=NOW + timedelta(minutes=10),
        ),
        Case(
            "rolling: USD, too large until enough has left",
            [rolling_usd],
            [
                verdict(
                    rolling_usd,
                    ["acme", "sk-1"],
                    buckets={40: (600_000_000, 0, 9), 12: (390_000_000, 0, 1)},
                )
            ],
        ),
        Case(
            "holds: requests in flight keep one out",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=5_000)],
            before=[{}, {}],
        ),
        Case(
            "holds: in flight on a USD budget, a replica's share",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 60_000_000)],
            before=[{}],
            config={"replicas": 2},
        ),
        Case(
            "holds: a settled hold counts its actual cost",
            [usd, tokens],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 40_000_000, seq=3)],
            before=[{}, {}],
            settled=[(0, {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 3_000})],
        ),
        Case(
            "holds: a verdict with the settled event drops its hold",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 40_000_000, seq=3)],
            before=[{}, {}],
            settled=[(0, {"input_tokens": 10, "output_tokens": 5})],
            verdicts_after=[
                verdict(
                    usd,
                    ["acme"],
                    spent_nanos=5 * USD - 40_000_000 + 105_000,
                    seq=4,
                    at=NOW + timedelta(seconds=1),
                )
            ],
        ),
        Case(
            "holds: a verdict older than the event keeps it held",
            [usd],
            [verdict(usd, ["acme"], spent_nanos=5 * USD - 40_000_000, seq=3)],
            before=[{}, {}],
            settled=[(0, {"input_tokens": 10, "output_tokens": 5})],
            verdicts_after=[
                verdict(
                    usd,
                    ["acme"],
                    spent_nanos=5 * USD - 39_000_000,
                    seq=4,
                    at=NOW - timedelta(seconds=1),
                )
            ],
        ),
        Case(
            "holds: a refused usage event holds no request",
            [requests],
            [verdict(requests, ["acme"], spent_requests=9)],
            before=[{}],
            settled=[(0, {"outcome": "refused", "input_tokens": 0, "output_tokens": 0})],
        ),
        Case("rates: the first request passes", [rated, rate_only]),
        Case(
            "rates: the tokens of the first left the bucket in debt",
            [rated],
            before=[{}],
        ),
        Case(
            "rates: two requests a second, a third waits",
            [rated],
            before=[{"input_tokens": 1, "max_output_tokens": 1}] * 2,
            input_tokens=1,
            max_output_tokens=1,
        ),
        Case(
            "rates: a replica's share, throttled natively (openai)",
            [rate_only],
            before=[{}, {}],
            config={"replicas": 60, "refusal_style": "native"},
            provider="openai",
        ),
        Case(
            "rates: throttled natively (anthropic)",
            [rate_only],
            before=[{}, {}],
            config={"replicas": 60, "refusal_style": "native"},
        ),
        Case(
            "rates: a budget refusal takes no rate",
            [rated, tokens],
            [verdict(tokens, ["acme"], spent_tokens=10_000)],
            before=[{}],
        ),
        Case(
            "raises: a raise of the counter lifts its limit",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=10_000)],
            raises=[by_50k, to_12k],
        ),
        Case(
            "raises: a raise of every counter, the revoked and the later one aside",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=10_000)],
            raises=[to_12k, revoked, later],
        ),
        Case(
            "raises: exhausted even raised",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=12_000)],
            raises=[to_12k],
        ),
        Case(
            "raises: a revoked raise and one not begun give nothing",
            [tokens],
            [verdict(tokens, ["acme"], spent_tokens=10_000)],
            raises=[revoked, later],
        ),
        Case(
            "raises: failing closed shows the raised limits",
            [tokens],
            raises=[by_50k],
            ready=False,
            fresh_at=None,
            config={"fail_mode": "closed"},
        ),
    ]


def encoding_cases() -> list[dict[str, Any]]:
    """UsageEvents with the key and value the Python publisher writes for them."""
    out = []
    for event in encoding_events():
        fields = dict(event)
        fields["occurred_at"] = to_micros(event["occurred_at"])
        key = usage_raw_key(event["org_id"])
        out.append(
            {
                "event": fields,
                "key_hex": key.hex(),
                "value_hex": USAGE_EVENT.encode(event).hex(),
                "partition_of_4": partition_index(key, 4),
                "partition_of_12": partition_index(key, 12),
            }
        )
    return out


def encoding_events() -> list[UsageEvent]:
    at = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
    return [
        new_usage_event(
            event_id="0193b4d2-0000-7000-8000-000000000001",
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id="sk-1",
            org_id=" Acme ",
            gateway_id="node",
            input_tokens=1_000,
            output_tokens=250,
            occurred_at=at,
        ),
        new_usage_event(
            event_id="evt-2",
            provider="openai",
            api="openai-chat",
            model="gpt-4o-mini",
            secret_id="sk-2",
            org_id="école-42",
            gateway_id="node",
            input_tokens=12,
            output_tokens=7,
            reasoning_tokens=3,
            cache_read_tokens=40,
            cache_write_tokens=9,
            cache_write_1h_tokens=4,
            occurred_at=at,
            project_id="p1",
            user_id="ann@example.com",
            groups=["eng", "ml"],
            session_id="job-9",
            tags={"team": "search", "env": "prod"},
            usage_source="estimated",
            estimate_reason="stream_cut",
            status_code=499,
            stream=True,
            request_id="req-1",
            latency_ms=321,
            units={"web_search": 2},
            service_tier="priority",
        ),
        new_usage_event(
            event_id="evt-3",
            provider="gemini",
            api="gemini",
            model="gemini-2.5-pro",
            secret_id="sk-3",
            org_id="globex",
            gateway_id="node",
            input_tokens=0,
            output_tokens=0,
            occurred_at=at,
            outcome="refused",
            decision="budget_exceeded",
            decision_budget_id="org-usd",
            status_code=402,
        ),
    ]


#: the schemas the Node client reads and writes
SCHEMA_NAMES = (
    "UsageEvent",
    "Verdict",
    "BudgetPolicy",
    "BudgetRaise",
    "GenerationSwitch",
    "PriceTable",
)


def released_version_cases() -> list[dict[str, Any]]:
    """A record of each released version of each schema (written as a producer built on
    that version writes it) and what the Python codec reads it as, in the current schema."""
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    (policy,) = budgets_from_yaml(
        [{"id": "b", "scope": "org", "window": "week", "limit_usd": "2", "alert_at": [0.5]}]
    )
    (daily,) = budgets_from_yaml([{"id": "d", "scope": "org", "window": "day", "limit_tokens": 9}])
    current: dict[str, dict[str, Any]] = {
        "UsageEvent": dict(encoding_events()[1]),
        "Verdict": dict(verdict(daily, ["acme"], spent_tokens=5, at=at)),
        "BudgetPolicy": policy.to_record(at),
        "BudgetRaise": {
            "raise_id": "r",
            "budget_id": "b",
            "scope_values": ["acme"],
            "mode": "by",
            "raise_nanos": 5,
            "raise_tokens": None,
            "raise_requests": None,
            "starts_at": at,
            "until": at + timedelta(days=1),
            "reason": "why",
            "created_by": "ops",
            "revoked_at": None,
        },
        "GenerationSwitch": {
            "generation": "g2",
            "previous": "",
            "previous_retired": False,
            "switched_at": at,
        },
        "PriceTable": price_tables()[0].to_record(),
    }
    out = []
    for name in SCHEMA_NAMES:
        codec = codec_for(name)
        for number, schema in enumerate(history_versions(name), start=1):
            header = b"\xc3\x01" + fingerprint(schema)
            if header == codec.encode(current[name])[:10]:
                continue  # the current version: the other cases read it
            body = io.BytesIO()
            schemaless_writer(body, parse_schema(schema), current[name])
            value = header + body.getvalue()
            out.append(
                {
                    "name": name,
                    "version": number,
                    "value_hex": value.hex(),
                    "decoded": as_json(codec.decode(value)),
                }
            )
    return out


def as_json(value: Any) -> Any:
    """A decoded record as the Node client reads it: times in µs since the epoch."""
    if isinstance(value, datetime):
        return to_micros(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def table() -> dict[str, Any]:
    names = SCHEMA_NAMES
    return {
        "comment": "generated by `python -m tests.clients.node_cases` from the Python enforcer "
        "and codec: do not edit",
        "fingerprints": {n: fingerprint(codec_for(n).schema).hex() for n in names},
        "events": encoding_cases(),
        "released_versions": released_version_cases(),
        "checks": [case.to_json() for case in check_cases()],
    }


def table_text() -> str:
    return json.dumps(table(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    CASES_PATH.write_text(table_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {CASES_PATH}\n")

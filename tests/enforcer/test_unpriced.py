"""Models without a price under an enforce USD budget: refused unless a policy says $0."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.budgets import budget_from_yaml
from schemas.errors import ConfigError
from tests.enforcer.kit import budget, ctx, loaded_enforcer

UNKNOWN = "acme-internal-llm-v3"
USD_BUDGET = budget("org-monthly", limit_usd=100)


def test_a_model_without_a_price_is_refused_under_an_enforce_usd_budget() -> None:
    e, _ = loaded_enforcer([USD_BUDGET])
    d = e.check(ctx(model=UNKNOWN))
    assert not d.allowed and d.hold_id is None
    assert d.decision == "budget_exceeded" and d.budget_id == "org-monthly"
    assert d.status == 402 and d.body is not None
    assert d.body["reason"] == "model_unpriced" and d.body["model"] == UNKNOWN
    assert UNKNOWN in d.body["message"]
    assert ("x-should-retry", "false") in d.headers
    assert all(name != "Retry-After" for name, _ in d.headers)
    assert d.counters[0].state == "unpriced"
    event = d.refusal_event()
    assert event is not None and event["model"] == UNKNOWN and event["outcome"] == "refused"
    # a priced model still passes, and the metric names the refusal
    assert e.check(ctx()).allowed
    assert b'budget="org-monthly",outcome="unpriced"} 1.0' in e.metrics.render()


def test_a_request_naming_no_model_cannot_be_priced_either() -> None:
    e, _ = loaded_enforcer([USD_BUDGET])
    assert e.check(ctx(model=None)).body["reason"] == "model_unpriced"  # type: ignore[index]  # a refusal has a body


def test_allow_free_per_budget_or_globally_admits_it_at_zero() -> None:
    free = replace(USD_BUDGET, unpriced="allow_free")
    e, _ = loaded_enforcer([free])
    d = e.check(ctx(model=UNKNOWN))
    assert d.allowed
    e, _ = loaded_enforcer([USD_BUDGET], unpriced_models="allow_free")
    assert e.check(ctx(model=UNKNOWN)).allowed
    # a budget's own refuse wins over a permissive default
    strict = replace(USD_BUDGET, unpriced="refuse")
    e, _ = loaded_enforcer([strict], unpriced_models="allow_free")
    assert not e.check(ctx(model=UNKNOWN)).allowed


def test_budgets_that_price_nothing_do_not_refuse_unpriced_models() -> None:
    tokens = budget("tokens", limit_tokens=1_000_000)
    warn = budget("warn-usd", limit_usd=1, action="warn")
    e, _ = loaded_enforcer([tokens, warn])
    assert e.check(ctx(model=UNKNOWN)).allowed


@pytest.mark.parametrize(
    ("provider", "status", "fragment"),
    [
        ("anthropic", 400, b'"invalid_request_error"'),
        ("openai", 400, b'"model_unpriced"'),
        ("gemini", 400, b'"INVALID_ARGUMENT"'),
        ("bedrock", 400, b'"message"'),
    ],
)
def test_native_style_answers_the_sdks_bad_request(
    provider: str, status: int, fragment: bytes
) -> None:
    import json

    e, _ = loaded_enforcer([USD_BUDGET], refusal_style="native")
    d = e.check(ctx(model=UNKNOWN, provider=provider))
    assert d.status == status
    assert fragment in json.dumps(d.body).encode()


def test_the_policy_travels_on_the_budget_yaml_and_record() -> None:
    from schemas.budgets import Budget
    from schemas.codec import BUDGET_POLICY

    b = budget_from_yaml({"id": "b", "scope": "org", "limit_usd": "5", "unpriced": "allow_free"})
    assert b.unpriced == "allow_free"
    assert Budget.from_record(BUDGET_POLICY.decode(BUDGET_POLICY.encode(b.to_record()))) == b
    with pytest.raises(ConfigError, match=r"field 'unpriced': .*refuse, allow_free"):
        budget_from_yaml({"id": "b", "scope": "org", "limit_usd": "5", "unpriced": "free"})
    with pytest.raises(ConfigError, match=r"unpriced: only an enforce budget with limit_usd"):
        budget_from_yaml({"id": "b", "scope": "org", "limit_tokens": 5, "unpriced": "refuse"})

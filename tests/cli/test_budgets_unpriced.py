"""`spendbus budgets apply` warns about every model a USD budget would see without a price."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.budgets import budget_from_yaml
from schemas.pricing import ModelPrice, PriceBook, PriceTable
from spendbus.commands.budgets import unpriced_warnings

NOW = datetime(2026, 11, 30, tzinfo=UTC)
BOOK = PriceBook(
    [
        PriceTable(
            version="v1",
            effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            models=(ModelPrice.of("gpt-4o", "2.5", "10"),),
        )
    ]
)


def test_every_routed_model_without_a_price_is_named_not_only_match_models() -> None:
    org = budget_from_yaml({"id": "org", "scope": "org", "limit_usd": "100"})
    pinned = budget_from_yaml(
        {"id": "pinned", "scope": "org", "limit_usd": "5", "match": {"model": "gpt-4o"}}
    )
    free = budget_from_yaml(
        {"id": "free", "scope": "org", "limit_usd": "5", "unpriced": "allow_free"}
    )
    tokens = budget_from_yaml({"id": "tokens", "scope": "org", "limit_tokens": 5})
    warnings = unpriced_warnings(
        BOOK, [org, pinned, free, tokens], ["gpt-4o", "acme-llm", "gpt-4o"], NOW
    )
    assert warnings == [
        "budget 'org': limit_usd, and model 'acme-llm' (routed) has no price in the applied "
        "price versions: its requests are refused (the enforcer's default unpriced_models: "
        "refuse, unless configured allow_free: then charged $0)",
        "budget 'free': limit_usd, and model 'acme-llm' (routed) has no price in the applied "
        "price versions: admitted and charged $0 (unpriced: allow_free)",
    ]


def test_a_match_naming_an_unpriced_model_is_still_warned_about() -> None:
    pinned = budget_from_yaml(
        {"id": "p", "scope": "org", "limit_usd": "5", "match": {"model": "mystery"}}
    )
    (warning,) = unpriced_warnings(BOOK, [pinned], [], NOW)
    assert "model 'mystery' (named by its match)" in warning

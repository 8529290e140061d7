"""`spendbus budgets list` shows a budget's rate beside its limits."""

from __future__ import annotations

from schemas.budgets import budget_from_yaml
from spendbus.commands.budgets import _budget_json, _rate


def test_the_rate_column_and_the_json() -> None:
    b = budget_from_yaml(
        {
            "id": "r",
            "scope": "secret",
            "rate": {"requests_per_minute": 600, "tokens_per_second": 2000},
        }
    )
    assert _rate(b) == "600 req/min, 2,000 tok/s"
    assert _budget_json(b)["rate"] == {
        "requests_per_second": None,
        "requests_per_minute": 600,
        "tokens_per_second": 2000,
        "tokens_per_minute": None,
    }
    assert _rate(budget_from_yaml({"id": "n", "scope": "org", "limit_requests": 3})) == ""

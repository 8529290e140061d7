"""``fallback: {model: NAME}``: models nothing matches are charged what NAME costs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from schemas.errors import ConfigError
from schemas.pricing import FALLBACK_MATCH, PriceBook, PriceTable, price_table_from_yaml

AT = datetime(2026, 11, 30, tzinfo=UTC)
DOC = {
    "version": "2026-11-01",
    "effective_from": "2026-11-01",
    "models": [
        {"match": "claude-opus-4", "input_per_mtok": "15", "output_per_mtok": "75"},
        {"match": "gpt-4o-mini", "input_per_mtok": "0.15", "output_per_mtok": "0.6"},
    ],
}


def test_a_named_fallback_prices_unknown_models_as_that_model() -> None:
    table = price_table_from_yaml(
        {**DOC, "fallback": {"model": "claude-opus-4-20250514"}}, source="p"
    )
    assert isinstance(table, PriceTable) and table.fallback is not None
    book = PriceBook([table])
    unknown = book.price("acme-internal-llm", at=AT, input_tokens=1000, output_tokens=1000)
    opus = book.price("claude-opus-4-20250514", at=AT, input_tokens=1000, output_tokens=1000)
    assert not unknown.unpriced and unknown.matched == FALLBACK_MATCH
    assert unknown.cost_nanos == opus.cost_nanos == 90_000_000
    assert book.unpriced_models(["acme-internal-llm"], AT) == []
    # the record carries the prices themselves: a reader needs no name resolution
    again = PriceTable.from_record(table.to_record())
    assert again.fallback is not None and again.fallback.output_per_mtok == 75


def test_a_named_fallback_must_be_priced_by_its_version() -> None:
    with pytest.raises(ConfigError, match=r"fallback: field 'model': 'mystery' has no price"):
        price_table_from_yaml({**DOC, "fallback": {"model": "mystery"}}, source="p")

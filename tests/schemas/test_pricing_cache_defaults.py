"""The cache prices an entry gets when it names none: 0.1x input for reads, 1.25x for
5-minute writes, 2x for 1-hour writes (schemas/pricing/model_price.py). A kept
difference from seed 003, whose ADR defaults them to the input price: providers bill
cache reads at a tenth of input and writes above it (Anthropic: 0.1x, 1.25x, 2x), so the
ADR's default would charge a cached prompt up to ten times what it costs and a cache
write less (docs/design.md, "Where spendbus differs from the seeds")."""

from __future__ import annotations

from decimal import Decimal

from schemas.pricing.model_price import ModelPrice


def test_cache_prices_default_to_a_tenth_and_five_quarters_and_twice_the_input() -> None:
    price = ModelPrice.of("m", "3", "15")
    assert price.cache_read_per_mtok == Decimal("0.3")
    assert price.cache_write_per_mtok == Decimal("3.75")
    assert price.cache_write_1h_per_mtok == Decimal("6")
    # not the ADR's default (the input price)
    assert price.cache_read_per_mtok != price.input_per_mtok


def test_a_cache_price_given_is_kept() -> None:
    price = ModelPrice.of("m", "3", "15", cache_read_per_mtok="3", cache_write_per_mtok="3")
    assert (price.cache_read_per_mtok, price.cache_write_per_mtok) == (Decimal(3), Decimal(3))
    assert price.cache_write_1h_per_mtok == Decimal("6")

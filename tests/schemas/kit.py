"""What the pricing tests share: a Sonnet-like price with a long-context tier, one-table
books, and the cost of a call at a price."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import TypedDict, Unpack

from schemas.pricing import (
    LongContextTier,
    ModelPrice,
    PriceBook,
    PriceTable,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

SONNET = ModelPrice.of(
    "claude-sonnet-4-5",
    "3.00",
    "15.00",
    long_context=LongContextTier(200_000, Decimal("6.00"), Decimal("22.50")),
)


def table(
    *models: ModelPrice, version: str = "v1", at: datetime = T0, fallback: ModelPrice | None = None
) -> PriceTable:
    return PriceTable(version=version, effective_from=at, models=models, fallback=fallback)


def book(*models: ModelPrice, fallback: ModelPrice | None = None) -> PriceBook:
    return PriceBook([table(*models, fallback=fallback)])


class Tokens(TypedDict, total=False):
    """The token counts ``PriceBook.price`` takes."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int


def cost(price: ModelPrice, **tokens: Unpack[Tokens]) -> int:
    return (
        book(price)
        .price("claude-sonnet-4-5-20250929" if price is SONNET else price.match, at=AT, **tokens)
        .cost_nanos
    )

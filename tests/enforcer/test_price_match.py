"""The enforcer's pre-call estimate matches a model as the aggregator charges it (issue 36).

Both go through ``PriceTable.resolve`` (schemas/pricing): a snapshot of a priced model is
held at that model's price, a different version is unpriced before the call (the
budget's unpriced policy refuses it) as it is after, and a model a new price version
prices is held at what the aggregator will charge for it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.pricing import ModelPrice, PriceBook, PriceTable
from tests.enforcer.kit import PRICES, budget, ctx, loaded_enforcer, price_record

USD_BUDGET = budget("org-monthly", limit_usd=100)


def charged(book: PriceBook, model: str, at: datetime) -> tuple[bool, int]:
    """(unpriced, cost) as the aggregator prices the call the estimate holds."""
    price = book.price(model, at=at, input_tokens=1000, output_tokens=1000)
    return price.unpriced, price.cost_nanos


def test_the_estimate_and_the_charge_use_the_same_match() -> None:
    e, clock = loaded_enforcer([USD_BUDGET])
    book = PriceBook([PRICES])
    now = datetime.fromtimestamp(clock(), UTC)
    for model, unpriced in (
        ("claude-sonnet-4-5", False),
        ("claude-sonnet-4-5-20250929", False),  # a snapshot: Sonnet 4.5's price
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", False),
        ("gpt-4o-2024-08-06", False),
        ("claude-sonnet-4-6", True),  # another version: never 4.5's price
        ("gpt-4o-mini", True),  # another model: never gpt-4o's price
    ):
        assert charged(book, model, now)[0] is unpriced, model
        d = e.check(ctx(model=model))
        if unpriced:
            assert not d.allowed and d.body is not None, model
            assert d.body["reason"] == "model_unpriced", model
        else:
            assert d.allowed, model
            [row] = [r for r in e.usage(ctx(model=model)) if r.budget_id == "org-monthly"]
            assert row.held_nanos == charged(book, model, now)[1], model
            assert d.hold_id is not None
            e.release(d.hold_id)


def test_a_newly_priced_model_is_held_at_what_it_will_be_charged() -> None:
    e, clock = loaded_enforcer([USD_BUDGET])
    assert not e.check(ctx(model="gpt-4o-mini-2024-07-18")).allowed  # unpriced for now
    newer = PriceTable(
        version="2026-06-01",
        effective_from=PRICES.effective_from,
        models=(*PRICES.models, ModelPrice.of("gpt-4o-mini", "0.15", "0.60")),
    )
    e.state.apply_price(newer.version, price_record(newer))
    d = e.check(ctx(model="gpt-4o-mini-2024-07-18"))
    assert d.allowed
    [row] = e.usage(ctx(model="gpt-4o-mini-2024-07-18"))
    book = PriceBook([PRICES, newer])
    now = datetime.fromtimestamp(clock(), UTC)
    # 1000 x 150 + 1000 x 600: what the aggregator charges the same tokens
    assert row.held_nanos == charged(book, "gpt-4o-mini-2024-07-18", now)[1] == 750_000

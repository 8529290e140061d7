"""The worst case holds the billed units a request can cost at most (a server tool's
max_uses...), priced at the entry's unit prices; settle prices an event's units and tier."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from enforcer import Context, Enforcer
from enforcer.errors import InvalidContext
from schemas.pricing import LongContextTier, ModelPrice, PriceBook, PriceTable
from tests.enforcer.kit import MODEL, budget, ctx, loaded_enforcer, price_record, verdict

#: $3 / $15 per Mtok, web search $0.01; 1000 + 1000 tokens: 18_000_000 nanos
UNIT_PRICES = PriceTable(
    version="2026-02-01-units",
    effective_from=datetime(2026, 2, 1, tzinfo=UTC),
    models=(
        ModelPrice.of(
            "claude-sonnet-4-5",
            "3",
            "15",
            unit_prices={"web_search": "0.01"},
            service_tiers={"batch": "0.5"},
        ),
    ),
)
TOKENS = 18_000_000
SEARCH = 10_000_000


def enforcer_with_units(limit_nanos: int, spent_nanos: int = 0) -> Enforcer:
    org = budget("org", limit_nanos=limit_nanos)
    e, _ = loaded_enforcer([org], [verdict(org, ["acme"], spent_nanos=spent_nanos)])
    e.state.apply_price(UNIT_PRICES.version, price_record(UNIT_PRICES))
    return e


def test_the_hold_includes_the_units_the_request_can_cost() -> None:
    e = enforcer_with_units(10**12)
    d = e.check(ctx(units={"web_search": 5}))
    assert d.allowed
    [row] = e.usage(ctx())
    assert row.held_nanos == TOKENS + 5 * SEARCH
    # a unit the entry does not price adds nothing; no units: the tokens only
    e = enforcer_with_units(10**12)
    assert e.check(ctx(units={"web_fetch": 9})).allowed
    assert e.check(ctx()).allowed
    [row] = e.usage(ctx())
    assert row.held_nanos == 2 * TOKENS


def test_a_request_whose_units_do_not_fit_is_too_large_with_what_fits() -> None:
    """60M nanos left: the tokens (18M) fit, with five searches (68M) they do not; the
    answer's max_tokens_that_fits counts the searches too: (60M - 3M - 50M) / 15k."""
    e = enforcer_with_units(60_000_000)
    assert e.peek(ctx()).allowed
    d = e.check(ctx(units={"web_search": 5}))
    assert not d.allowed
    assert d.body is not None and d.body["reason"] == "request_too_large"
    assert d.body["request_nanos"] == TOKENS + 5 * SEARCH
    assert d.body["max_tokens_that_fits"] == 466
    assert e.peek(ctx(units={"web_search": 5}, max_output_tokens=466)).allowed
    assert not e.peek(ctx(units={"web_search": 5}, max_output_tokens=467)).allowed


def test_settle_prices_the_events_units_and_tier() -> None:
    e = enforcer_with_units(10**12)
    d = e.check(ctx(units={"web_search": 5}))
    event = {
        "model": MODEL,
        "occurred_at": datetime.fromtimestamp(e.clock(), UTC),
        "input_tokens": 1000,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "output_tokens": 1000,
        "units": {"web_search": 2},
        "service_tier": "batch",
        "outcome": "allowed",
    }
    assert e.settle(d.hold_id, event)
    [row] = e.usage(ctx())
    assert row.held_nanos == TOKENS // 2 + 2 * SEARCH


@pytest.mark.parametrize(
    ("units", "says"),
    [
        ({"Web": 1}, "'Web' is not a unit name"),
        ({"web_search": -1}, "web_search: an integer"),
        ({"web_search": True}, "web_search: an integer"),
        ("web_search", "a map of unit name to count"),
        (7, "a map of unit name to count"),
        ({f"u{i}": 1 for i in range(33)}, "more than 32 units"),
    ],
)
def test_bad_units_in_a_context_name_the_field(units: object, says: str) -> None:
    with pytest.raises(InvalidContext) as raised:
        ctx(units=units)
    assert raised.value.field == "units" and says in str(raised.value)


def test_units_come_from_json_and_zero_counts_are_dropped() -> None:
    c = Context.from_mapping(
        {"org_id": "acme", "secret_id": "sk-1", "units": {"web_search": 3, "web_fetch": 0}}
    )
    assert c.units == {"web_search": 3}
    assert c.to_json()["units"] == {"web_search": 3}
    assert Context(org_id="acme", secret_id="sk-1", units={}).units is None


#: OpenAI's batch cached input at its published $0.13 / M, not half of $0.25, and $0.25
#: above the 272k edge, not twice $0.13 (PriceTable v3)
CLASS_RATES = PriceTable(
    version="2026-02-01-class-rates",
    effective_from=datetime(2026, 2, 1, tzinfo=UTC),
    models=(
        ModelPrice.of(
            "claude-sonnet-4-5",
            "2.50",
            "15",
            cache_read_per_mtok="0.25",
            long_context=LongContextTier(272_000, Decimal("5"), Decimal("22.5")),
            service_tiers={"batch": "0.5"},
            service_tier_rates={
                "batch": {
                    "cache_read_per_mtok": "0.13",
                    "long_context_cache_read_per_mtok": "0.25",
                }
            },
        ),
    ),
)


@pytest.mark.parametrize(
    ("tier", "read", "expected"),
    [
        # 1000 x $1.25/M + 200k x $0.13/M + 1000 x $7.50/M: batch, below the edge
        ("batch", 200_000, 1_250_000 + 26_000_000 + 7_500_000),
        # above it: input and output at half the long-context prices, cached input $0.25/M
        ("batch", 1_000_000, 2_500_000 + 250_000_000 + 11_250_000),
        (None, 200_000, 2_500_000 + 50_000_000 + 15_000_000),
        (None, 1_000_000, 5_000_000 + 500_000_000 + 22_500_000),
    ],
)
def test_settle_charges_a_tiers_class_rate_as_the_aggregator_does(
    tier: str | None, read: int, expected: int
) -> None:
    """The enforcer's settle (PriceBook.price over the record it read) and the counting
    stage (PriceBook.price_event) charge one event the same, class rate included, on
    either side of the long-context edge."""
    org = budget("org", limit_nanos=10**12)
    e, _ = loaded_enforcer([org], [verdict(org, ["acme"])])
    e.state.apply_price(CLASS_RATES.version, price_record(CLASS_RATES))
    d = e.check(ctx())
    event = {
        "model": MODEL,
        "occurred_at": datetime.fromtimestamp(e.clock(), UTC),
        "input_tokens": 1000,
        "cache_read_tokens": read,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": 0,
        "output_tokens": 1000,
        "units": None,
        "service_tier": tier,
        "outcome": "allowed",
    }
    assert e.settle(d.hold_id, event)
    [row] = e.usage(ctx())
    aggregator = PriceBook([PriceTable.from_record(price_record(CLASS_RATES))])
    assert row.held_nanos == aggregator.price_event(event).cost_nanos == expected

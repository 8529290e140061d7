"""Versioned pricing: exact costs, long-context tiers, which entry (prefixes, model ids), versions,
pricing events and the worst case.

Golden costs are worked out by hand in the comments. A price of P USD per
million tokens is P x 10^9 / 10^6 = P x 1000 nanos per token.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from schemas.errors import ContractError, InvalidRecord
from schemas.pricing import (
    FALLBACK_MATCH,
    NO_VERSION,
    LongContextTier,
    ModelPrice,
    Price,
    PriceBook,
    model_id_candidates,
)
from schemas.records import UsageEvent
from schemas.usage import new_usage_event
from tests.schemas.kit import AT, SONNET, T0, book, cost, table

# --- golden costs ---------------------------------------------------------------------


def test_every_token_class_at_its_price() -> None:
    # input 1234 x 3000 = 3_702_000; cache reads 10_000 x 300 = 3_000_000;
    # 5-minute writes (2000 - 500) x 3750 = 5_625_000; 1-hour writes 500 x 6000 = 3_000_000;
    # output 567 x 15_000 = 8_505_000; total 23_832_000
    assert (
        cost(
            SONNET,
            input_tokens=1234,
            cache_read_tokens=10_000,
            cache_write_tokens=2000,
            cache_write_1h_tokens=500,
            output_tokens=567,
        )
        == 23_832_000
    )
    # 1000 x 3000 + 500 x 15_000 = 10_500_000
    assert cost(SONNET, input_tokens=1000, output_tokens=500) == 10_500_000


def test_five_minute_and_one_hour_cache_writes() -> None:
    # 1000 five-minute writes at 3.75 = 3_750_000; all 1-hour at 6.00 = 6_000_000;
    # 600 of them 1-hour: 400 x 3750 + 600 x 6000 = 1_500_000 + 3_600_000 = 5_100_000
    assert cost(SONNET, cache_write_tokens=1000) == 3_750_000
    assert cost(SONNET, cache_write_tokens=1000, cache_write_1h_tokens=1000) == 6_000_000
    assert cost(SONNET, cache_write_tokens=1000, cache_write_1h_tokens=600) == 5_100_000
    with pytest.raises(ContractError, match="part of cache_write_tokens"):
        cost(SONNET, cache_write_tokens=1, cache_write_1h_tokens=2)


def test_default_cache_prices_are_ratios_of_input() -> None:
    price = ModelPrice.of("m", "0.25", "1.25")
    assert price.cache_read_per_mtok == Decimal("0.025")  # 0.1 x
    assert price.cache_write_per_mtok == Decimal("0.3125")  # 1.25 x
    assert price.cache_write_1h_per_mtok == Decimal("0.50")  # 2 x
    # 0.3125 x 1000 = 312.5 nanos per 5-minute write: 2 writes = 625 exactly
    assert cost(price, cache_write_tokens=2) == 625
    # 1 write = 312.5 -> tie -> 312 (even); 3 writes = 937.5 -> 938 (even)
    assert cost(price, cache_write_tokens=1) == 312
    assert cost(price, cache_write_tokens=3) == 938
    explicit = ModelPrice.of("m", "0.25", "1.25", cache_read_per_mtok="0.03")
    assert explicit.cache_read_per_mtok == Decimal("0.03")
    assert explicit.cache_write_per_mtok == Decimal("0.3125")


def test_fractional_nanos_round_once_half_to_even() -> None:
    half = ModelPrice.of("m", "0.0005", "0.0005")  # 0.5 nanos per token
    # 1 -> 0.5 -> 0; 3 -> 1.5 -> 2; 5 -> 2.5 -> 2; 7 -> 3.5 -> 4 (ties go to even)
    assert [cost(half, input_tokens=n) for n in (1, 3, 5, 7)] == [0, 2, 2, 4]
    # rounded once per event, not per line: 0.5 + 0.5 = 1 (per line would give 0 + 0)
    assert cost(half, input_tokens=1, output_tokens=1) == 1
    nova = ModelPrice.of("m", "0.035", "0.14", cache_read_per_mtok="0.00875")  # 8.75 per read
    # 2 reads = 17.5 -> 18 (even); 6 reads = 52.5 -> 52 (even); 1 read = 8.75 -> 9
    assert cost(nova, cache_read_tokens=2) == 18
    assert cost(nova, cache_read_tokens=6) == 52
    assert cost(nova, cache_read_tokens=1) == 9
    # 0.4 nanos per token: 4 tokens = 1.6 -> 2, 1 token = 0.4 -> 0
    tenth = ModelPrice.of("m", "0.0004", "0")
    assert cost(tenth, input_tokens=4) == 2
    assert cost(tenth, input_tokens=1) == 0


# --- long context ---------------------------------------------------------------------


def test_long_context_tier_boundary() -> None:
    # exactly at 200_000: base tier. 200_000 x 3000 + 1000 x 15_000 = 615_000_000
    assert cost(SONNET, input_tokens=200_000, output_tokens=1000) == 615_000_000
    # one more: the whole request at the tier. 200_001 x 6000 + 1000 x 22_500
    # = 1_200_006_000 + 22_500_000 = 1_222_506_000
    assert cost(SONNET, input_tokens=200_001, output_tokens=1000) == 1_222_506_000


def test_long_context_counts_cache_reads_and_writes_in_the_prompt() -> None:
    # 100_000 + 100_000 reads = 200_000: base. 100_000 x 3000 + 100_000 x 300 = 330_000_000
    assert cost(SONNET, input_tokens=100_000, cache_read_tokens=100_000) == 330_000_000
    # 100_001 reads: tier, cache reads scale like input (0.30 -> 0.60):
    # 100_000 x 6000 + 100_001 x 600 = 600_000_000 + 60_000_600 = 660_000_600
    assert cost(SONNET, input_tokens=100_000, cache_read_tokens=100_001) == 660_000_600
    # writes count too: 1 + 200_000 written (5-minute, 3.75 -> 7.50 in the tier):
    # 1 x 6000 + 200_000 x 7500 = 1_500_006_000
    assert cost(SONNET, input_tokens=1, cache_write_tokens=200_000) == 1_500_006_000
    # 1-hour writes in the tier: 6.00 -> 12.00: 1 x 6000 + 200_000 x 12_000
    assert (
        cost(SONNET, input_tokens=1, cache_write_tokens=200_000, cache_write_1h_tokens=200_000)
        == 2_400_006_000
    )


def test_tier_cache_prices_scale_exactly_even_when_the_ratio_does_not_terminate() -> None:
    # input 3 -> 7 in the tier: ratio 7/3; cache reads 0.31 -> 0.31 x 7/3 = 0.72333...
    # i.e. 723.333... nanos per read. Prompt 1 + 2 = 3 > 1: tier.
    # 1 x 7000 + 2 x 723.333... = 8446.666... -> 8447
    price = ModelPrice.of(
        "m",
        "3",
        "15",
        cache_read_per_mtok="0.31",
        long_context=LongContextTier(1, Decimal("7"), Decimal("15")),
    )
    assert cost(price, input_tokens=1, cache_read_tokens=2) == 8447
    # 3 reads x 723.333... = 2170 exactly (+ 7000 input)
    assert cost(price, input_tokens=1, cache_read_tokens=3) == 9170
    tier = price.tier_prices()
    assert tier is not None and tier[1] == Fraction(31, 100) * Fraction(7, 3)


def test_a_tier_needs_a_base_input_price() -> None:
    with pytest.raises(ContractError, match="input_per_mtok > 0"):
        ModelPrice.of("m", "0", "1", long_context=LongContextTier(10, Decimal(1), Decimal(1)))


# --- which entry ----------------------------------------------------------------------


def test_longest_prefix_wins() -> None:
    t = table(
        ModelPrice.of("gpt-4o", "2.50", "10"),
        ModelPrice.of("gpt-4o-mini", "0.15", "0.60"),
        ModelPrice.of("gpt-4o-2024-05-13", "5", "15"),
    )
    assert t.lookup("gpt-4o-mini-2024-07-18").match == "gpt-4o-mini"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4o-2024-08-06").match == "gpt-4o"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4o-2024-05-13").match == "gpt-4o-2024-05-13"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4o").match == "gpt-4o"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4") is None
    assert t.lookup("") is None


def test_model_id_decorations() -> None:
    assert model_id_candidates("us.anthropic.claude-sonnet-4-5-20250929-v1:0") == [
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "claude-sonnet-4-5-20250929-v1:0",
    ]
    assert model_id_candidates("models/gemini-2.5-pro") == [
        "models/gemini-2.5-pro",
        "gemini-2.5-pro",
    ]
    assert model_id_candidates("claude-sonnet-4@20250514")[-1] == "claude-sonnet-4-20250514"
    arn = "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-haiku-20240307-v1:0"
    assert model_id_candidates(arn)[-1] == "claude-3-haiku-20240307-v1:0"
    assert model_id_candidates("gpt-4.1-mini") == ["gpt-4.1-mini"]  # a dot is not a label
    assert model_id_candidates("ft:gpt-4o-mini:acme::x") == [
        "ft:gpt-4o-mini:acme::x",
        "ft:gpt-4o-mini",  # a fine-tuned id is priced by its base
    ]
    sonnet_4 = ModelPrice.of("claude-sonnet-4", "3", "15")
    t = table(SONNET, sonnet_4, ModelPrice.of("gemini-2.5-pro", "1.25", "10"))
    for model in (
        "eu.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "claude-sonnet-4-5@20250929",
        "Claude-Sonnet-4-5",
    ):
        assert t.lookup(model) is SONNET, model
    for model in (
        "anthropic.claude-sonnet-4-20250514-v1:0",
        "claude-sonnet-4@20250514",
        "claude-sonnet-4-0",  # Anthropic's alias of Sonnet 4
    ):
        assert t.lookup(model) is sonnet_4, model
    assert t.lookup("models/gemini-2.5-pro").match == "gemini-2.5-pro"  # type: ignore[union-attr]  # the model is priced: found


def test_an_entry_for_the_id_as_carried_beats_the_normalised_id() -> None:
    regional = ModelPrice.of("anthropic.claude-sonnet-4-5", "3.30", "16.50")
    world = ModelPrice.of("global.anthropic.claude-sonnet-4-5", "3.00", "15.00")
    t = table(SONNET, regional, world)
    assert t.lookup("us.anthropic.claude-sonnet-4-5-20250929-v1:0") is regional
    assert t.lookup("anthropic.claude-sonnet-4-5-20250929-v1:0") is regional
    assert t.lookup("global.anthropic.claude-sonnet-4-5-20250929-v1:0") is world
    assert t.lookup("claude-sonnet-4-5") is SONNET


def test_unknown_model_is_unpriced_and_costs_nothing() -> None:
    b = book(SONNET)
    assert b.price("mystery-1", at=AT, input_tokens=10**6) == Price(0, "v1", None, True)
    assert b.unpriced_models(["mystery-1", "claude-sonnet-4-5", "mystery-1", "x"], AT) == [
        "mystery-1",
        "x",
    ]


def test_fallback_prices_what_nothing_matches() -> None:
    fallback = ModelPrice.of(FALLBACK_MATCH, "10", "50")
    b = book(SONNET, fallback=fallback)
    # 1000 x 10_000 + 100 x 50_000 = 15_000_000
    assert b.price("mystery-1", at=AT, input_tokens=1000, output_tokens=100) == Price(
        15_000_000, "v1", "*", False
    )
    assert b.price("claude-sonnet-4-5", at=AT, input_tokens=1).matched == "claude-sonnet-4-5"
    assert b.unpriced_models(["mystery-1"], AT) == []
    assert b.tables[0].lookup("mystery-1") is None  # lookup never returns the fallback
    with pytest.raises(ContractError, match="fallback"):
        table(SONNET, fallback=ModelPrice.of("x", "1", "1"))


def test_match_must_be_a_prefix() -> None:
    with pytest.raises(ContractError, match="not a glob"):
        ModelPrice.of("gpt-4*", "1", "1")
    with pytest.raises(ContractError, match="non-empty"):
        ModelPrice.of("", "1", "1")
    with pytest.raises(ContractError, match="twice"):
        table(ModelPrice.of("a", "1", "1"), ModelPrice.of("a", "2", "2"))


# --- versions -------------------------------------------------------------------------


def versions() -> PriceBook:
    return PriceBook(
        [
            table(ModelPrice.of("m", "1", "1"), version="v1", at=T0),
            table(ModelPrice.of("m", "2", "2"), version="v2", at=T0 + timedelta(days=100)),
        ]
    )


def test_the_version_in_force_at_the_event_time_prices_it() -> None:
    b = versions()
    switch = T0 + timedelta(days=100)
    assert b.price("m", at=switch - timedelta(microseconds=1), input_tokens=1).price_version == "v1"
    assert b.price("m", at=switch, input_tokens=1) == Price(2000, "v2", "m", False)
    assert b.price("m", at=T0, input_tokens=1) == Price(1000, "v1", "m", False)
    # before the first version: unpriced, no version (not the earliest version's prices)
    assert b.price("m", at=T0 - timedelta(microseconds=1), input_tokens=1) == NO_VERSION
    assert Price(0, None, None, True) == NO_VERSION
    assert b.table_at(T0 - timedelta(days=1)) is None
    assert b.unpriced_models(["m"], T0 - timedelta(days=1)) == ["m"]
    assert b.table_at(datetime(2027, 1, 1, 9, tzinfo=UTC)).version == "v2"  # type: ignore[union-attr]  # a version is in force then: found


def test_reapplied_version_replaces_and_removed_version_is_gone() -> None:
    b = versions()
    event_time = T0 + timedelta(days=1)
    assert b.price("m", at=event_time, input_tokens=1).cost_nanos == 1000  # now cached
    b.add(table(ModelPrice.of("m", "5", "5"), version="v1", at=T0))
    assert b.price("m", at=event_time, input_tokens=1).cost_nanos == 5000
    assert len(b) == 2
    b.remove("v1")
    assert b.price("m", at=event_time, input_tokens=1) == NO_VERSION
    b.remove("never-applied")  # a tombstone for an unknown version is harmless
    assert [t.version for t in b.tables] == ["v2"]


def test_same_effective_from_the_greater_version_wins_whatever_the_order() -> None:
    a = table(ModelPrice.of("m", "1", "1"), version="2026-a", at=T0)
    b = table(ModelPrice.of("m", "2", "2"), version="2026-b", at=T0)
    for order in ([a, b], [b, a]):
        assert PriceBook(order).price("m", at=AT, input_tokens=1).price_version == "2026-b"


def test_times_need_a_zone() -> None:
    with pytest.raises(ContractError, match="time zone"):
        versions().price("m", at=datetime(2026, 5, 1))
    with pytest.raises(ContractError, match="time zone"):
        table(SONNET, at=datetime(2026, 5, 1))


# --- events, worst case -------------------------------------------------------------


def event(**kw: object) -> UsageEvent:
    fields: dict[str, Any] = {
        "provider": "anthropic",
        "api": "anthropic-messages",
        "model": "claude-sonnet-4-5-20250929",
        "secret_id": "sk-1",
        "org_id": "acme",
        "gateway_id": "gw",
        "input_tokens": 1234,
        "output_tokens": 567,
        "cache_read_tokens": 10_000,
        "cache_write_tokens": 2000,
        "cache_write_1h_tokens": 500,
        "occurred_at": AT,
    }
    fields.update(kw)
    return new_usage_event(**fields)


def test_price_event_is_price_of_the_event_fields() -> None:
    b = PriceBook([table(SONNET), table(SONNET, version="v0", at=T0 - timedelta(days=9))])
    for ev in (
        event(),
        event(input_tokens=250_000),  # long context
        event(model="nope"),  # unpriced
        event(occurred_at=T0 - timedelta(days=1)),  # an older version
        event(occurred_at=T0 - timedelta(days=30)),  # before every version
    ):
        for _ in range(2):  # resolving, then cached
            assert b.price_event(ev) == b.price(
                ev["model"],
                at=ev["occurred_at"],
                input_tokens=ev["input_tokens"],
                cache_read_tokens=ev["cache_read_tokens"],
                cache_write_tokens=ev["cache_write_tokens"],
                cache_write_1h_tokens=ev["cache_write_1h_tokens"],
                output_tokens=ev["output_tokens"],
            )
    assert b.price_event(event()) == Price(23_832_000, "v1", "claude-sonnet-4-5", False)
    assert b.price_event(event(occurred_at=T0 - timedelta(days=1))).price_version == "v0"
    naive = dict(event(), occurred_at=datetime(2026, 11, 30))
    with pytest.raises(InvalidRecord, match="occurred_at"):
        b.price_event(naive)
    bad = dict(event(), cache_write_tokens=1, cache_write_1h_tokens=2)
    with pytest.raises(InvalidRecord, match="cache_write_1h_tokens"):
        b.price_event(bad)
    assert PriceBook().price_event(event()) == NO_VERSION


def test_worst_case_is_input_and_max_output_tier_aware() -> None:
    b = book(SONNET)
    # 1000 x 3000 + 4096 x 15_000 = 3_000_000 + 61_440_000
    assert (
        b.worst_case_nanos("claude-sonnet-4-5", at=AT, input_tokens=1000, max_output_tokens=4096)
        == 64_440_000
    )
    # 300_000 > 200_000: tier. 300_000 x 6000 + 8192 x 22_500 = 1_800_000_000 + 184_320_000
    assert (
        b.worst_case_nanos("claude-sonnet-4-5", at=AT, input_tokens=300_000, max_output_tokens=8192)
        == 1_984_320_000
    )
    assert b.worst_case_nanos("unknown", at=AT, input_tokens=10, max_output_tokens=10) == 0

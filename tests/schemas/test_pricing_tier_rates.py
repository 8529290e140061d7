"""Per-class service-tier rates (PriceTable v3 ``service_tier_rates``): a class a tier bills
apart from its multiplier, below and above the long-context edge, exact and rounded once;
v2 records and files without them charge what they always did."""

from __future__ import annotations

import io
import json
import textwrap
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas.avro_schemas import fingerprint
from schemas.codec import MAGIC, PRICE_TABLE
from schemas.errors import ConfigError, ContractError
from schemas.pricing import (
    TIER_RATE_FIELDS,
    TOKEN_PRICE_FIELDS,
    LongContextTier,
    ModelPrice,
    PriceBook,
    PriceTable,
    exact_decimal,
    load_price_file,
)
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

AT = datetime(2026, 12, 7, tzinfo=UTC)
M = 1_000_000

FILE = """
    version: "v3"
    effective_from: "2026-01-01T00:00:00Z"
    models:
      - match: gpt-5.4             # OpenAI: batch and flex cached input at $0.13, not $0.125
        input_per_mtok: "2.50"     # and above 272k at $0.25, not twice $0.13
        output_per_mtok: "15.00"
        cache_read_per_mtok: "0.25"
        long_context: {above_input_tokens: 272000, input_per_mtok: "5.00", output_per_mtok: "22.50"}
        service_tiers: {batch: "0.5", flex: "0.5", priority: "2"}
        service_tier_rates:
          batch: {cache_read_per_mtok: "0.13", long_context_cache_read_per_mtok: "0.25"}
          flex: {cache_read_per_mtok: "0.13", long_context_cache_read_per_mtok: "0.25"}
      - match: gemini-2.5-pro      # Gemini batch: input and output halved, cache reads not
        input_per_mtok: "1.25"
        output_per_mtok: "10.00"
        cache_read_per_mtok: "0.125"
        long_context: {above_input_tokens: 200000, input_per_mtok: "2.50", output_per_mtok: "15.00"}
        service_tiers: {batch: "0.5"}
        service_tier_rates: {batch: {cache_read_per_mtok: "0.125"}}
      - match: gpt-4o-mini         # priority at 5/3 of every price: rates, no multiplier
        input_per_mtok: "0.15"
        output_per_mtok: "0.60"
        cache_read_per_mtok: "0.075"
        service_tiers: {batch: "0.5"}
        service_tier_rates:
          priority: {input_per_mtok: "0.25", output_per_mtok: "1.00", cache_read_per_mtok: "0.125"}
"""


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = tmp_path / "prices.yaml"
    path.write_text(textwrap.dedent(FILE))
    return PriceBook.from_file(path)


def event(model: str, **over: Any) -> UsageEvent:
    tokens = {"input_tokens": 0, "output_tokens": 0, **over}
    return new_usage_event(
        provider="openai",
        api="openai-responses",
        model=model,
        secret_id="sk",
        org_id="acme",
        gateway_id="gw",
        occurred_at=AT,
        **tokens,
    )


def both(book: PriceBook, model: str, **kw: Any) -> int:
    """The cost by ``price`` (the enforcer's settle and the CLI) and by ``price_event``
    (the aggregator's counting stage), which must agree."""
    by_call = book.price(model, at=AT, **kw).cost_nanos
    by_event = book.price_event(event(model, **kw)).cost_nanos
    assert by_call == by_event, (model, kw)
    return by_call


def test_a_class_rate_overrides_the_tier_multiplier_for_that_class_only(book: PriceBook) -> None:
    n = 200_000  # below gpt-5.4's long-context edge
    assert both(book, "gpt-5.4", cache_read_tokens=n, service_tier="batch") == 26_000_000
    assert both(book, "gpt-5.4", cache_read_tokens=n, service_tier="flex") == 26_000_000
    # the other classes of the tier keep its multiplier; priority has no class rate
    assert both(book, "gpt-5.4", input_tokens=n, output_tokens=M, service_tier="batch") == (
        250_000_000 + 7_500_000_000
    )
    assert both(book, "gpt-5.4", cache_read_tokens=n, service_tier="priority") == 100_000_000
    # no tier, or a tier the entry does not price: the base prices
    assert both(book, "gpt-5.4", cache_read_tokens=n) == 50_000_000
    assert both(book, "gpt-5.4", cache_read_tokens=n, service_tier="scale") == 50_000_000


def test_above_the_long_context_edge_a_class_rate_scales_as_its_base_price(
    book: PriceBook,
) -> None:
    """Gemini 2.5 Pro batch: cached input at the standard cached rate on both sides of
    the edge ($0.125, then $0.25), input and output halved ($0.625 / $5, then $1.25 /
    $7.50)."""
    below = 200_000
    assert both(book, "gemini-2.5-pro", cache_read_tokens=below, service_tier="batch") == 25_000_000
    assert both(book, "gemini-2.5-pro", input_tokens=below, service_tier="batch") == 125_000_000
    above = 400_000
    assert both(book, "gemini-2.5-pro", cache_read_tokens=above, service_tier="batch") == (
        100_000_000
    )
    assert both(
        book, "gemini-2.5-pro", input_tokens=above, output_tokens=M, service_tier="batch"
    ) == (500_000_000 + 7_500_000_000)


def test_above_the_edge_a_tier_charges_the_rate_it_names_there(book: PriceBook) -> None:
    """gpt-5.4 batch and flex above 272k: cached input at OpenAI's $0.25 (the scaling rule
    would make it $0.26), input and output at half the long-context prices; priority has
    no rate above the edge and scales ($0.50 x 2)."""
    above = 300_000
    for tier in ("batch", "flex"):
        assert both(book, "gpt-5.4", cache_read_tokens=above, service_tier=tier) == 75_000_000
        assert both(book, "gpt-5.4", input_tokens=above, output_tokens=M, service_tier=tier) == (
            750_000_000 + 11_250_000_000
        )
    # at the edge exactly: still the rate below it
    assert both(book, "gpt-5.4", cache_read_tokens=272_000, service_tier="batch") == 35_360_000
    assert both(book, "gpt-5.4", cache_read_tokens=above, service_tier="priority") == 300_000_000
    assert both(book, "gpt-5.4", cache_read_tokens=above) == 150_000_000


def test_a_tier_with_rates_and_no_multiplier_carries_a_ratio_no_decimal_can(
    book: PriceBook,
) -> None:
    """5/3 is no finite decimal, so no multiplier can say it; the rates carry it exactly,
    and the classes the tier gives no rate for pay the base prices."""
    assert both(book, "gpt-4o-mini", input_tokens=3, service_tier="priority") == 750
    assert both(book, "gpt-4o-mini", output_tokens=M, service_tier="priority") == 1_000_000_000
    assert both(book, "gpt-4o-mini", cache_write_tokens=M, service_tier="priority") == 187_500_000
    entry = book.tables[0].lookup("gpt-4o-mini")
    assert entry is not None and entry.tiers() == ("batch", "priority")


def test_units_are_added_to_a_tier_with_rates_and_rounded_once() -> None:
    price = ModelPrice.of(
        "m",
        "1",
        "3",
        unit_prices={"web_search": "0.0000000007"},
        service_tier_rates={"flex": {"input_per_mtok": "0.0000001"}},
    )
    book = PriceBook([PriceTable("v", AT, (price,))])
    # 3 tokens at $0.0000001/M = 0.0003 nanos, plus 1 search = 0.7 nanos: 1.0003 -> 1
    got = book.price("m", at=AT, input_tokens=3, units={"web_search": 1}, service_tier="flex")
    assert got.cost_nanos == 1
    ev = event("m", input_tokens=3, units={"web_search": 1}, service_tier="flex")
    assert book.price_event(ev).cost_nanos == 1


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.tuples(*(st.integers(0, 10**7) for _ in range(5))),
    base=st.tuples(*(st.decimals(0, 1000, places=6, allow_nan=False) for _ in range(5))),
    factor=st.one_of(st.none(), st.decimals("0.000001", 100, places=6, allow_nan=False)),
    given_rates=st.dictionaries(
        st.sampled_from(TIER_RATE_FIELDS),
        st.decimals(0, 1000, places=9, allow_nan=False),
        min_size=1,
    ),
    long=st.one_of(
        st.none(), st.tuples(st.integers(0, 10**6), st.integers(1, 4), st.integers(1, 4))
    ),
)
def test_the_cost_in_a_tier_is_the_exact_sum_rounded_once(
    tokens: tuple[int, int, int, int, int],
    base: tuple[Decimal, Decimal, Decimal, Decimal, Decimal],
    factor: Decimal | None,
    given_rates: dict[str, Decimal],
    long: tuple[int, int, int] | None,
) -> None:
    """Brute force over Fractions, straight from the rule: a class's rate in the tier, else
    its price x the multiplier; above the edge the tier's rate there when it names one,
    else the tier's prices x the long-context ratio (input's for input and cache
    classes, output's for output)."""
    if long is None:  # a rate above the edge needs an edge (refused otherwise: below)
        given_rates = {k: v for k, v in given_rates.items() if k in TOKEN_PRICE_FIELDS}
        assume(given_rates)
    inp_price = base[0] + 1  # a long-context tier needs a base input price > 0
    out_price = base[4] + 1
    prices = dict(zip(TOKEN_PRICE_FIELDS, (inp_price, *base[1:4], out_price), strict=True))
    tier = None
    if long is not None:
        tier = LongContextTier(long[0], inp_price * long[1], out_price * long[2])
    entry = ModelPrice(
        match="m",
        input_per_mtok=prices["input_per_mtok"],
        cache_read_per_mtok=prices["cache_read_per_mtok"],
        cache_write_per_mtok=prices["cache_write_per_mtok"],
        cache_write_1h_per_mtok=prices["cache_write_1h_per_mtok"],
        output_per_mtok=prices["output_per_mtok"],
        long_context=tier,
        service_tiers=() if factor is None else (("batch", factor),),
        service_tier_rates=(("batch", tuple(given_rates.items())),),
    )
    book = PriceBook([PriceTable("v", AT, (entry,))])
    inp, read, write_5m, write_1h, out = tokens
    counts = dict(zip(TOKEN_PRICE_FIELDS, (inp, read, write_5m, write_1h, out), strict=True))
    above = tier is not None and inp + read + write_5m + write_1h > tier.above_input_tokens
    exact = Fraction(0)
    for name, count in counts.items():
        if name in given_rates:
            price = Fraction(given_rates[name])
        else:
            price = Fraction(prices[name]) * Fraction(factor if factor is not None else 1)
        if above and long is not None:
            price *= long[2] if name == "output_per_mtok" else long[1]
            if f"long_context_{name}" in given_rates:
                price = Fraction(given_rates[f"long_context_{name}"])
        exact += count * price * 1000
    want = round(exact)  # Python rounds a Fraction half to even
    got = book.price(
        "m",
        at=AT,
        input_tokens=inp,
        cache_read_tokens=read,
        cache_write_tokens=write_5m + write_1h,
        cache_write_1h_tokens=write_1h,
        output_tokens=out,
        service_tier="batch",
    )
    assert got.cost_nanos == want
    ev = event(
        "m",
        input_tokens=inp,
        cache_read_tokens=read,
        cache_write_tokens=write_5m + write_1h,
        cache_write_1h_tokens=write_1h,
        output_tokens=out,
        service_tier="batch",
    )
    assert book.price_event(ev).cost_nanos == want


def _v2_record_bytes(record: dict[str, Any]) -> bytes:
    v2 = json.loads(
        (resources.files("schemas") / "avro" / "history" / "PriceTable" / "v2.avsc").read_text()
    )
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(v2), record)
    return MAGIC + fingerprint(v2) + buf.getvalue()


def test_a_v2_record_reads_without_class_rates_and_charges_what_it_did() -> None:
    """A v2 tier multiplies the whole token sum, rounded once; the precomputed tier rates
    give the same nanos (odd token counts, a factor with many places: no early rounding)."""
    record = {
        "version": "2026-06",
        "effective_from": AT,
        "models": [
            {
                "match": "claude-sonnet-4-5",
                "input_per_mtok": "3.00",
                "output_per_mtok": "15.00",
                "cache_read_per_mtok": "0.30",
                "cache_write_per_mtok": None,
                "cache_write_1h_per_mtok": None,
                "long_context": {
                    "above_input_tokens": 200_000,
                    "input_per_mtok": "6.00",
                    "output_per_mtok": "22.50",
                },
                "unit_prices": {"web_search": "0.01"},
                "service_tiers": {"batch": "0.5", "flex": "0.3333333"},
            }
        ],
        "fallback": None,
    }
    decoded = PRICE_TABLE.decode(_v2_record_bytes(record))
    table = PriceTable.from_record(decoded)
    entry = table.models[0]
    assert entry.service_tier_rates == ()
    assert table.to_record()["models"][0]["service_tier_rates"] == {}
    book = PriceBook([table])
    for tier, factor in (("batch", Fraction(1, 2)), ("flex", Fraction("0.3333333"))):
        for inp, read, write, out in ((1, 0, 0, 1), (333_333, 7, 13, 4_321), (250_001, 3, 0, 9)):
            # v2's rule: the exact token sum at the (long-context) prices, x the factor
            above = inp + read + write > 200_000
            rates = (
                (6, Fraction("0.6"), Fraction("7.5"), 45 / Fraction(2))
                if above
                else (
                    3,
                    Fraction("0.3"),
                    Fraction("3.75"),
                    15,
                )
            )
            exact = (inp * rates[0] + read * rates[1] + write * rates[2] + out * rates[3]) * 1000
            want = round(exact * factor)
            got = book.price(
                "claude-sonnet-4-5",
                at=AT,
                input_tokens=inp,
                cache_read_tokens=read,
                cache_write_tokens=write,
                output_tokens=out,
                service_tier=tier,
            )
            assert got.cost_nanos == want, (tier, inp, read, write, out)


def test_class_rates_round_trip_through_the_record_and_the_codec(book: PriceBook) -> None:
    table = book.tables[0]
    record = table.to_record()
    rates = {"cache_read_per_mtok": "0.13", "long_context_cache_read_per_mtok": "0.25"}
    assert record["models"][0]["service_tier_rates"] == {"batch": rates, "flex": rates}
    again = PriceTable.from_record(PRICE_TABLE.decode(PRICE_TABLE.encode(record)))
    assert again == table
    assert [m.extras for m in again.models] == [m.extras for m in table.models]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            'service_tier_rates: {batch: {cache_read: "0.1"}}',
            "service_tier_rates.batch: 'cache_read' is not a token price (one of input_per_mtok",
        ),
        (
            'service_tier_rates: {Batch: {input_per_mtok: "0.1"}}',
            "service_tier_rates: 'Batch' is not a lower-case name",
        ),
        (
            'service_tier_rates: {batch: {input_per_mtok: "-1"}}',
            "field 'service_tier_rates.batch.input_per_mtok': '-1' must be a finite amount >= 0",
        ),
        (
            "service_tier_rates: {batch: {input_per_mtok: 0.1}}",
            "field 'service_tier_rates.batch.input_per_mtok': give prices as strings",
        ),
        ("service_tier_rates: {batch: {}}", "service_tier_rates.batch: give at least one"),
        ('service_tier_rates: {batch: "0.5"}', "field 'service_tier_rates.batch': a mapping"),
        ('service_tier_rates: ["batch"]', "field 'service_tier_rates': a mapping of tier"),
    ],
)
def test_bad_class_rates_are_refused_naming_the_field(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            version: "v"
            effective_from: "2026-01-01"
            models:
              - match: m
                input_per_mtok: "1"
                output_per_mtok: "2"
                {entry}
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_price_file(path)
    assert "model 'm'" in str(err.value) and message in str(err.value)


def test_a_rate_above_the_edge_needs_the_entrys_long_context_tier() -> None:
    with pytest.raises(
        ContractError,
        match=r"service_tier_rates\.batch\.long_context_cache_read_per_mtok: a rate above",
    ):
        ModelPrice.of(
            "m", "1", "2", service_tier_rates={"batch": {"long_context_cache_read_per_mtok": "1"}}
        )


def test_an_output_rate_above_the_edge_needs_a_base_output_price() -> None:
    with pytest.raises(ContractError, match=r"service_tier_rates\.batch\.output_per_mtok: with a"):
        ModelPrice.of(
            "m",
            "1",
            "0",
            long_context=LongContextTier(10, Decimal(2), Decimal(1)),
            service_tier_rates={"batch": {"output_per_mtok": "1"}},
        )


@pytest.mark.parametrize(
    ("fraction", "decimal"),
    [
        (Fraction(13, 25), "0.52"),
        (Fraction(1, 2), "0.5"),
        (Fraction(7, 4), "1.75"),
        (Fraction(3, 1), "3"),
        (Fraction(1, 3), None),
        (Fraction(5, 3), None),
        (Fraction(1, 1024 * 3125), "0.0000003125"),
    ],
)
def test_exact_decimal_is_the_finite_expansion_or_none(
    fraction: Fraction, decimal: str | None
) -> None:
    got = exact_decimal(fraction)
    assert (None if got is None else Fraction(got)) == (
        None if decimal is None else Fraction(Decimal(decimal))
    )


def test_spendbus_price_rates_shows_each_tiers_prices(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from spendbus.commands.pricing import price

    path = tmp_path / "prices.yaml"
    path.write_text(textwrap.dedent(FILE))
    args = ["--prices", str(path), "--model", "gpt-5.4", "--at", "2026-12-07", "--rates"]
    result = CliRunner().invoke(price, [*args, "--cache-read-tokens", "1000000"])
    assert result.exit_code == 0, result.output
    rates = json.loads(result.stdout)["rates"]
    given = {"cache_read_per_mtok": "0.13", "long_context_cache_read_per_mtok": "0.25"}
    assert rates["service_tier_rates"] == {"batch": given, "flex": given}
    batch = rates["tokens_per_mtok_by_tier"]["batch"]
    assert (batch["input"], batch["cache_read"], batch["output"]) == ("1.25", "0.13", "7.5")
    assert rates["tokens_per_mtok_by_tier"]["priority"]["cache_read"] == "0.5"
    for tokens, nanos in (("200000", 26_000_000), ("1000000", 250_000_000)):  # below, above
        tiered = CliRunner().invoke(
            price, [*args, "--cache-read-tokens", tokens, "--service-tier", "flex"]
        )
        assert json.loads(tiered.stdout)["cost_nanos"] == nanos

"""Billed units and service tiers in the price table: per-unit prices, tier multipliers,
versioned by date like tokens, exact and rounded once; PriceTable v2 over v1 records."""

from __future__ import annotations

import io
import json
import textwrap
from datetime import UTC, datetime
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.avro_schemas import fingerprint
from schemas.codec import MAGIC, PRICE_TABLE
from schemas.errors import ConfigError
from schemas.pricing import PriceBook, PriceTable, load_price_file
from schemas.records import UsageEvent
from schemas.usage import new_usage_event

FILE = """
    versions:
      - version: "2026-01"
        effective_from: "2026-01-01T00:00:00Z"
        models:
          - match: claude-sonnet-4-5
            input_per_mtok: "3.00"
            output_per_mtok: "15.00"
            unit_prices: {web_search: "0.01", web_fetch: "0"}
            service_tiers: {batch: "0.5", priority: "1.25"}
          - {match: gpt-4o, input_per_mtok: "2.50", output_per_mtok: "10.00"}
      - version: "2026-06"
        effective_from: "2026-06-01T00:00:00Z"
        models:
          - match: claude-sonnet-4-5
            input_per_mtok: "3.00"
            output_per_mtok: "15.00"
            unit_prices: {web_search: "0.012"}
"""
JAN = datetime(2026, 3, 1, tzinfo=UTC)
JUN = datetime(2026, 7, 1, tzinfo=UTC)


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = tmp_path / "prices.yaml"
    path.write_text(textwrap.dedent(FILE))
    return PriceBook.from_file(path)


def event(at: datetime, model: str = "claude-sonnet-4-5", **over: Any) -> UsageEvent:
    return new_usage_event(
        provider="anthropic",
        api="anthropic-messages",
        model=model,
        secret_id="sk",
        org_id="acme",
        gateway_id="gw",
        input_tokens=1000,
        output_tokens=100,
        occurred_at=at,
        **over,
    )


TOKENS = 1000 * 3_000 + 100 * 15_000  # nanos: $3/M x 1000 + $15/M x 100


def test_units_are_charged_per_unit_by_the_version_in_force(book: PriceBook) -> None:
    searched = event(JAN, units={"web_search": 3, "web_fetch": 2})
    assert book.price_event(searched).cost_nanos == TOKENS + 3 * 10_000_000
    later = event(JUN, units={"web_search": 3})
    assert book.price_event(later).cost_nanos == TOKENS + 3 * 12_000_000
    assert book.price_event(later).price_version == "2026-06"
    # price() gives the same
    same = book.price(
        "claude-sonnet-4-5", at=JAN, input_tokens=1000, output_tokens=100, units={"web_search": 3}
    )
    assert same.cost_nanos == TOKENS + 30_000_000


def test_a_service_tier_multiplies_the_tokens_not_the_units(book: PriceBook) -> None:
    batch = event(JAN, units={"web_search": 1}, service_tier="batch")
    assert book.price_event(batch).cost_nanos == TOKENS // 2 + 10_000_000
    priority = event(JAN, service_tier="priority")
    assert book.price_event(priority).cost_nanos == TOKENS * 5 // 4
    # a tier the entry does not list, or a version without tiers: the base prices
    assert book.price_event(event(JAN, service_tier="standard")).cost_nanos == TOKENS
    assert book.price_event(event(JUN, service_tier="batch")).cost_nanos == TOKENS


def test_entries_without_unit_prices_charge_tokens_only(book: PriceBook) -> None:
    plain = event(JAN, model="gpt-4o", units={"web_search": 5}, service_tier="batch")
    assert book.price_event(plain).cost_nanos == 1000 * 2_500 + 100 * 10_000


@settings(max_examples=300, deadline=None)
@given(
    inp=st.integers(0, 10**7),
    out=st.integers(0, 10**6),
    searches=st.integers(0, 10**4),
    usd=st.decimals(min_value=0, max_value=1000, places=7, allow_nan=False),
    factor=st.decimals(min_value="0.0000001", max_value=100, places=7, allow_nan=False),
    input_price=st.decimals(min_value=0, max_value=1000, places=9, allow_nan=False),
)
def test_the_cost_is_exact_and_rounded_once(
    inp: int, out: int, searches: int, usd: Any, factor: Any, input_price: Any
) -> None:
    table = PriceTable.from_record(
        {
            "version": "v",
            "effective_from": JAN,
            "models": [
                {
                    "match": "m",
                    "input_per_mtok": str(input_price),
                    "output_per_mtok": "15",
                    "unit_prices": {"web_search": str(usd)},
                    "service_tiers": {"flex": str(factor)},
                }
            ],
        }
    )
    book = PriceBook([table])
    got = book.price(
        "m",
        at=JAN,
        input_tokens=inp,
        output_tokens=out,
        units={"web_search": searches},
        service_tier="flex",
    )
    exact = (Fraction(inp) * Fraction(input_price) + Fraction(out) * 15) * 1000 * Fraction(
        factor
    ) + Fraction(searches) * Fraction(usd) * 10**9
    floor, rest = divmod(exact.numerator, exact.denominator)
    want = floor + (
        1 if 2 * rest > exact.denominator or (2 * rest == exact.denominator and floor % 2) else 0
    )
    assert got.cost_nanos == want


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("unit_prices: {web_search: 0.01}", "give prices as strings"),
        ('unit_prices: {Web-Search: "0.01"}', "unit_prices: 'Web-Search' is not a lower-case name"),
        ('unit_prices: {web_search: "-1"}', "must be a finite amount >= 0"),
        ('service_tiers: {batch: "0"}', "service_tiers.batch: 0 is outside (0, 100]"),
        ('unit_prices: ["web_search"]', "field 'unit_prices': a mapping of name to decimal string"),
    ],
)
def test_bad_unit_prices_and_tiers_name_the_entry_and_field(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        'version: "v"\neffective_from: "2026-01-01T00:00:00Z"\nmodels:\n'
        f'  - {{match: m, input_per_mtok: "1", output_per_mtok: "1", {entry}}}\n'
    )
    with pytest.raises(ConfigError) as info:
        load_price_file(path)
    assert "version 'v': model 'm'" in str(info.value) and message in str(info.value)


def test_the_record_carries_unit_prices_and_tiers(book: PriceBook) -> None:
    table = book.tables[0]
    again = PriceTable.from_record(PRICE_TABLE.decode(PRICE_TABLE.encode(table.to_record())))
    assert again == table
    sonnet = again.models[0]
    assert [(u, str(p)) for u, p in sonnet.unit_prices] == [
        ("web_fetch", "0"),
        ("web_search", "0.01"),
    ]
    assert [(t, str(f)) for t, f in sonnet.service_tiers] == [
        ("batch", "0.5"),
        ("priority", "1.25"),
    ]


def test_a_v1_price_record_reads_as_no_unit_prices() -> None:
    v1 = json.loads(
        (resources.files("schemas") / "avro" / "history" / "PriceTable" / "v1.avsc").read_text()
    )
    record = {
        "version": "old",
        "effective_from": JAN,
        "models": [
            {"match": "m", "input_per_mtok": "1", "output_per_mtok": "2", "cache_read_per_mtok": None,
             "cache_write_per_mtok": None, "cache_write_1h_per_mtok": None, "long_context": None}
        ],
        "fallback": None,
    }  # fmt: skip
    out = io.BytesIO()
    out.write(MAGIC + fingerprint(v1))
    schemaless_writer(out, parse_schema(v1), record)
    table = PriceTable.from_record(PRICE_TABLE.decode(out.getvalue()))
    assert table.models[0].unit_prices == () and table.models[0].service_tiers == ()
    assert (
        PriceBook([table])
        .price("m", at=JAN, input_tokens=10**6, units={"web_search": 9})
        .cost_nanos
        == 10**9
    )


def test_spendbus_price_takes_units_and_a_tier(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from spendbus.commands.pricing import price

    path = tmp_path / "prices.yaml"
    path.write_text(textwrap.dedent(FILE))
    args = ["--prices", str(path), "--model", "claude-sonnet-4-5", "--at", "2026-03-01"]
    args += ["--input-tokens", "1000", "--output-tokens", "100"]
    result = CliRunner().invoke(price, [*args, "--unit", "web_search=3", "--service-tier", "batch"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["cost_nanos"] == TOKENS // 2 + 30_000_000
    assert (out["units"], out["service_tier"]) == ({"web_search": 3}, "batch")
    bad = CliRunner().invoke(price, [*args, "--unit", "web_search"])
    assert bad.exit_code == 2 and "NAME=COUNT" in bad.stderr
    bad = CliRunner().invoke(price, [*args, "--unit", "Web=1"])
    assert bad.exit_code == 2 and "units: 'Web'" in bad.stderr


def test_spendbus_price_rates_lists_what_the_entry_bills() -> None:
    """--rates: the matched entry's token, unit and tier prices (the shipped file)."""
    from click.testing import CliRunner

    from spendbus.commands.pricing import price

    args = ["--model", "gemini-3-pro-preview", "--at", "2026-12-02", "--rates"]
    result = CliRunner().invoke(price, [*args, "--unit", "grounding_query=2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["cost_nanos"] == 28_000_000
    assert out["rates"]["unit_prices"] == {"grounding_query": "0.014"}
    assert out["rates"]["service_tiers"] == {"batch": "0.5"}
    assert out["rates"]["tokens_per_mtok"]["input"] == "2.00"
    unknown = CliRunner().invoke(price, ["--model", "no-such-model", "--rates"])
    assert json.loads(unknown.stdout)["rates"] is None

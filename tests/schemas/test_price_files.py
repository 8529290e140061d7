"""Price files and records: the strict YAML loader and its errors, the PriceTable record
through the codec, the shipped price file."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from schemas.codec import PRICE_TABLE
from schemas.errors import ConfigError, ContractError
from schemas.pricing import (
    ModelPrice,
    PriceBook,
    PriceTable,
    default_price_file,
    load_price_file,
    price_table_from_yaml,
)
from tests.schemas.kit import AT, SONNET, T0, table


def write(tmp_path: Path, text: str, name: str = "prices.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """
    version: "2026-11-01"
    effective_from: "2026-11-01T00:00:00Z"
    models:
      - match: claude-sonnet-4-5
        input_per_mtok: "3.00"
        output_per_mtok: "15.00"
        cache_read_per_mtok: "0.30"
        cache_write_per_mtok: "3.75"
        cache_write_1h_per_mtok: "6.00"
        long_context: {above_input_tokens: 200000, input_per_mtok: "6.00", output_per_mtok: "22.50"}
      - match: gpt-4o
        input_per_mtok: 2
        output_per_mtok: "10"
"""


def test_yaml_one_table(tmp_path: Path) -> None:
    [t] = load_price_file(write(tmp_path, GOOD))
    assert t.version == "2026-11-01"
    assert t.effective_from == datetime(2026, 11, 1, tzinfo=UTC)
    assert t.fallback is None
    assert t.models[0] == SONNET
    assert t.models[1] == ModelPrice.of("gpt-4o", 2, "10")
    assert t.models[1].cache_write_1h_per_mtok == Decimal(4)


def test_yaml_versions_list_and_plain_dates(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        versions:
          - version: 2026-01-01
            effective_from: 2026-01-01
            models: [{match: m, input_per_mtok: "1", output_per_mtok: "2"}]
          - version: "2026-06"
            effective_from: 2026-06-01T00:00:00+02:00
            models: [{match: m, input_per_mtok: "2", output_per_mtok: "4"}]
            fallback: {input_per_mtok: "9", output_per_mtok: "9"}
        """,
    )
    first, second = load_price_file(path)
    assert first.version == "2026-01-01"  # an unquoted date is read as its ISO text
    assert first.effective_from == datetime(2026, 1, 1, tzinfo=UTC)  # a bare date: midnight UTC
    assert second.effective_from == datetime(2026, 5, 31, 22, tzinfo=UTC)
    assert second.fallback == ModelPrice.of("*", "9", "9")
    parsed = price_table_from_yaml(yaml.safe_load(path.read_text()), source="x")
    assert isinstance(parsed, list) and len(parsed) == 2
    assert isinstance(
        price_table_from_yaml(yaml.safe_load(textwrap.dedent(GOOD)), source="x"), PriceTable
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            'input_per_mtok: 3.0\n        output_per_mtok: "1"',
            "'input_per_mtok': give prices as strings",
        ),
        (
            'input_per_mtok: "-1"\n        output_per_mtok: "1"',
            "'input_per_mtok': '-1' must be a finite amount >= 0",
        ),
        (
            'input_per_mtok: "abc"\n        output_per_mtok: "1"',
            "'input_per_mtok': 'abc' is not a decimal",
        ),
        ('input_per_mtok: "NaN"\n        output_per_mtok: "1"', "'input_per_mtok'"),
        (
            'input_per_mtok: true\n        output_per_mtok: "1"',
            "'input_per_mtok': expected a decimal string",
        ),
        ('input_per_mtok: "1"', "field 'output_per_mtok': required"),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        cache_read_per_mtok: 0.1',
            "'cache_read_per_mtok': give prices",
        ),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        input_price: "1"',
            "field 'input_price': unknown field",
        ),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        long_context: {above_input_tokens: 10, input_per_mtok: "2", output_per_mtok: "2", cache_read_per_mtok: "1"}',
            "long_context: field 'cache_read_per_mtok': unknown field",
        ),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        long_context: {above_input_tokens: 1.5, input_per_mtok: "2", output_per_mtok: "2"}',
            "long_context: field 'above_input_tokens'",
        ),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        long_context: {above_input_tokens: 10, input_per_mtok: "2"}',
            "long_context: field 'output_per_mtok': required",
        ),
        (
            'input_per_mtok: "1"\n        output_per_mtok: "1"\n        input_per_mtok: "2"',
            "found the key 'input_per_mtok' twice",
        ),
    ],
)
def test_yaml_errors_name_file_model_and_field(tmp_path: Path, entry: str, message: str) -> None:
    fields = "\n".join(f"    {line.strip()}" for line in entry.split("\n"))
    doc = f'version: "v9"\neffective_from: "2026-11-01T00:00:00Z"\nmodels:\n  - match: claude-x\n{fields}\n'
    path = tmp_path / "prices.yaml"
    path.write_text(doc)
    with pytest.raises(ConfigError) as info:
        load_price_file(path)
    text = str(info.value)
    assert str(path) in text
    assert message in text
    if "twice" not in message:
        assert "version 'v9': model 'claude-x': " in text


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("models: []", "expected a price table"),
        ("version: v1\nmodels: []", "version 'v1': field 'effective_from': required"),
        ('version: v1\neffective_from: "2026-11-01T00:00:00"\nmodels: []', "needs a time zone"),
        ('version: v1\neffective_from: "soon"\nmodels: []', "not an RFC 3339 time"),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels: {}',
            "field 'models': required, a list",
        ),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels: []\ncurrency: EUR',
            "field 'currency': unknown field",
        ),
        (
            'version: 1.5\neffective_from: "2026-11-01"\nmodels: []',
            "field 'version': required, a string",
        ),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels:\n  - {match: "gpt-4*", input_per_mtok: "1", output_per_mtok: "1"}',
            "model 'gpt-4*': field 'match': 'gpt-4*' is a prefix, not a glob",
        ),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels:\n  - {input_per_mtok: "1", output_per_mtok: "1"}',
            "model #1: field 'match': required",
        ),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels:\n  - {match: a, input_per_mtok: "1", output_per_mtok: "1"}\n  - {match: a, input_per_mtok: "2", output_per_mtok: "1"}',
            "model 'a': field 'match': also given by model #1",
        ),
        (
            'version: v1\neffective_from: "2026-11-01"\nmodels: []\nfallback: {match: x, input_per_mtok: "1", output_per_mtok: "1"}',
            "fallback: field 'match': unknown field",
        ),
        (
            'versions:\n  - {version: a, effective_from: "2026-01-01", models: []}\n  - {version: a, effective_from: "2026-02-01", models: []}',
            "version 'a': field 'version': given twice",
        ),
        ("versions: []", "field 'versions': a non-empty list"),
        ("version: [unclosed", "not valid YAML"),
    ],
)
def test_yaml_table_errors(tmp_path: Path, doc: str, message: str) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as info:
        load_price_file(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_price_file(tmp_path / "nope.yaml")


# --- the PriceTable record ----------------------------------------------------------


def test_record_round_trip_through_the_codec() -> None:
    original = table(
        SONNET,
        ModelPrice.of("amazon.nova-micro", "0.035", "0.14", cache_read_per_mtok="0.00875"),
        ModelPrice.of("tiny", "0.000000000000000001", "1E+3"),
        version="2026-11-01",
        at=datetime(2026, 11, 1, 6, 30, 0, 123456, tzinfo=UTC),
        fallback=ModelPrice.of("*", "10", "50"),
    )
    record = original.to_record()
    assert record["models"][1]["cache_read_per_mtok"] == "0.00875"  # exact strings
    assert record["models"][1]["cache_write_per_mtok"] == "0.04375"  # defaults written out
    decoded = PriceTable.from_record(PRICE_TABLE.decode(PRICE_TABLE.encode(record)))
    assert decoded == original
    assert decoded.effective_from == original.effective_from
    for mine, theirs in zip(decoded.models, original.models, strict=True):
        assert mine.to_record() == theirs.to_record()  # same digits, not only equal values
    # a record written without cache prices gets the defaults
    model = {"match": "m", "input_per_mtok": "2", "output_per_mtok": "8"}
    bare = {
        "version": "x",
        "effective_from": T0,
        "models": [model],
        "fallback": None,
    }
    read_back = PriceTable.from_record(PRICE_TABLE.decode(PRICE_TABLE.encode(bare)))
    assert read_back.models[0] == ModelPrice.of("m", "2", "8")
    assert read_back.models[0].cache_write_per_mtok == Decimal("2.5")
    with pytest.raises(ContractError):
        PriceTable.from_record({**bare, "models": [{**model, "input_per_mtok": "-1"}]})


# --- the shipped price file -----------------------------------------------------------


@pytest.fixture(scope="module")
def shipped() -> PriceBook:
    return PriceBook.from_file()


def test_the_shipped_file_loads(shipped: PriceBook) -> None:
    assert default_price_file().is_file()
    t = shipped.tables[0]
    assert t.effective_from <= datetime(2024, 1, 1, tzinfo=UTC)
    assert len(t.models) > 40
    for version in shipped.tables:  # the hand-written history, then make prices' version
        for price in version.models:
            assert price.match == price.match.lower(), price.match


@pytest.mark.parametrize(
    ("model", "matched", "usd_per_mtok_input"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", "3"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5", "5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1", "15"),
        ("claude-opus-4-20250514", "claude-opus-4-20250514", "15"),
        ("claude-haiku-4-5", "claude-haiku-4-5", "1"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku", "0.8"),
        ("anthropic.claude-3-haiku-20240307-v1:0", "claude-3-haiku", "0.25"),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic.claude-sonnet-4-5", "3.3"),
        (
            "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "global.anthropic.claude-sonnet-4-5",
            "3",
        ),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4", "3"),
        ("claude-sonnet-4@20250514", "claude-sonnet-4", "3"),
        ("us.amazon.nova-pro-v1:0", "amazon.nova-pro", "0.8"),
        ("gpt-5-2025-08-07", "gpt-5", "1.25"),
        ("gpt-5-mini", "gpt-5-mini", "0.25"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", "0.15"),
        ("gpt-4.1-nano", "gpt-4.1-nano", "0.1"),
        ("o4-mini-2025-04-16", "o4-mini", "1.1"),
        ("o3", "o3", "2"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc", "ft:gpt-4o-mini", "0.3"),
        ("models/gemini-2.5-pro", "gemini-2.5-pro", "1.25"),
        ("gemini-2.5-flash", "gemini-2.5-flash", "0.3"),
        ("gemini-2.5-flash-lite", "gemini-2.5-flash-lite", "0.1"),
        ("gemini-2.0-flash-001", "gemini-2.0-flash", "0.1"),
    ],
)
def test_shipped_prices(
    shipped: PriceBook, model: str, matched: str, usd_per_mtok_input: str
) -> None:
    price = shipped.price(model, at=AT, input_tokens=1000)
    assert price.matched == matched
    assert not price.unpriced
    assert price.cost_nanos == int(Decimal(usd_per_mtok_input) * 1000 * 1000)


def test_shipped_long_context_and_caches(shipped: PriceBook) -> None:
    # Gemini 2.5 Pro above 200k: 250_000 x 2500 + 1000 x 15_000 = 625_000_000 + 15_000_000
    assert (
        shipped.price("gemini-2.5-pro", at=AT, input_tokens=250_000, output_tokens=1000).cost_nanos
        == 640_000_000
    )
    # Sonnet 4.5, 1-hour cache write 6.00 and read 0.30: 1000 x 6000 + 1000 x 300
    assert (
        shipped.price(
            "claude-sonnet-4-5",
            at=AT,
            cache_write_tokens=1000,
            cache_write_1h_tokens=1000,
            cache_read_tokens=1000,
        ).cost_nanos
        == 6_300_000
    )
    # gpt-4o cached input is 1.25: 1000 x 1250
    assert shipped.price("gpt-4o", at=AT, cache_read_tokens=1000).cost_nanos == 1_250_000
    # an unknown future model is flagged, not mispriced by a broad prefix
    assert shipped.unpriced_models(["claude-opus-4-9", "my-azure-deployment", "gpt-4o"], AT) == [
        "claude-opus-4-9",
        "my-azure-deployment",
    ]


# --- a version written as its changes to an earlier one -------------------------------

EXTENDED = """
    versions:
      - version: "v1"
        effective_from: "2026-01-01T00:00:00Z"
        models:
          - {match: a, input_per_mtok: "1", output_per_mtok: "2"}
          - {match: b, input_per_mtok: "3", output_per_mtok: "4"}
          - {match: c, input_per_mtok: "5", output_per_mtok: "6"}
        fallback: {input_per_mtok: "9", output_per_mtok: "9"}
      - version: "v2"
        effective_from: "2026-03-13T00:00:00Z"
        extends: "v1"
        models:
          - {match: b, input_per_mtok: "30", output_per_mtok: "40", source: "a note"}
          - {match: d, input_per_mtok: "7", output_per_mtok: "8"}
        remove: [c]
"""


def test_a_version_that_extends_another_is_a_whole_table(tmp_path: Path) -> None:
    v1, v2 = load_price_file(write(tmp_path, EXTENDED))
    assert [m.match for m in v2.models] == ["a", "b", "d"]
    assert v2.models[0] == v1.models[0]
    assert v2.models[1] == ModelPrice.of("b", "30", "40") and v2.models[1].source == "a note"
    assert v2.fallback == v1.fallback
    # the record carries every entry: a reader needs no base
    assert PriceTable.from_record(PRICE_TABLE.decode(PRICE_TABLE.encode(v2.to_record()))) == v2
    book = PriceBook([v1, v2])
    before, after = datetime(2026, 3, 12, tzinfo=UTC), datetime(2026, 3, 13, tzinfo=UTC)
    assert book.price("b", at=before, input_tokens=1).cost_nanos == 3000
    assert book.price("b", at=after, input_tokens=1).cost_nanos == 30_000
    assert book.price("c", at=before, input_tokens=1).matched == "c"
    assert book.price("c", at=after, input_tokens=1).matched == "*"  # removed: the fallback


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ('extends: "v9"', "'extends': 'v9' is no version given before it"),
        ("remove: [zz]", "'remove': 'zz' is no entry of 'v1'"),
        ("remove: [b]", "'remove': 'b' is also given in 'models'"),
        ("remove: b", "'remove': a list of matches"),
    ],
)
def test_extends_errors(tmp_path: Path, change: str, message: str) -> None:
    text = EXTENDED.replace('extends: "v1"', change) if "extends" in change else EXTENDED
    if "remove" in change:
        text = text.replace("remove: [c]", change)
    with pytest.raises(ConfigError, match=message):
        load_price_file(write(tmp_path, text))


def test_only_a_version_that_extends_may_remove(tmp_path: Path) -> None:
    doc = {
        "versions": [
            {"version": "v1", "effective_from": "2026-01-01", "models": [], "remove": ["a"]}
        ]
    }
    with pytest.raises(ConfigError, match="only a version that 'extends'"):
        price_table_from_yaml(doc, source="p")
    with pytest.raises(ConfigError, match="'extends'"):  # one table alone has no earlier one
        price_table_from_yaml(
            {"version": "v1", "effective_from": "2026-01-01", "models": [], "extends": "v0"},
            source="p",
        )

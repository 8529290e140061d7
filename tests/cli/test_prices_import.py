"""`spendbus prices import` / `prices diff`: community price maps (LiteLLM, genai-prices) into
a new dated version of our price file, exactly, with provenance; every changed price listed.

The maps are small excerpts in each format, shipped beside this file (price_maps/)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import ConfigError
from schemas.pricing import (
    LongContextTier,
    ModelPrice,
    PriceBook,
    PriceTable,
    default_price_file,
    load_price_file,
)
from schemas.pricing.writer.diff import diff_tables
from schemas.pricing.writer.exact import load_exact_json, per_million
from schemas.pricing.writer.pricefile import price_file_text
from schemas.pricing.writer.sources import read_source
from spendbus.cli import cli

MAPS = Path(__file__).parent / "price_maps"
BASE = MAPS / "base.yaml"
LITELLM = MAPS / "litellm_excerpt.json"
GENAI = MAPS / "genai_prices_excerpt.json"
DEC_1 = "2026-12-01T00:00:00Z"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["prices", *args])
    return result.exit_code, result.stdout, result.stderr


def imported(
    tmp_path: Path, source: str, path: Path, *extra: str
) -> tuple[list[PriceTable], dict[str, Any]]:
    out = tmp_path / f"{source}.yaml"
    code, _, err = run(
        "import", "--from", source, str(path), "--base", str(BASE), "-o", str(out),
        "--effective-from", DEC_1, "--report-json", *extra,
    )  # fmt: skip
    assert code == 0, err
    return load_price_file(out), json.loads(err)


def entry(table: PriceTable, match: str) -> ModelPrice:
    return next(m for m in table.models if m.match == match)


def prices_of(price: ModelPrice) -> tuple[str, ...]:
    return tuple(
        format(getattr(price, name), "f")
        for name in (
            "input_per_mtok",
            "output_per_mtok",
            "cache_read_per_mtok",
            "cache_write_per_mtok",
            "cache_write_1h_per_mtok",
        )
    )


# -- exact conversion ------------------------------------------------------------------


def test_per_token_json_numbers_become_exact_per_million_decimals() -> None:
    doc = load_exact_json(
        '{"a": 3.3e-06, "b": 3e-06, "c": 1.25e-07, "d": 2, "e": 2.5000000000000002e-08}', source="t"
    )
    # a binary float gets it wrong; the decimal of the text does not
    assert 3.3e-06 * 1e6 == 3.3000000000000003  # not 3.3
    assert per_million(doc["a"]) == Decimal("3.3") and str(per_million(doc["a"])) == "3.3"
    assert str(per_million(doc["b"])) == "3"
    assert str(per_million(doc["c"])) == "0.125"
    assert doc["d"] == 2 and type(doc["d"]) is int
    # a float artifact in the source stays exactly what it says (and is warned about)
    assert str(per_million(doc["e"])) == "0.025000000000000002"


def test_not_a_number_is_refused() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_exact_json('{"a": NaN}', source="map.json")


@settings(max_examples=200, deadline=None)
@given(
    mantissa=st.integers(min_value=0, max_value=10**17),
    exponent=st.integers(min_value=-20, max_value=-1),
)
def test_read_source_converts_any_per_token_number_exactly(
    mantissa: int, exponent: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    text = f"{mantissa}e{exponent}"
    doc = f'{{"m": {{"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": {text}, "output_cost_per_token": {text}}}}}'
    path = tmp_path_factory.mktemp("map") / "m.json"
    path.write_text(doc)
    (price,) = read_source("litellm", path, on=date(2026, 12, 1)).prices
    assert Fraction(price.input_per_mtok) == Fraction(mantissa) * Fraction(10) ** (exponent + 6)
    assert price.input_per_mtok == price.output_per_mtok


# -- LiteLLM ---------------------------------------------------------------------------


def test_litellm_import_writes_a_new_dated_version_with_provenance(tmp_path: Path) -> None:
    tables, report = imported(tmp_path, "litellm", LITELLM, "--add-new")
    base = load_price_file(BASE)[0]
    assert [t.version for t in tables] == ["base-2026-11-01", "litellm-2026-12-01"]
    old, new = tables
    assert old == base  # the base version is kept as it was
    assert new.effective_from == datetime(2026, 12, 1, tzinfo=UTC)
    assert new.fallback == base.fallback
    opus = entry(new, "claude-opus-4-5")
    assert prices_of(opus) == ("5", "25", "0.5", "6.25", "10")
    assert opus.source is not None and opus.source.startswith(
        "litellm:claude-opus-4-5-20251101 (litellm_excerpt.json sha256:"
    )
    # the Bedrock regional id updates the regional entry only, with its tier
    bedrock = entry(new, "anthropic.claude-sonnet-4-5")
    assert bedrock.long_context == LongContextTier(200000, Decimal("6.6"), Decimal("24.75"))
    assert prices_of(bedrock)[:2] == ("3.3", "16.5")
    # Gemini: the tier and the per-token prices, exactly; cache writes follow the new input
    pro = entry(new, "gemini-2.5-pro")
    assert prices_of(pro) == ("1.25", "10", "0.125", "1.5625", "2.50")
    # two ids of claude-sonnet-4-5 agree (one lacks the 1h price): unchanged, ours kept
    assert (
        "claude-sonnet-4-5" in report["unchanged"]
        and entry(new, "claude-sonnet-4-5").source is None
    )
    # gpt-4o-mini: our gpt-4o entry does not price it (another model): added as its own
    assert "gpt-4o-mini" in report["added"]
    assert prices_of(entry(new, "gpt-4o-mini"))[:3] == ("0.15", "0.6", "0.075")
    # its batch and priority per-token prices are one multiplier each: imported as tiers
    gpt_4o = entry(new, "gpt-4o")
    assert [Decimal(p) for p in prices_of(gpt_4o)] == [
        Decimal(p) for p in prices_of(entry(base, "gpt-4o"))
    ]
    assert [(t, str(f)) for t, f in gpt_4o.service_tiers] == [("batch", "0.5"), ("priority", "1.7")]
    assert "gpt-4o" in report["updated"]
    # search_context_cost_per_query (medium) is the web search unit price
    assert [(u, str(p)) for u, p in opus.unit_prices] == [("web_search", "0.01")]
    # entries the source does not know are kept, routed ids and embeddings skipped
    assert entry(new, "mistral-large-2411") == entry(base, "mistral-large-2411")
    assert report["not_in_source"] == ["claude-3-5-haiku", "mistral-large-2411"]
    assert any("bedrock/us-east-1/" in s for s in report["skipped"])
    assert all(m.match != "text-embedding-3-small" for m in new.models)
    assert not any(m.match.startswith("openrouter") for m in new.models)
    assert report["warnings"] == [
        "litellm:gpt-4.1-nano: cache_read_per_mtok 0.025000000000000002 has 18 decimal "
        "places (a float artifact in the source?); imported exactly as written"
    ]


def test_without_add_new_nothing_is_added(tmp_path: Path) -> None:
    tables, report = imported(tmp_path, "litellm", LITELLM)
    assert report["added"] == []
    assert {"gpt-5.1", "o3-mini", "gemini-2.5-flash", "gpt-4o-mini"} <= set(report["new_in_source"])
    assert {m.match for m in tables[1].models} == {m.match for m in tables[0].models}


def test_events_before_the_new_version_keep_the_old_prices(tmp_path: Path) -> None:
    tables, _ = imported(tmp_path, "litellm", LITELLM)
    book = PriceBook(tables)
    before = book.price(
        "claude-opus-4-5-20251101", at=datetime(2026, 11, 30, tzinfo=UTC), input_tokens=10**6
    )
    after = book.price(
        "claude-opus-4-5-20251101", at=datetime(2026, 12, 1, tzinfo=UTC), input_tokens=10**6
    )
    assert (before.cost_nanos, before.price_version) == (15 * 10**9, "base-2026-11-01")
    assert (after.cost_nanos, after.price_version) == (5 * 10**9, "litellm-2026-12-01")


# -- genai-prices ----------------------------------------------------------------------


def test_genai_prices_import_reads_tiers_dated_prices_and_match_prefixes(tmp_path: Path) -> None:
    tables, report = imported(tmp_path, "genai-prices", GENAI, "--add-new")
    new = tables[1]
    # the conditional price in force on the import date (2025-01-15 on): 0.8 / 4
    haiku = entry(new, "claude-3-5-haiku")
    assert prices_of(haiku)[:4] == ("0.8", "4", "0.08", "1")
    assert haiku.source is not None and haiku.source.startswith(
        "genai-prices:anthropic/claude-3-5-haiku-latest"
    )
    # every prefix of an `or` match; an `equals` id is taken as a prefix
    assert {
        "claude-3.5-haiku",
        "claude-opus-4.5",
        "gemini-2.5-flash",
        "gemini-2.5-flash-preview-09",
    } == set(report["added"])
    # tool_use_kcount (USD per thousand uses) is a per-unit price
    opus = entry(new, "claude-opus-4-5")
    assert [(u, str(p)) for u, p in opus.unit_prices] == [("web_search", "0.01")]
    # a single tier is our long-context tier: Sonnet 4.5 agrees with ours
    assert "claude-sonnet-4-5" in report["unchanged"]
    assert set(report["skipped"]) == {
        "genai-prices:google/gemini-2.5-pro: input_mtok: 2 tiers: one is representable",
        "genai-prices:openai/o3: no starts_with/equals match to use as a prefix",
        "genai-prices:openai/text-embedding-3-small: no input_mtok and output_mtok",
        # a starts_with that is no model id (gpt-4o's snapshots): gpt-4o prices them
        "genai-prices:openai/gpt-4o: 'gpt-4o-2024-' is a prefix, not a model id",
    }
    assert entry(new, "gemini-2.5-pro") == entry(tables[0], "gemini-2.5-pro")


def test_genai_prices_before_a_dated_price_takes_the_earlier_one(tmp_path: Path) -> None:
    source = read_source("genai-prices", GENAI, on=date(2025, 1, 14))
    haiku = [p for p in source.prices if p.model == "claude-3-5-haiku"]
    assert [str(p.input_per_mtok) for p in haiku] == ["1"]


def test_time_of_day_prices_are_skipped_and_said_why() -> None:
    source = read_source("genai-prices", GENAI, providers=["deepseek"], on=date(2026, 12, 1))
    assert source.prices == []
    assert source.skipped == [
        "genai-prices:deepseek/deepseek-chat: time-of-day prices are not representable"
    ]


# -- diff ------------------------------------------------------------------------------


def test_diff_lists_every_changed_price(tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    code, _, err = run(
        "import",
        "--from",
        "litellm",
        str(LITELLM),
        "--base",
        str(BASE),
        "-o",
        str(out),
        "--effective-from",
        DEC_1,
        "--add-new",
    )
    assert code == 0, err
    code, stdout, err = run("diff", str(BASE), str(out))
    assert code == 1
    lines = stdout.splitlines()
    assert "~ claude-opus-4-5  input_per_mtok  15.00 -> 5" in lines
    assert "~ claude-opus-4-5  cache_write_1h_per_mtok  30.00 -> 10" in lines
    assert "~ gpt-4.1-nano  cache_read_per_mtok  0.025 -> 0.025000000000000002" in lines
    assert "+ gpt-5.1  input_per_mtok  1.25" in lines
    assert "+ gpt-4.1-nano  service_tiers.batch  0.5" in lines
    # gpt-5.1's flex and priority prices are given for input only: no multiplier, no tier
    assert not any(line.startswith("+ gpt-5.1  service_tiers") for line in lines)
    assert "+ claude-opus-4-5  unit_prices.web_search  0.01" in lines
    assert "+ anthropic.claude-sonnet-4-5  long_context.input_per_mtok  6.6" in lines
    # exactly the entries whose prices changed, each field once
    old, new = load_price_file(BASE)[0], load_price_file(out)[1]
    assert len(lines) == len(diff_tables(old, new))
    assert {line.split()[1] for line in lines} == {
        "claude-opus-4-5", "anthropic.claude-sonnet-4-5", "gemini-2.5-pro", "gpt-4.1-nano",
        "gemini-2.5-flash", "gpt-4o-mini", "gpt-5.1", "o3-mini", "gpt-4o",
        "claude-sonnet-4-20250514",  # Sonnet 4: our claude-sonnet-4-5 does not price it
    }  # fmt: skip
    assert "27 price(s) differ" in err or "price(s) differ" in err
    code, stdout, _ = run("diff", str(BASE), str(BASE))
    assert (code, stdout) == (0, "")
    # --at picks the version in force: before the import, the two files agree
    code, stdout, _ = run("diff", str(BASE), str(out), "--at", "2026-11-15T00:00:00Z")
    assert (code, stdout) == (0, "")


def test_diff_removed_entries_and_3_00_equals_3(tmp_path: Path) -> None:
    base = load_price_file(BASE)[0]
    same = PriceTable(
        "x",
        base.effective_from,
        tuple(m for m in base.models if m.match != "gpt-4o"),
        base.fallback,
    )
    changes = diff_tables(base, same)
    assert {(c.match, c.change) for c in changes} == {("gpt-4o", "removed")}
    assert len(changes) == 5


# -- bad input -------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"m": {"input_cost_per_token": 1e-06,')
    code, _, err = run(
        "import",
        "--from",
        "litellm",
        str(bad),
        "--base",
        str(BASE),
        "-o",
        str(tmp_path / "o.yaml"),
        "--effective-from",
        DEC_1,
    )
    assert code == 2 and "not valid JSON" in err and not (tmp_path / "o.yaml").exists()
    code, _, err = run(
        "import",
        "--from",
        "litellm",
        str(LITELLM),
        "--base",
        str(BASE),
        "-o",
        str(tmp_path / "o.yaml"),
        "--effective-from",
        "2026-10-01",
    )
    assert code == 2 and "is not after the newest version" in err
    code, _, err = run(
        "import",
        "--from",
        "genai-prices",
        str(LITELLM),
        "--base",
        str(BASE),
        "-o",
        str(tmp_path / "o.yaml"),
        "--effective-from",
        DEC_1,
    )
    assert code == 2 and "a JSON list of providers" in err
    negative = tmp_path / "neg.json"
    negative.write_text(
        '{"m": {"litellm_provider": "openai", "input_cost_per_token": -1e-06, "output_cost_per_token": 1e-06}}'
    )
    source = read_source("litellm", negative, on=date(2026, 12, 1))
    assert source.prices == [] and source.skipped == [
        "litellm:m: input_cost_per_token is not a price: Decimal('-0.000001')"
    ]


def test_the_shipped_price_file_takes_an_import(tmp_path: Path) -> None:
    out = tmp_path / "shipped.yaml"
    result = CliRunner().invoke(
        cli,
        [
            "prices",
            "import",
            "--from",
            "litellm",
            str(LITELLM),
            "-o",
            str(out),
            "--effective-from",
            "2027-01-01",
        ],
    )
    assert result.exit_code == 0, result.stderr
    tables = load_price_file(out)
    shipped = load_price_file(default_price_file())
    assert tables[-1].version == "litellm-2027-01-01" and len(tables) == len(shipped) + 1
    assert tables[:-1] == shipped


# -- round trip ------------------------------------------------------------------------

_MATCH = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.:", min_size=1, max_size=24
).filter(lambda m: m == m.strip())


@st.composite
def prices(draw: Any) -> Decimal:
    places = draw(st.integers(0, 14))
    units = draw(st.integers(0, 4 * 10**5 * 10**places))  # under the sanity bound, x2
    return Decimal(units).scaleb(-places)


@st.composite
def model_prices(draw: Any, match: str) -> ModelPrice:
    base = draw(prices())
    tier = None
    if base > 0 and draw(st.booleans()):
        tier = LongContextTier(draw(st.integers(0, 10**7)), draw(prices()), draw(prices()))
    optional = {
        name: draw(st.one_of(st.none(), prices()))
        for name in ("cache_read_per_mtok", "cache_write_per_mtok", "cache_write_1h_per_mtok")
    }
    source = draw(
        st.one_of(
            st.none(),
            st.text(
                st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=80
            ).filter(str.strip),
        )
    )
    names = st.sampled_from(["web_search", "web_fetch", "grounded_prompt", "x_new_unit"])
    per_unit = draw(st.dictionaries(names, prices().filter(lambda d: d <= 1000), max_size=3))
    tiers = draw(
        st.dictionaries(
            st.sampled_from(["batch", "flex", "priority"]),
            prices().filter(lambda d: 0 < d <= 100),
            max_size=2,
        )
    )
    return ModelPrice.of(
        match,
        base,
        draw(prices()),
        long_context=tier,
        source=source,
        unit_prices=per_unit,
        service_tiers=tiers,
        **optional,
    )


@st.composite
def tables(draw: Any) -> list[PriceTable]:
    count = draw(st.integers(1, 3))
    versions = draw(
        st.lists(
            st.text(
                st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20
            ).filter(lambda v: v.strip() == v),
            min_size=count,
            max_size=count,
            unique=True,
        )
    )
    starts = draw(
        st.lists(
            st.datetimes(
                min_value=datetime(2000, 1, 1),
                max_value=datetime(2100, 1, 1),
                timezones=st.just(UTC),
            ),
            min_size=count,
            max_size=count,
        )
    )
    out = []
    for version, start in zip(versions, starts, strict=True):
        matches = draw(st.lists(_MATCH, max_size=6, unique=True))
        models = tuple(draw(model_prices(m)) for m in matches)
        fallback = draw(st.one_of(st.none(), model_prices("*")))
        out.append(PriceTable(version, start, models, fallback))
    return out


def as_exported(tables: list[PriceTable]) -> list[tuple[PriceTable, list[str | None]]]:
    ordered = sorted(tables, key=lambda t: (t.effective_from, t.version))
    return [(t, [m.source for m in t.models]) for t in ordered]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=tables())
def test_export_then_import_round_trips_exactly(
    drawn: list[PriceTable], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("rt") / "prices.yaml"
    text = price_file_text(drawn, header="round trip")
    path.write_text(text, encoding="utf-8")
    back = load_price_file(path)
    assert as_exported(back) == as_exported(drawn)
    # each price's exact digits too (3.00 stays 3.00), and a second export is the same text
    for got, want in zip(
        back, sorted(drawn, key=lambda t: (t.effective_from, t.version)), strict=True
    ):
        assert [prices_of(m) for m in got.models] == [prices_of(m) for m in want.models]
    assert price_file_text(back, header="round trip") == text


def test_an_imported_file_round_trips(tmp_path: Path) -> None:
    tables, _ = imported(tmp_path, "litellm", LITELLM, "--add-new")
    again = tmp_path / "again.yaml"
    again.write_text(price_file_text(tables))
    assert as_exported(load_price_file(again)) == as_exported(tables)


# -- audio, image and per-call units ---------------------------------------------------


def test_litellm_modality_rates_and_per_call_prices_become_exact_unit_prices(
    tmp_path: Path,
) -> None:
    """LiteLLM gives each modality's full rate per token: our unit price is the surcharge
    over the text rate (exact); per-session / per-1k-calls / per-image prices are per unit."""
    doc = """{
      "gpt-realtime-2025-08-28": {"litellm_provider": "openai", "mode": "chat",
        "input_cost_per_token": 4e-06, "output_cost_per_token": 1.6e-05,
        "cache_read_input_token_cost": 4e-07,
        "input_cost_per_audio_token": 3.2e-05, "output_cost_per_audio_token": 6.4e-05,
        "input_cost_per_image_token": 5e-06},
      "gpt-4.1": {"litellm_provider": "openai", "mode": "chat",
        "input_cost_per_token": 2e-06, "output_cost_per_token": 8e-06,
        "code_interpreter_cost_per_session": 0.03, "file_search_cost_per_1k_calls": 2.5},
      "gemini/gemini-2.5-flash-image": {"litellm_provider": "gemini", "mode": "chat",
        "input_cost_per_token": 3e-07, "output_cost_per_token": 2.5e-06,
        "output_cost_per_image_token": 3e-05, "output_cost_per_image": 0.039},
      "gpt-cheap-audio": {"litellm_provider": "openai", "mode": "chat",
        "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
        "input_cost_per_audio_token": 5e-07}
    }"""
    path = tmp_path / "litellm.json"
    path.write_text(doc)
    source = read_source("litellm", path, on=date(2026, 12, 1))
    by_model = {p.model: dict(p.unit_prices) for p in source.prices}
    assert by_model["gpt-realtime-2025-08-28"] == {
        "input_audio_tokens": Decimal("0.000028"),
        "output_audio_tokens": Decimal("0.000048"),
        "input_image_tokens": Decimal("0.000001"),
    }
    assert by_model["gpt-4.1"] == {
        "code_interpreter_session": Decimal("0.03"),
        "file_search": Decimal("0.0025"),
    }
    assert by_model["gemini-2.5-flash-image"] == {
        "output_image_tokens": Decimal("0.0000275"),
        "image_generation": Decimal("0.039"),
    }
    # cheaper than text: no negative price, said so
    assert by_model["gpt-cheap-audio"] == {}
    assert any(
        "gpt-cheap-audio: input_audio_tokens costs less than text" in w for w in source.warnings
    )
    # the imported table prices a realtime call exactly at the source's rates
    new, _ = imported(tmp_path, "litellm", path, "--add-new")
    book = PriceBook(new[-1:])
    cost = book.price(
        "gpt-realtime-2025-08-28",
        at=datetime(2026, 12, 2, tzinfo=UTC),
        input_tokens=2_000_000,
        output_tokens=1_000_000,
        units={"input_audio_tokens": 1_000_000, "output_audio_tokens": 1_000_000},
    ).cost_nanos
    assert cost == (4 + 32 + 64) * 10**9


def test_genai_prices_audio_rates_become_surcharges_and_cached_audio_is_said(
    tmp_path: Path,
) -> None:
    doc = [
        {
            "id": "openai",
            "models": [
                {
                    "id": "gpt-audio",
                    "match": {"starts_with": "gpt-audio"},
                    "prices": {
                        "input_mtok": 2.5,
                        "output_mtok": 10,
                        "input_audio_mtok": 32,
                        "output_audio_mtok": 64,
                        "cache_audio_read_mtok": 0.4,
                    },
                }
            ],
        }
    ]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    source = read_source("genai-prices", path, on=date(2026, 12, 1))
    (price,) = source.prices
    assert dict(price.unit_prices) == {
        "input_audio_tokens": Decimal("0.0000295"),
        "output_audio_tokens": Decimal("0.000054"),
    }
    assert any("cache_audio_read_mtok is not representable" in w for w in source.warnings)


def test_an_import_keeps_our_unit_prices_the_source_does_not_give(tmp_path: Path) -> None:
    """Unit by unit: a source pricing only web searches leaves our other unit prices."""
    base = tmp_path / "base.yaml"
    base.write_text(
        'version: "b1"\neffective_from: "2026-01-01T00:00:00Z"\nmodels:\n'
        '  - {match: gpt-4.1, input_per_mtok: "2.00", output_per_mtok: "8.00",'
        ' unit_prices: {code_interpreter_session: "0.03", web_search: "0.02"}}\n'
    )
    path = tmp_path / "litellm.json"
    path.write_text(
        '{"gpt-4.1": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": '
        '2e-06, "output_cost_per_token": 8e-06, "search_context_cost_per_query": '
        '{"search_context_size_medium": 0.01}}}'
    )
    out = tmp_path / "new.yaml"
    code, _, err = run(
        "import", "--from", "litellm", str(path), "--base", str(base), "-o", str(out),
        "--effective-from", DEC_1,
    )  # fmt: skip
    assert code == 0, err
    newest = load_price_file(out)[-1]
    assert dict(entry(newest, "gpt-4.1").unit_prices) == {
        "code_interpreter_session": Decimal("0.03"),
        "web_search": Decimal("0.01"),
    }


def test_litellm_tier_prices_by_class_become_a_multiplier_and_class_rates(
    tmp_path: Path,
) -> None:
    """``*_batches`` / ``_priority`` prices: a common finite ratio of input and output is
    the tier's multiplier and a class priced otherwise (gpt-5.4's $0.13 batch cached
    input) its own rate; a ratio no decimal can hold (5/3) is carried as rates."""
    litellm = tmp_path / "litellm.json"
    litellm.write_text(
        """{
  "gpt-5.4": {"litellm_provider": "openai", "mode": "chat",
    "input_cost_per_token": 2.5e-06, "output_cost_per_token": 1.5e-05,
    "cache_read_input_token_cost": 2.5e-07,
    "input_cost_per_token_batches": 1.25e-06, "output_cost_per_token_batches": 7.5e-06,
    "cache_read_input_token_cost_batches": 1.3e-07},
  "gpt-4o-mini": {"litellm_provider": "openai", "mode": "chat",
    "input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07,
    "cache_read_input_token_cost": 7.5e-08,
    "input_cost_per_token_priority": 2.5e-07, "output_cost_per_token_priority": 1e-06,
    "cache_read_input_token_cost_priority": 1.25e-07}
}"""
    )
    tables, report = imported(tmp_path, "litellm", litellm, "--add-new")
    new = tables[-1]
    gpt_54 = entry(new, "gpt-5.4")
    assert [(t, str(f)) for t, f in gpt_54.service_tiers] == [("batch", "0.5")]
    assert [(t, [(c, str(r)) for c, r in rates]) for t, rates in gpt_54.service_tier_rates] == [
        ("batch", [("cache_read_per_mtok", "0.13")])
    ]
    mini = entry(new, "gpt-4o-mini")
    assert mini.service_tiers == ()
    assert [(t, [(c, str(r)) for c, r in rates]) for t, rates in mini.service_tier_rates] == [
        (
            "priority",
            [
                ("cache_read_per_mtok", "0.125"),
                ("input_per_mtok", "0.25"),
                ("output_per_mtok", "1"),
            ],
        )
    ]
    book = PriceBook(tables)
    at = datetime(2026, 12, 2, tzinfo=UTC)
    million = 1_000_000
    batch = book.price("gpt-5.4", at=at, cache_read_tokens=million, service_tier="batch")
    assert batch.cost_nanos == 130_000_000
    priority = book.price(
        "gpt-4o-mini", at=at, input_tokens=3, output_tokens=3, service_tier="priority"
    )
    assert priority.cost_nanos == 3 * 250 + 3 * 1000
    code, stdout, _ = run("diff", str(BASE), str(tmp_path / "litellm.yaml"))
    assert code == 1
    lines = stdout.splitlines()
    assert "+ gpt-5.4  service_tier_rates.batch.cache_read_per_mtok  0.13" in lines
    assert "+ gpt-4o-mini  service_tier_rates.priority.input_per_mtok  0.25" in lines
    assert {"gpt-5.4", "gpt-4o-mini"} <= set(report["added"])


def test_litellm_tier_prices_above_the_edge_become_rates_where_scaling_misses(
    tmp_path: Path,
) -> None:
    """``*_above_272k_tokens_batches``: gpt-5.4's batch cached input above the edge is
    $0.25, not twice its $0.13, so it is written as the tier's rate there; its input and
    output there are half the long-context prices (the multiplier says so: no rate), and
    Gemini's batch cached input above 200k doubles as the standard one does (no rate)."""
    litellm = tmp_path / "litellm.json"
    litellm.write_text(
        """{
  "gpt-5.4": {"litellm_provider": "openai", "mode": "chat",
    "input_cost_per_token": 2.5e-06, "output_cost_per_token": 1.5e-05,
    "cache_read_input_token_cost": 2.5e-07,
    "input_cost_per_token_above_272k_tokens": 5e-06,
    "output_cost_per_token_above_272k_tokens": 2.25e-05,
    "input_cost_per_token_batches": 1.25e-06, "output_cost_per_token_batches": 7.5e-06,
    "cache_read_input_token_cost_batches": 1.3e-07,
    "input_cost_per_token_above_272k_tokens_batches": 2.5e-06,
    "output_cost_per_token_above_272k_tokens_batches": 1.125e-05,
    "cache_read_input_token_cost_above_272k_tokens_batches": 2.5e-07},
  "gemini-2.5-pro": {"litellm_provider": "gemini", "mode": "chat",
    "input_cost_per_token": 1.25e-06, "output_cost_per_token": 1e-05,
    "cache_read_input_token_cost": 1.25e-07,
    "input_cost_per_token_above_200k_tokens": 2.5e-06,
    "output_cost_per_token_above_200k_tokens": 1.5e-05,
    "input_cost_per_token_batches": 6.25e-07, "output_cost_per_token_batches": 5e-06,
    "cache_read_input_token_cost_batches": 1.25e-07,
    "cache_read_input_token_cost_above_200k_tokens_batches": 2.5e-07}
}"""
    )
    tables, _ = imported(tmp_path, "litellm", litellm, "--add-new")
    new = tables[-1]
    gpt_54 = entry(new, "gpt-5.4")
    assert [(t, [(c, str(r)) for c, r in rates]) for t, rates in gpt_54.service_tier_rates] == [
        ("batch", [("cache_read_per_mtok", "0.13"), ("long_context_cache_read_per_mtok", "0.25")])
    ]
    gemini = entry(new, "gemini-2.5-pro")
    assert [(t, [c for c, _ in rates]) for t, rates in gemini.service_tier_rates] == [
        ("batch", ["cache_read_per_mtok"])
    ]
    book = PriceBook(tables)
    at = datetime(2026, 12, 2, tzinfo=UTC)
    above = 1_000_000
    gpt = book.price("gpt-5.4", at=at, cache_read_tokens=above, service_tier="batch")
    assert gpt.cost_nanos == 250_000_000
    gem = book.price("gemini-2.5-pro", at=at, cache_read_tokens=above, service_tier="batch")
    assert gem.cost_nanos == 250_000_000

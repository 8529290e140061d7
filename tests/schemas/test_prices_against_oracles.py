"""The shipped prices against the two community maps (issue 36).

``schemas/data/oracle_prices.json`` is what the pinned maps (LiteLLM's wheel, pydantic's
genai-prices) say every current chat model of OpenAI, Anthropic, Gemini and Bedrock costs,
written by ``make prices``; no network here. Wherever the two maps agree with each other,
spendbus charges the same to the nano (plain input and output, cache reads and writes,
past the long-context edge, and each service tier both reprice alike, class by class),
unless ``schemas/data/price_decisions.yaml`` lists the entry with its reason and the
provider page that decides it; a tier its ``one_map_tiers`` takes from one map (a tier
the other does not model) is held to that map. The newest version is what ``make
prices`` makes from the maps.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.pricing import PriceBook, PriceTable, default_price_file
from schemas.pricing.price_file import load_price_file
from schemas.pricing.writer.decisions import load_decisions, load_one_map_tiers, one_map_tiers
from schemas.pricing.writer.generate import (
    DECISIONS_FILE,
    MARKER,
    SNAPSHOT_FILE,
    VERSION,
    agreement,
    generated_version,
)
from schemas.pricing.writer.oracles import PINS, load_snapshot

MAPS = ("litellm", "genai-prices")

DATA = default_price_file().parent
SNAPSHOT = load_snapshot(DATA / SNAPSHOT_FILE)
DECISIONS = {d["match"]: d for d in load_decisions(DATA / DECISIONS_FILE)}
ONE_MAP_TIERS = load_one_map_tiers(DATA / DECISIONS_FILE)
BOOK = PriceBook.from_file()
NEWEST = BOOK.tables[-1]
AT = NEWEST.effective_from
MILLION = 1_000_000


@dataclass(frozen=True)
class Case:
    model: str
    what: str
    expected_nanos: int
    charged_nanos: int
    entry: str | None


def nanos(usd_per_mtok: Decimal, tokens: int = MILLION) -> int:
    exact = usd_per_mtok * tokens * 1000
    assert exact == exact.to_integral_value()  # the probes are chosen to be whole nanos
    return int(exact)


def cases(model: str, agreed: dict[str, Any]) -> list[Case]:
    """Calls of ``model`` whose cost both maps agree on, charged by the shipped book."""
    entry = NEWEST.lookup(model)
    match = None if entry is None else entry.match
    out: list[Case] = []

    def call(what: str, expected: int, **kw: Any) -> None:
        price = BOOK.price(model, at=AT, **kw)
        out.append(Case(model, what, expected, -1 if price.unpriced else price.cost_nanos, match))

    tier = agreed["long_context"]
    # a prompt of n tokens: at the long-context edge at most (exactly at it: the base rates)
    n = MILLION if tier is None else min(MILLION, tier.above_input_tokens)
    call("input", nanos(agreed["input"], n), input_tokens=n)
    call("output", nanos(agreed["output"]), output_tokens=MILLION)
    if "cache_read" in agreed:
        call("cache_read", nanos(agreed["cache_read"], n), cache_read_tokens=n)
    if "cache_write" in agreed:
        call("cache_write", nanos(agreed["cache_write"], n), cache_write_tokens=n)
    if "cache_write_1h" in agreed:
        call(
            "cache_write_1h",
            nanos(agreed["cache_write_1h"], n),
            cache_write_tokens=n,
            cache_write_1h_tokens=n,
        )
    above = (tier.above_input_tokens if tier is not None else 200_000) + MILLION
    expected = nanos(agreed["input"] if tier is None else tier.input_per_mtok, above)
    call("input past the long-context edge", expected, input_tokens=above)
    for name, rates in agreed["tiers"].items():
        call(
            f"{name}: input and output",
            nanos(rates["input"], n) + nanos(rates["output"]),
            input_tokens=n,
            output_tokens=MILLION,
            service_tier=name,
        )
        if "cache_read" in rates:  # both maps (or the one map a rule names) give it
            call(
                f"{name}: cache_read",
                nanos(rates["cache_read"], n),
                cache_read_tokens=n,
                service_tier=name,
            )
        if tier is None:
            continue
        # the tier past the long-context edge, class by class where the maps give it
        for cls, kw in (
            ("input", {"input_tokens": above}),
            ("cache_read", {"input_tokens": 0, "cache_read_tokens": above}),
        ):
            if f"long_context_{cls}" in rates:
                call(
                    f"{name}: {cls} past the long-context edge",
                    nanos(rates[f"long_context_{cls}"], above),
                    service_tier=name,
                    **kw,
                )
        if "long_context_output" in rates:
            call(
                f"{name}: output past the long-context edge",
                nanos(rates["long_context_input"], above) + nanos(rates["long_context_output"]),
                input_tokens=above,
                output_tokens=MILLION,
                service_tier=name,
            )
    return out


def all_cases() -> list[Case]:
    out: list[Case] = []
    for model, rates in SNAPSHOT["models"].items():
        agreed, _ = agreement(rates)
        if agreed is not None:
            tiers = {**agreed["tiers"], **one_map_tiers(model, rates, ONE_MAP_TIERS)}
            out.extend(cases(model, {**agreed, "tiers": tiers}))
    return out


def excused(case: Case) -> bool:
    """A deliberate difference: the entry's decision, for every call or for this one."""
    decision = DECISIONS.get(case.entry or "")
    return decision is not None and ("cases" not in decision or case.what in decision["cases"])


CASES = all_cases()


def test_the_snapshot_is_the_pinned_maps_and_large_enough_to_mean_something() -> None:
    assert SNAPSHOT["pins"] == {name: f"{name}=={version}" for name, version in PINS.items()}
    both = [m for m, r in SNAPSHOT["models"].items() if agreement(r)[0] is not None]
    assert len(both) > 100 and len(CASES) > 500


def test_where_both_maps_agree_spendbus_charges_the_same_to_the_nano() -> None:
    wrong = [
        f"{c.model} {c.what}: {c.charged_nanos} (entry {c.entry}), the maps {c.expected_nanos}"
        for c in CASES
        if c.charged_nanos != c.expected_nanos and not excused(c)
    ]
    assert wrong == []


def test_each_deliberate_difference_is_a_real_one_with_its_reason_and_page() -> None:
    differing = {(c.entry, c.what) for c in CASES if c.charged_nanos != c.expected_nanos}
    for match, decision in DECISIONS.items():
        assert decision["reason"].strip() and decision["page"].startswith("https://")
        named = decision.get("cases") or [what for entry, what in differing if entry == match]
        for what in named:
            assert (match, what) in differing, f"{match} {what}: agrees with both maps"
        assert named, f"{match}: agrees with both maps: no decision needed"


@pytest.mark.parametrize(
    ("model", "what", "nanos"),
    [
        # a class a tier bills apart from its multiplier (PriceTable v3); a prompt at the
        # long-context edge: 272k tokens at $0.13 / M, 200k at $0.20 / M
        ("gpt-5.4", "batch: cache_read", 35_360_000),
        ("gpt-5.4", "flex: cache_read", 35_360_000),
        ("gemini-2.5-flash-lite", "batch: cache_read", 10_000_000),
        ("gemini-3.1-pro-preview", "batch: cache_read", 40_000_000),
        # past the edge (1.272M tokens): OpenAI's own batch/flex cached rate there, $0.25
        # / M (not twice $0.13); Gemini's batch cached rate doubles as its standard one
        ("gpt-5.4", "batch: cache_read past the long-context edge", 318_000_000),
        ("gpt-5.4", "flex: cache_read past the long-context edge", 318_000_000),
        ("gpt-5.4", "batch: output past the long-context edge", 3_180_000_000 + 11_250_000_000),
        ("gemini-3.1-pro-preview", "batch: cache_read past the long-context edge", 480_000_000),
        # 5/3 of every price: no finite multiplier, carried as rates
        ("gpt-4o-mini", "priority: input and output", 250_000_000 + 1_000_000_000),
        ("gpt-4o-mini", "priority: cache_read", 125_000_000),
        # Gemini flex and priority, from the one map that models them
        ("gemini-2.5-flash-lite", "flex: input and output", 50_000_000 + 200_000_000),
        ("gemini-2.5-flash-lite", "priority: input and output", 180_000_000 + 720_000_000),
        ("gemini-2.5-flash-lite", "flex: cache_read", 10_000_000),
        ("gemini-3.5-flash", "flex: cache_read", 80_000_000),
    ],
)
def test_tiers_once_left_out_or_excused_are_charged_as_billed(
    model: str, what: str, nanos: int
) -> None:
    """Each is a case the test checks (not excused) and charges what the maps say."""
    [case] = [c for c in CASES if (c.model, c.what) == (model, what)]
    assert not excused(case)
    assert case.charged_nanos == case.expected_nanos == nanos


def test_no_model_both_maps_price_is_priced_as_another() -> None:
    """Each is priced by its own entry: the entry is the id (as carried or normalised)
    less a snapshot suffix, never a neighbour's."""
    for model, rates in SNAPSHOT["models"].items():
        if agreement(rates)[0] is None:
            continue
        why = NEWEST.explain(model)
        assert why["rule"] in {"exact", "snapshot"}, (model, why)
        assert why["form"] == why["entry"] + why["suffix"], (model, why)


def hand_written() -> PriceTable:
    text = default_price_file().read_text(encoding="utf-8")
    head, marker, _ = text.partition(MARKER + "\n")
    assert marker, "the shipped file has the generated version's marker"
    return max(load_price_file_text(head), key=lambda t: (t.effective_from, t.version))


def load_price_file_text(text: str) -> list[PriceTable]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prices.yaml"
        path.write_text(text, encoding="utf-8")
        return load_price_file(path)


def test_the_newest_version_is_what_make_prices_makes_of_the_maps() -> None:
    assert NEWEST.version == VERSION
    made, _, _ = generated_version(
        hand_written(), SNAPSHOT, list(DECISIONS.values()), ONE_MAP_TIERS
    )
    assert {m.match: m for m in made.models} == {m.match: m for m in NEWEST.models}


@pytest.mark.parametrize(
    ("model", "own"),
    [
        ("gpt-5.4-2026-03-05", "gpt-5.4"),
        ("gpt-5.5", "gpt-5.5"),
        ("claude-opus-4-6", "claude-opus-4-6"),
        ("us.anthropic.claude-sonnet-4-6", "anthropic.claude-sonnet-4-6"),
        ("global.anthropic.claude-sonnet-4-6", "global.anthropic.claude-sonnet-4-6"),
        ("us.openai.gpt-5.5", "openai.gpt-5.5"),  # Bedrock's regional rate, not OpenAI's
    ],
)
def test_current_models_the_prefixes_used_to_misprice_have_their_own_entry(
    model: str, own: str
) -> None:
    entry = NEWEST.lookup(model)
    assert entry is not None and entry.match in {own, f"{model.split('.')[0]}.{own}"}
    assert entry.source is not None or own.startswith(("anthropic.", "global."))


def test_every_entry_of_the_generated_version_says_where_its_prices_came_from() -> None:
    hand = {m.match: m for m in hand_written().models}
    for entry in NEWEST.models:
        if hand.get(entry.match) != entry:  # made or changed by make prices
            assert entry.source, entry.match


def test_sonnet_4_6_is_flat_across_its_window_from_2026_03_13() -> None:
    from datetime import UTC, datetime

    before = datetime(2026, 3, 12, tzinfo=UTC)
    after = datetime(2026, 3, 13, tzinfo=UTC)
    tokens = 300_000  # above 200k
    assert (
        BOOK.price("claude-sonnet-4-6", at=before, input_tokens=tokens).cost_nanos == 1_800_000_000
    )
    assert BOOK.price("claude-sonnet-4-6", at=after, input_tokens=tokens).cost_nanos == 900_000_000
    # Bedrock: the geography profile at the regional rate, the global one at list
    assert (
        BOOK.price("us.anthropic.claude-sonnet-4-6", at=after, input_tokens=MILLION).cost_nanos
        == 3_300_000_000
    )
    assert (
        BOOK.price("global.anthropic.claude-sonnet-4-6", at=after, input_tokens=MILLION).cost_nanos
        == 3_000_000_000
    )


def test_load_price_file_reads_the_shipped_file() -> None:
    versions = [t.version for t in load_price_file(default_price_file())]
    assert versions[-1] == VERSION and len(versions) >= 3


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"map": "litellm", "models_starting": "gemini-", "tiers": ["flex"]}, "needs map"),
        (
            {"map": "openrouter", "models_starting": "g", "tiers": ["flex"], "reason": "r"},
            "field 'map'",
        ),
        (
            {"map": "litellm", "models_starting": "g", "tiers": ["turbo"], "reason": "r"},
            "field 'tiers'",
        ),
        (
            {"map": "litellm", "models_starting": "g", "tiers": ["flex"], "reason": " "},
            "the reason and the provider page",
        ),
    ],
)
def test_a_one_map_tier_rule_names_its_map_tiers_reason_and_page(
    tmp_path: Path, rule: dict[str, Any], says: str
) -> None:
    from schemas.errors import ConfigError

    if "reason" in rule:
        rule = {**rule, "page": "https://ai.google.dev/gemini-api/docs/pricing"}
    path = tmp_path / "decisions.yaml"
    path.write_text(yaml.safe_dump({"decisions": [], "one_map_tiers": [rule]}))
    with pytest.raises(ConfigError, match="one_map_tiers") as raised:
        load_one_map_tiers(path)
    assert says in str(raised.value)


def test_a_one_map_tier_is_taken_only_where_the_other_map_lacks_it() -> None:
    [rule] = ONE_MAP_TIERS
    lite = SNAPSHOT["models"]["gemini-2.5-flash-lite"]
    assert set(one_map_tiers("gemini-2.5-flash-lite", lite, [rule])) == {"flex", "priority"}
    both = {name: {**lite[name], "tiers": lite["litellm"]["tiers"]} for name in MAPS}
    assert one_map_tiers("gemini-2.5-flash-lite", both, [rule]) == {}  # agreement decides
    assert one_map_tiers("gpt-5.4", SNAPSHOT["models"]["gpt-5.4"], [rule]) == {}

"""Which entry prices a model: its id and that id's snapshot forms, never another version.

Issue 36: a ``gpt-5`` prefix priced gpt-5.4 ... gpt-5.6 at gpt-5's price and
``claude-sonnet-4`` priced Sonnet 4.6 with 4's long-context premium. An entry now prices
its id and the id's snapshot forms only (schemas/pricing/model_ids.py); a model no entry
prices is unpriced, for the budget's unpriced policy to decide. The property tests draw
ids from the providers' id grammars: a snapshot form of X prices as X, and a different
version (or variant) never prices as X.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.pricing import ModelPrice, PriceBook, is_snapshot_suffix
from spendbus.commands.pricing import price
from tests.schemas.kit import AT, table


def entry(match: str) -> ModelPrice:
    return ModelPrice.of(match, "1", "2")


# --- examples -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "entry_id"),
    [
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-5-chat-latest", "gpt-5-chat"),
        ("gpt-4o-audio-preview-2024-12-17", "gpt-4o-audio"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-1106-preview", "gpt-4"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-sonnet-4-0", "claude-sonnet-4"),
        ("claude-sonnet-4@20250514", "claude-sonnet-4"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("us.anthropic.claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("eu.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet"),
        ("anthropic.claude-3-5-sonnet-20240620-v1:0:200k", "claude-3-5-sonnet"),
        ("openai.gpt-oss-120b-1:0", "gpt-oss-120b"),
        ("models/gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"),
        ("gemini-2.5-flash-lite-preview-09-2025", "gemini-2.5-flash-lite"),
        ("gemini-2.0-flash-001", "gemini-2.0-flash"),
        ("gemini-3-pro-preview", "gemini-3-pro"),
        ("ft:gpt-4o-mini-2024-07-18:acme:support:AbC123", "ft:gpt-4o-mini"),
    ],
)
def test_a_snapshot_form_prices_as_its_model(model: str, entry_id: str) -> None:
    t = table(entry(entry_id))
    found = t.lookup(model)
    assert found is not None and found.match == entry_id
    assert t.explain(model)["rule"] in {"exact", "snapshot"}


@pytest.mark.parametrize(
    ("model", "entry_id"),
    [
        ("gpt-5.5", "gpt-5"),
        ("gpt-5.4-mini", "gpt-5"),
        ("gpt-5.4-mini-2026-03-17", "gpt-5"),
        ("gpt-5-codex", "gpt-5"),
        ("gpt-5-mini", "gpt-5"),
        ("global.openai.gpt-5.4", "gpt-5"),
        ("claude-sonnet-4-6", "claude-sonnet-4"),
        ("us.anthropic.claude-sonnet-4-6", "claude-sonnet-4"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4"),
        ("claude-opus-4-1", "claude-opus-4"),
        ("gemini-2.5-flash-lite", "gemini-2.5-flash"),
        ("gemini-2.5-flash-preview-tts", "gemini-2.5-flash"),
        ("gpt-4o-mini-tts", "gpt-4o-mini"),
        ("gpt-4o-mini", "gpt-4o"),
        ("gpt-3.5-turbo-16k", "gpt-3.5-turbo"),
        ("amazon.nova-2-lite-v1:0", "amazon.nova-lite"),
        ("mistral.mistral-large-2407-v1:0", "mistral.mistral-large"),
        ("ft:gpt-4o-mini:acme::x", "ft:gpt-4o"),
    ],
)
def test_another_version_is_unpriced_not_priced_as_its_neighbour(model: str, entry_id: str) -> None:
    t = table(entry(entry_id))
    assert t.lookup(model) is None
    assert t.explain(model)["rule"] == "unpriced"
    b = PriceBook([t])
    assert b.price(model, at=AT, input_tokens=1000).unpriced
    assert b.unpriced_models([model], AT) == [model]


def test_the_longest_entry_that_prices_a_form_wins() -> None:
    t = table(entry("gpt-4o"), entry("gpt-4o-2024-05-13"), entry("gpt-4o-mini"))
    assert t.lookup("gpt-4o-2024-05-13").match == "gpt-4o-2024-05-13"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4o-2024-08-06").match == "gpt-4o"  # type: ignore[union-attr]  # the model is priced: found
    assert t.lookup("gpt-4o-mini-2024-07-18").match == "gpt-4o-mini"  # type: ignore[union-attr]  # the model is priced: found


def test_snapshot_suffix_grammar() -> None:
    for rest in ("", "-2025-08-07", "-20250929", "-latest", "-preview", "-preview-05-20",
                 "-preview-09-2025", "-exp-0827", "-0613", "-001", "-v1:0", "-v2", "-1:0",
                 "-20241022-v2:0", "-v1:0:200k", "-0", "-0-20250514", "-1106-preview"):  # fmt: skip
        assert is_snapshot_suffix(rest), rest
    for rest in (".5", "-5", "-4-6", "-mini", "-codex", "-chat-latest", "-lite", "-tts",
                 "-2407", "-16k", "-1", "-12", "5", ":acme::x", "-search-preview",
                 "-2025-08-07-mini"):  # fmt: skip
        assert not is_snapshot_suffix(rest), rest


# --- the shipped file -----------------------------------------------------------------

#: current ids (both community maps list them) a broad prefix used to price as another
#: model, and the model each is: priced by that model's entry or unpriced, never another's
CROSSINGS = {
    "gpt-5.3-codex": "gpt-5.3-codex",
    "gpt-5.4": "gpt-5.4",
    "gpt-5.4-mini-2026-03-17": "gpt-5.4-mini",
    "gpt-5.4-nano": "gpt-5.4-nano",
    "gpt-5.4-pro": "gpt-5.4-pro",
    "gpt-5.5": "gpt-5.5",
    "gpt-5.5-pro-2026-04-23": "gpt-5.5-pro",
    "gpt-5.6": "gpt-5.6",
    "gpt-5.6-luna": "gpt-5.6-luna",
    "us.openai.gpt-5.5": "gpt-5.5",
    "claude-sonnet-4-6": "claude-sonnet-4-6",
    "us.anthropic.claude-sonnet-4-6": "claude-sonnet-4-6",
    "claude-opus-4-6": "claude-opus-4-6",
    "gpt-3.5-turbo-16k": "gpt-3.5-turbo-16k",
    "gemini-2.5-pro-preview-tts": "gemini-2.5-pro-tts",
}


@pytest.mark.parametrize(("model", "own"), sorted(CROSSINGS.items()))
def test_the_shipped_file_prices_no_model_as_another(model: str, own: str) -> None:
    for t in PriceBook.from_file().tables:
        found = t.lookup(model)
        if found is not None:  # its own entry, maybe a Bedrock one (anthropic.<own>)
            assert found.match == own or found.match.endswith("." + own), (model, found.match)


# --- spendbus price --explain ---------------------------------------------------------


def test_price_explain_names_the_rule_the_entry_and_the_form() -> None:
    def explain(model: str) -> dict[str, object]:
        result = CliRunner().invoke(price, ["--model", model, "--explain", "--input-tokens", "1"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert isinstance(out["explain"], dict)
        return out["explain"]

    why = explain("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert why["rule"] == "snapshot"
    assert why["entry"] == "anthropic.claude-sonnet-4-5"
    assert why["step"] == "geography label removed"
    assert why["form"] == "anthropic.claude-sonnet-4-5-20250929-v1:0"
    assert why["suffix"] == "-20250929-v1:0"
    assert explain("gpt-5-mini")["rule"] == "exact"
    unpriced = explain("gpt-5.9-ultra")
    assert unpriced["rule"] == "unpriced" and unpriced["entry"] is None
    assert unpriced["forms_tried"] == [{"step": "as carried", "form": "gpt-5.9-ultra"}]


# --- property tests over the providers' id grammars -----------------------------------

_digit = st.integers(min_value=1, max_value=12)
_year = st.integers(min_value=2023, max_value=2029)
_month = st.integers(min_value=1, max_value=12)
_day = st.integers(min_value=1, max_value=28)


@st.composite
def openai_id(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        head = f"gpt-{draw(_digit)}"
        if draw(st.booleans()):
            head += f".{draw(st.integers(min_value=1, max_value=9))}"
    else:
        head = f"o{draw(_digit)}"
    variant = draw(
        st.sampled_from(["", "-mini", "-nano", "-pro", "-codex", "-codex-max", "-chat", "-turbo"])
    )
    return head + variant


@st.composite
def anthropic_id(draw: st.DrawFn) -> str:
    family = draw(st.sampled_from(["opus", "sonnet", "haiku"]))
    major = draw(st.integers(min_value=3, max_value=9))
    minor = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=9)))
    if draw(st.booleans()):
        return f"claude-{family}-{major}" + ("" if minor is None else f"-{minor}")
    return f"claude-{major}" + ("" if minor is None else f"-{minor}") + f"-{family}"


@st.composite
def gemini_id(draw: st.DrawFn) -> str:
    major = draw(st.integers(min_value=1, max_value=5))
    version = f"{major}.{draw(st.integers(min_value=0, max_value=9))}"
    if draw(st.booleans()):
        version = str(major)
    variant = draw(
        st.sampled_from(["pro", "flash", "flash-lite", "flash-image", "pro-image", "flash-8b"])
    )
    return f"gemini-{version}-{variant}"


@st.composite
def bedrock_native_id(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return f"amazon.nova-{draw(st.sampled_from(['', '2-']))}" + draw(
            st.sampled_from(["lite", "pro", "micro", "premier", "sonic"])
        )
    size = draw(st.sampled_from(["8b", "70b", "17b"]))
    return f"meta.llama{draw(_digit)}-{draw(_digit)}-{size}-instruct"


@st.composite
def snapshot_of(draw: st.DrawFn, model: str) -> str:
    """One of ``model``'s snapshot forms, as its provider writes them."""
    y, m, d = draw(_year), draw(_month), draw(_day)
    if model.startswith("claude-"):
        date = f"{y}{m:02}{d:02}"
        form = draw(
            st.sampled_from(
                [
                    model,
                    f"{model}-{date}",
                    f"{model}-latest",
                    f"{model}@{date}",
                    f"{model.upper()}-{date}",
                    f"anthropic.{model}-{date}-v{draw(_digit)}:0",
                    f"{draw(st.sampled_from(['us', 'eu', 'apac', 'global', 'jp']))}"
                    f".anthropic.{model}-{date}-v1:0",
                    f"arn:aws:bedrock:us-east-1::foundation-model/anthropic.{model}-v1:0:200k",
                ]
            )
        )
        return form
    if model.startswith("gemini-"):
        return draw(
            st.sampled_from(
                [
                    model,
                    f"models/{model}",
                    f"{model}-preview",
                    f"{model}-preview-{m:02}-{d:02}",
                    f"{model}-preview-{m:02}-{y}",
                    f"{model}-exp",
                    f"{model}-00{draw(st.integers(min_value=1, max_value=9))}",
                    f"publishers/google/models/{model}-001",
                ]
            )
        )
    if model.startswith(("amazon.", "meta.")):
        geo = draw(st.sampled_from(["", "us.", "eu.", "apac."]))
        return f"{geo}{model}-v{draw(_digit)}" + draw(st.sampled_from(["", ":0", ":0:128k"]))
    return draw(
        st.sampled_from(
            [
                model,
                f"{model}-{y}-{m:02}-{d:02}",
                f"{model}-latest",
                f"{model}-preview",
                f"{model}-preview-{y}-{m:02}-{d:02}",
                f"{model}-{m:02}{d:02}",
                f"openai/{model}",
            ]
        )
    )


ANY_ID = st.one_of(openai_id(), anthropic_id(), gemini_id(), bedrock_native_id())


@settings(max_examples=400, deadline=None)
@given(st.data(), ANY_ID, st.lists(ANY_ID, max_size=6))
def test_a_snapshot_form_of_x_prices_as_x(data: st.DataObject, x: str, others: list[str]) -> None:
    t = table(*(entry(m) for m in dict.fromkeys([x, *others])))
    form = data.draw(snapshot_of(x))
    found = t.lookup(form)
    assert found is not None and found.match == x, (form, t.explain(form))


@settings(max_examples=400, deadline=None)
@given(st.data(), ANY_ID, ANY_ID)
def test_a_different_version_never_prices_as_x(data: st.DataObject, x: str, y: str) -> None:
    if x == y:
        return
    form = data.draw(snapshot_of(y))
    t = table(entry(x))
    assert t.lookup(form) is None, (x, form, t.explain(form))
    # nor when y has an entry of its own: then y's entry prices it
    both = table(entry(x), entry(y))
    assert both.lookup(form).match == y  # type: ignore[union-attr]  # the model is priced: found

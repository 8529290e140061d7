"""Bad input never counts twice nor silently: malformed and partial reports, missing
mappings, repeated and overlapping imports (on the real embedded ClickHouse)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconcile import (
    CostCell,
    LedgerCell,
    ReconcileStore,
    ReportError,
    effective_price_map,
    import_report,
    long_context_sql,
    mapping_from_data,
    match,
    match_costs,
    open_store,
    price_map_text,
    read_cost_report,
    read_report,
)
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DAY = date(2026, 11, 3)


def unix(day: date) -> int:
    return int(datetime.combine(day, datetime.min.time(), UTC).timestamp())


def openai_page(days: dict[date, int], *, has_more: bool = False) -> dict[str, Any]:
    """One page of OpenAI's completions usage: ``output`` tokens per day for key_a/gpt-4o."""
    return {
        "object": "page",
        "data": [
            {
                "object": "bucket",
                "start_time": unix(day),
                "end_time": unix(day + timedelta(days=1)),
                "results": [
                    {
                        "object": "organization.usage.completions.result",
                        "input_tokens": 1000,
                        "output_tokens": output,
                        "input_cached_tokens": 400,
                        "num_model_requests": 3,
                        "project_id": "proj_a",
                        "api_key_id": "key_a",
                        "model": "gpt-4o",
                        "batch": False,
                    }
                ],
            }
            for day, output in days.items()
        ],
        "has_more": has_more,
        "next_page": "next" if has_more else None,
    }


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ReconcileStore]:
    opened = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        yield opened
    finally:
        opened.close()


def test_openai_input_splits_out_its_cached_tokens() -> None:
    (row,) = read_report("openai", openai_page({DAY: 50}), "t").rows
    assert row.tokens == {
        "input": 600,
        "cache_read": 400,
        "cache_write_5m": 0,
        "cache_write_1h": 0,
        "output": 50,
    }
    assert (row.requests, row.tier, row.project) == (3, "standard", "proj_a")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(data="x"), 'expected a page {"data"'),
        (lambda p: p.pop("has_more"), "has_more must be true or false"),
        (lambda p: p["data"][0]["results"][0].update(api_key_id=None), "group_by[]=api_key_id"),
        (lambda p: p["data"][0]["results"][0].update(batch=None), "group_by[]=batch"),
        (lambda p: p["data"][0]["results"][0].update(output_tokens=-1), "output_tokens must be"),
        (lambda p: p["data"][0]["results"][0].update(input_cached_tokens=2000), "exceed"),
        (lambda p: p["data"][0].update(start_time=unix(DAY) + 3600), "not a UTC day"),
        (lambda p: p["data"].append(copy.deepcopy(p["data"][0])), "given twice"),
        (lambda p: p.update(has_more=True, next_page="abc"), "partial report"),
    ],
)
def test_a_malformed_or_partial_report_is_refused_naming_the_problem(
    change: Any, message: str
) -> None:
    page = openai_page({DAY: 50})
    change(page)
    with pytest.raises(ReportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_report("openai", page, "t")


def test_an_anthropic_report_reads_its_cache_writes_by_ttl_and_its_tier() -> None:
    page = {
        "data": [
            {
                "starting_at": "2026-11-03T00:00:00Z",
                "ending_at": "2026-11-04T00:00:00Z",
                "results": [
                    {
                        "uncached_input_tokens": 10,
                        "cache_creation": {
                            "ephemeral_5m_input_tokens": 5,
                            "ephemeral_1h_input_tokens": 7,
                        },
                        "cache_read_input_tokens": 3,
                        "output_tokens": 20,
                        "api_key_id": "apikey_a",
                        "workspace_id": None,
                        "model": "claude-sonnet-4-5",
                        "service_tier": "batch",
                        "context_window": "0-200k",
                    }
                ],
            }
        ],
        "has_more": False,
        "next_page": None,
    }
    (row,) = read_report("anthropic", page, "t").rows
    assert row.tokens == {
        "input": 10,
        "cache_read": 3,
        "cache_write_5m": 5,
        "cache_write_1h": 7,
        "output": 20,
    }
    assert (row.tier, row.requests) == ("batch", None)
    del page["data"][0]["results"][0]["service_tier"]  # type: ignore[index]  # the page is Any
    with pytest.raises(ReportError, match="grouped by service_tier"):
        read_report("anthropic", page, "t")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "expected 'credentials:'"),
        ({"credentials": {"sk": {"provider": "mistral", "api_key_id": "k"}}}, "provider must be"),
        ({"credentials": {"sk": {"provider": "openai"}}}, "api_key_id is required"),
        (
            {
                "credentials": {
                    "a": {"provider": "openai", "api_key_id": "k"},
                    "b": {"provider": "openai", "api_key_id": "k"},
                }
            },
            "already mapped to a",
        ),
        (
            {
                "credentials": {
                    "a": [
                        {"provider": "openai", "api_key_id": "k"},
                        {"provider": "openai", "api_key_id": "j"},
                    ]
                }
            },
            r"credentials.a\[1\]: a second openai key for a",
        ),
        ({"credentials": {"a": [{"provider": "openai"}]}}, r"a\[0\]: api_key_id is required"),
    ],
)
def test_a_bad_mapping_is_refused_naming_the_entry(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        mapping_from_data(data, "m.yaml")


@pytest.mark.parametrize("model", ["x' OR 1 = 1 --", "gpt-4o\\'", "", "a b"])
def test_a_report_model_that_is_no_plain_id_never_reaches_the_ledgers_sql(model: str) -> None:
    assert long_context_sql("anthropic", DAY, model, "standard", 200_000) is None
    assert long_context_sql("anthropic", DAY, "claude-sonnet-4-6", "standard", 200_000)


def test_one_credential_maps_a_key_of_each_provider_it_is_sent_to() -> None:
    mapping = mapping_from_data(
        {
            "credentials": {
                "sk": [
                    {"provider": "openai", "api_key_id": "key_a"},
                    {"provider": "gemini", "project_id": "proj-a"},
                ]
            }
        },
        "m",
    )
    assert mapping.key_of("sk", "openai") == "key_a"
    assert mapping.key_of("sk", "gemini") == "proj-a"
    assert mapping.key_of("sk", "anthropic") is None
    assert mapping.secret_of("gemini", "proj-a") == "sk"


def test_a_credential_with_no_mapping_is_a_named_gap_on_both_sides() -> None:
    mapping = mapping_from_data({"credentials": {}}, "m")
    report = read_report("openai", openai_page({DAY: 50}), "t")
    ledger = {(DAY, "sk-unmapped", "gpt-4o", "standard"): LedgerCell(requests=3)}
    cells = match("openai", report.days, report.rows, ledger, mapping)
    assert [(c.credential, c.api_key_id, c.causes) for c in cells] == [
        ("", "key_a", ["unmapped_credential"]),
        ("sk-unmapped", "", ["unmapped_credential"]),
    ]


def test_a_cache_ttl_split_and_an_unexplained_delta_are_told_apart() -> None:
    mapping = mapping_from_data(
        {"credentials": {"sk": {"provider": "openai", "api_key_id": "key_a"}}}, "m"
    )
    report = read_report("openai", openai_page({DAY: 50}), "t")
    agreeing = {"input": 600, "cache_read": 400, "cache_write_5m": 0, "cache_write_1h": 0}
    exact = LedgerCell(requests=3, tokens=agreeing | {"output": 50})
    short = LedgerCell(requests=3, tokens=agreeing | {"output": 45})
    (cell,) = match(
        "openai", report.days, report.rows, {(DAY, "sk", "gpt-4o", "standard"): exact}, mapping
    )
    assert cell.causes == [] and not any(cell.residual.values())
    (cell,) = match(
        "openai", report.days, report.rows, {(DAY, "sk", "gpt-4o", "standard"): short}, mapping
    )
    assert cell.causes == ["unexplained"] and cell.residual["output"] == 5
    report.rows[0].tokens.update(cache_write_5m=0, cache_write_1h=30)
    ttl = LedgerCell(requests=3, tokens=agreeing | {"output": 50, "cache_write_5m": 30})
    (cell,) = match(
        "openai", report.days, report.rows, {(DAY, "sk", "gpt-4o", "standard"): ttl}, mapping
    )
    assert cell.causes == ["cache_ttl"] and not any(cell.residual.values())


def output_by_day(store: ReconcileStore) -> dict[date, int]:
    rows = store.provider_usage("openai", DAY - timedelta(days=30), DAY + timedelta(days=30))
    return {row.day: row.tokens["output"] for row in rows}


def test_repeated_and_overlapping_imports_replace_and_never_add(store: ReconcileStore) -> None:
    first = {DAY: 50, DAY + timedelta(days=1): 60}
    import_report(store, read_report("openai", openai_page(first), "a"), "a")
    import_report(store, read_report("openai", openai_page(first), "a"), "a")
    assert output_by_day(store) == first
    # a later report covering the second day and a third: the second day is replaced
    later = {DAY + timedelta(days=1): 70, DAY + timedelta(days=2): 80}
    import_report(store, read_report("openai", openai_page(later), "b"), "b")
    assert output_by_day(store) == {DAY: 50, **later}
    # a day the provider now reports empty is covered too: its old rows stop counting
    empty = openai_page({DAY: 0})
    empty["data"][0]["results"] = []
    import_report(store, read_report("openai", empty, "c"), "c")
    assert output_by_day(store) == later
    assert store.covered_days("openai") == [DAY + timedelta(days=n) for n in range(3)]


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPENDBUS_HOME": str(home),
        "SPENDBUS_PURE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "spendbus", "reconcile", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_cli_imports_a_report_once_and_refuses_a_partial_one(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps([openai_page({DAY: 50}, has_more=True), openai_page({})]))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(openai_page({DAY + timedelta(days=1): 9}, has_more=True)))
    done = run_cli("import", "--provider", "openai", str(good), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 row(s), 1 day(s) 2026-11-03..2026-11-03" in done.stdout
    refused = run_cli("import", "--provider", "openai", str(partial), home=tmp_path)
    assert refused.returncode == 2
    assert "partial report: has_more is true" in refused.stdout + refused.stderr
    reopened = open_store(f"chdb://{tmp_path / 'reconcile'}")
    try:
        assert output_by_day(reopened) == {DAY: 50}
    finally:
        reopened.close()


def cost_page(results: list[dict[str, Any]], *, openai: bool) -> dict[str, Any]:
    bucket: dict[str, Any] = (
        {"object": "bucket", "start_time": unix(DAY), "end_time": unix(DAY) + 86_400}
        if openai
        else {"starting_at": "2026-11-03T00:00:00Z", "ending_at": "2026-11-04T00:00:00Z"}
    )
    return {"data": [bucket | {"results": results}], "has_more": False, "next_page": None}


def test_cost_reports_read_exactly_to_the_nano_by_model_tier_and_class() -> None:
    openai = cost_page(
        [
            {"amount": {"value": 0.00123456, "currency": "usd"}, "line_item": "gpt-4o, input"},
            {"amount": {"value": 0.5, "currency": "usd"}, "line_item": "gpt-4o, batch output"},
            {"amount": {"value": 2, "currency": "usd"}, "line_item": "web search tool calls"},
        ],
        openai=True,
    )
    rows = read_cost_report("openai", openai, "t").rows
    assert [(r.model, r.tier, r.token_class, r.nanos) for r in rows] == [
        ("gpt-4o", "standard", "input", 1_234_560),
        ("gpt-4o", "batch", "output", 500_000_000),
        ("", "standard", "other", 2_000_000_000),
    ]
    anthropic = cost_page(
        [
            {
                "currency": "USD",
                "amount": "123.45",  # cents: $1.2345
                "description": "Claude Sonnet 4.5 Usage - Input Tokens",
                "cost_type": "tokens",
                "model": "claude-sonnet-4-5",
                "service_tier": "batch",
                "token_type": "cache_creation.ephemeral_1h_input_tokens",
            }
        ],
        openai=False,
    )
    (row,) = read_cost_report("anthropic", anthropic, "t").rows
    assert (row.model, row.tier, row.token_class, row.nanos) == (
        "claude-sonnet-4-5",
        "batch",
        "cache_write_1h",
        1_234_500_000,
    )


@pytest.mark.parametrize(
    ("provider", "result", "message"),
    [
        ("openai", {"amount": {"value": "1"}, "line_item": "gpt-4o, input"}, "amount.value"),
        ("openai", {"amount": {"value": -1}, "line_item": "gpt-4o, input"}, "not a cost >= 0"),
        ("openai", {"amount": {"value": 1}}, r"group_by\[\]=line_item"),
        ("openai", {"amount": {"value": 1, "currency": "eur"}, "line_item": "x"}, "only usd"),
        ("anthropic", {"amount": 12}, "cents as a decimal string"),
        ("anthropic", {"amount": "abc"}, "cents as a decimal string"),
        ("anthropic", {"amount": "1", "description": None}, r"group_by\[\]=description"),
        ("anthropic", {"amount": "1", "currency": "EUR"}, "only USD"),
    ],
)
def test_a_malformed_cost_report_is_refused_naming_the_field(
    provider: str, result: dict[str, Any], message: str
) -> None:
    with pytest.raises(ReportError, match=message):
        read_cost_report(provider, cost_page([result], openai=provider == "openai"), "t")


def test_only_a_price_cause_at_the_standard_tier_makes_a_billed_rate() -> None:
    def cell(model: str, tier: str, classes: dict[str, int], tokens: dict[str, int]) -> CostCell:
        return CostCell(
            "anthropic",
            DAY,
            model,
            tier,
            provider_nanos=sum(classes.values()),
            spendbus_nanos=1,
            provider_classes=classes,
            provider_tokens=tokens,
            causes=["price"],
        )

    cells = [
        cell(
            "m-priced", "standard", {"input": 36_000, "output": 120_000}, {"input": 3, "output": 2}
        ),
        cell("m-batch", "batch", {"input": 6, "output": 6}, {"input": 1, "output": 1}),
        cell("m-no-output", "standard", {"input": 6}, {"input": 1, "output": 0}),
    ]
    entries, notes = effective_price_map(cells)
    assert list(entries) == ["m-priced"]
    text = price_map_text(entries)
    assert json.loads(text)["m-priced"] == {
        "litellm_provider": "anthropic",
        "mode": "chat",
        "input_cost_per_token": 0.000012,
        "output_cost_per_token": 0.00006,
    }
    assert '"input_cost_per_token": 0.000012,' in text  # an exact decimal, never 1.2e-05
    assert len(notes) == 2 and "standard only" in notes[0] and "no output" in notes[1]
    agreeing = cell("m-agrees", "standard", {"input": 6, "output": 6}, {"input": 1, "output": 1})
    agreeing.causes = []
    assert effective_price_map([agreeing]) == ({}, [])


def test_money_billed_beyond_any_token_is_unexplained_never_a_price() -> None:
    web_search = cost_page(
        [{"amount": {"value": 0.01, "currency": "usd"}, "line_item": "web search tool calls"}],
        openai=True,
    )
    costs = read_cost_report("openai", web_search, "t")
    (cell,) = match_costs("openai", costs.days, costs.rows, [])
    assert cell.model == "" and cell.delta == 10_000_000
    assert cell.causes == ["unexplained"] and cell.residual == 10_000_000

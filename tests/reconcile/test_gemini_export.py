"""Gemini's billing export read whole: every SKU of the shipped table, both file shapes,
credits apart, and each bad input a clear error or a named gap."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from reconcile import (
    CostCell,
    ReportError,
    effective_price_map,
    load_sku_table,
    mapping_from_data,
    open_store,
    price_map_text,
    read_gemini_export,
    sku_table_from_data,
)
from schemas.errors import ConfigError
from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.pricing.writer import read_source
from schemas.usage import new_usage_event
from spendbus.commands.reconcile import BILLED_RATE_PROVIDERS

ROOT = Path(__file__).resolve().parents[2]
TABLE = load_sku_table()
DAY = date(2026, 11, 3)
FLASH_INPUT = "Gemini 2.5 Flash Input Text Tokens"


def row(description: str = FLASH_INPUT, **change: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "service": {"id": "AEFD-7695-64FA", "description": "Gemini API"},
        "sku": {"id": "1111-2222-3333", "description": description},
        "usage_start_time": "2026-11-03 10:00:00 UTC",
        "usage_end_time": "2026-11-03 11:00:00 UTC",
        "project": {"id": "proj-a", "name": "a"},
        "labels": [],
        "cost": 0.0003,
        "currency": "USD",
        "usage": {"amount": 1000, "unit": "count", "amount_in_pricing_units": 0.001},
        "credits": [],
        "cost_type": "regular",
    }
    return base | change


def jsonl(*rows: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


#: the model ids the table names
MODELS = {e.model for e in TABLE.entries.values()}


@pytest.mark.parametrize("entry", list(TABLE.entries.values()), ids=lambda e: e.description)
def test_each_sku_reads_as_its_model_class_and_tier_and_the_model_is_priced(entry: Any) -> None:
    export = read_gemini_export(jsonl(row(entry.description)), "e.jsonl", TABLE)
    (usage,) = export.usage.rows
    assert (usage.model, usage.tier, usage.api_key_id) == (entry.model, entry.tier, "proj-a")
    assert {c: n for c, n in usage.tokens.items() if n} == {entry.token_class: 1000}
    (cost,) = export.costs.rows
    assert (cost.model, cost.token_class, cost.nanos) == (entry.model, entry.token_class, 300_000)
    assert export.gaps == []
    # spendbus prices the model the SKU names, or its calls could never reconcile
    event = new_usage_event(
        provider="gemini",
        api="gemini",
        model=entry.model,
        secret_id="s",
        org_id="o",
        gateway_id="g",
        input_tokens=1000,
        output_tokens=1000,
    )
    assert not PriceBook(load_price_file(default_price_file())).price_event(event).unpriced
    if "token count" in entry.description:  # a wording seen in exports
        # the words name the model, and no longer model id of the table's: "... gemini
        # 2.5 flash lite short input text" is gemini-2.5-flash-lite, never 2.5-flash
        text = entry.description.lower()
        named = [m for m in MODELS if m.replace("-", " ") in text]
        assert max(named, key=len) == entry.model, named
        kind = "output" if " output " in text else "cache_read" if "cached" in text else "input"
        assert kind == entry.token_class
        assert ("long input" in text) == (entry.context == "long")
        return
    # the words name the model: "Gemini 2.5 Flash-Lite ..." is gemini-2.5-flash-lite
    words = entry.description.split(" Batch ")[0].split(" Long ")[0]
    words = words.split(" Cached ")[0].split(" Input ")[0].split(" Output ")[0]
    assert words.lower().replace(" ", "-") == entry.model


def test_both_shapes_read_alike_rows_add_up_and_credits_stay_apart() -> None:
    rows = [
        row(credits=[{"name": "Free trial", "amount": -0.0001, "type": "FREE_TIER"}]),
        row(usage_start_time="2026-11-03T11:00:00Z", usage_end_time="2026-11-03T12:00:00Z"),
        row("Gemini 2.5 Flash Output Text Tokens", cost="0.0025"),
        row("Gemini 2.5 Flash Batch Output Text Tokens", cost=0.00125),
        row(service={"description": "Cloud Storage"}, currency="EUR"),  # not Gemini: not read
    ]
    out = io.StringIO()
    columns = ["service.description", "sku.id", "sku_description", "usage_start_time"]
    columns += ["usage_end_time", "project.id", "cost", "currency", "usage.amount", "usage.unit"]
    writer = csv.writer(out)
    writer.writerow([*columns, "credits"])
    for r in rows:
        writer.writerow(
            [
                r["service"]["description"],
                r["sku"]["id"],
                r["sku"]["description"],
                r["usage_start_time"],
                r["usage_end_time"],
                r["project"]["id"],
                r["cost"],
                r["currency"],
                r["usage"]["amount"],
                r["usage"]["unit"],
                json.dumps(r["credits"]),
            ]
        )
    for text in (jsonl(*rows), out.getvalue()):
        export = read_gemini_export(text, "e", TABLE)
        tiers = {(u.model, u.tier): u.tokens for u in export.usage.rows}
        assert tiers[("gemini-2.5-flash", "standard")]["input"] == 2000
        assert tiers[("gemini-2.5-flash", "standard")]["output"] == 1000
        assert tiers[("gemini-2.5-flash", "batch")]["output"] == 1000
        costs = {(c.tier, c.token_class): c.nanos for c in export.costs.rows}
        assert costs == {
            ("standard", "input"): 600_000,
            ("standard", "output"): 2_500_000,
            ("batch", "output"): 1_250_000,
            ("standard", "credit"): -100_000,  # kept apart: never matched as cost
        }
        assert export.credits_nanos == {"Free trial": -100_000}
        assert export.usage.days == {DAY}


def test_an_unknown_sku_is_a_named_gap_and_a_tax_row_is_not_usage() -> None:
    text = jsonl(
        row(sku={"id": "9999-AAAA-BBBB", "description": "Gemini 9 Ultra Input Text Tokens"}),
        row("Gemini 9 Ultra Input Text Tokens", cost=0.0002),
        row(cost_type="tax", cost=0.00005),
    )
    export = read_gemini_export(text, "e", TABLE)
    assert export.usage.rows == []
    assert export.gaps == [
        "unmapped SKU 1111-2222-3333 Gemini 9 Ultra Input Text Tokens: 1 row(s), $0.000200000",
        "unmapped SKU 9999-AAAA-BBBB Gemini 9 Ultra Input Text Tokens: 1 row(s), $0.000300000",
        "not usage: 1 row(s) of cost_type tax, $0.000050000",
    ]
    assert {c.model for c in export.costs.rows} == {
        "unmapped SKU 1111-2222-3333 Gemini 9 Ultra Input Text Tokens",
        "unmapped SKU 9999-AAAA-BBBB Gemini 9 Ultra Input Text Tokens",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the export is empty"),
        ("a,b\n1,2\n", "not a Cloud Billing export: no column service.description"),
        ('{"sku": {"id": "x"}\n', "line 1: not a JSON object"),
        (jsonl({k: v for k, v in row().items() if k != "cost"}), "line 1: no cost"),
        (jsonl(row(currency="EUR")), "cost in 'EUR': spendbus reads USD exports only"),
        (jsonl(row(cost="1,5")), "cost '1,5' is not a number"),
        (jsonl(row(cost=-1)), "is not a cost >= 0"),
        (jsonl(row(usage_start_time="yesterday")), "usage_start_time 'yesterday' is not a time"),
        (
            jsonl(row(usage_end_time="2026-11-04 01:00:00 UTC")),
            "is not within one UTC day",
        ),
        (jsonl(row(usage={"amount": 2.5, "unit": "count"})), "usage.amount 2.5 is no token count"),
        (jsonl(row(usage={"amount": 9, "unit": "seconds"})), "billed in 'seconds', not in tokens"),
        (jsonl(row(project={"id": ""})), "project.id is empty"),
        (jsonl(row(credits="[{")), "credits '\\[\\{' is not a JSON array"),
        (jsonl(row(), row(cost="x")), "line 2: cost 'x'"),
    ],
)
def test_bad_input_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        read_gemini_export(text, "e", TABLE)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"skus": [{"description": "d", "model": "m", "class": "audio", "tier": "standard"}]}, "class must be"),
        ({"skus": [{"description": "d", "model": "m", "class": "input", "tier": "flex"}]}, "tier must be"),
        ({"skus": [{"description": "d", "model": "m", "class": "input"}]}, "expected"),
        ({"skus": [{"description": "d", "model": "m", "class": "input", "tier": "batch"}] * 2}, "listed twice"),
        ({"version": ""}, "version must be"),
        ({"extra": 1}, "expected exactly"),
    ],
)  # fmt: skip
def test_a_bad_sku_table_is_refused(change: dict[str, Any], message: str) -> None:
    data = {"version": "v", "services": ["Gemini API"], "token_units": ["count"], "skus": []}
    with pytest.raises(ConfigError, match=message):
        sku_table_from_data(data | change, "t.yaml")


def test_a_gemini_credential_maps_by_its_project_once() -> None:
    mapping = mapping_from_data(
        {"credentials": {"sk-gemini": {"provider": "gemini", "project_id": "proj-a"}}}, "m"
    )
    assert mapping.secret_of("gemini", "proj-a") == "sk-gemini"
    for entry, message in (
        ({"provider": "gemini"}, "project_id is required"),
        ({"provider": "gemini", "api_key_id": "k", "project_id": "p"}, "mapped by project_id"),
    ):
        with pytest.raises(ConfigError, match=message):
            mapping_from_data({"credentials": {"sk-gemini": entry}}, "m")
    with pytest.raises(ConfigError, match="already mapped"):
        mapping_from_data(
            {
                "credentials": {
                    "a": {"provider": "gemini", "project_id": "p"},
                    "b": {"provider": "gemini", "project_id": "p"},
                }
            },
            "m",
        )


def test_the_cli_imports_an_export_whole_replacing_the_days_it_covers(tmp_path: Path) -> None:
    good, bad, again = tmp_path / "e.jsonl", tmp_path / "bad.jsonl", tmp_path / "again.jsonl"
    good.write_text(jsonl(row(), row("Gemini 9 Ultra Input Text Tokens")))
    bad.write_text(jsonl(row(), row(currency="JPY")))
    again.write_text(jsonl(row(usage={"amount": 1500, "unit": "count"}, cost=0.00045)))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPENDBUS_HOME": str(tmp_path),
        "SPENDBUS_PURE": "1",
    }

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spendbus", "reconcile", "import", "--provider", "gemini", str(path)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip

    refused = run(bad)
    assert refused.returncode == 2 and "line 2: cost in 'JPY'" in refused.stdout + refused.stderr
    done = run(good)
    assert done.returncode == 0, done.stderr
    assert f"SKU table version {TABLE.version}" in done.stdout
    assert (
        "gap: unmapped SKU 1111-2222-3333 Gemini 9 Ultra Input Text Tokens: 1 row(s)" in done.stdout
    )
    assert run(good).returncode == 0 and run(again).returncode == 0  # the same day, replaced
    store = open_store(f"chdb://{tmp_path / 'reconcile'}")
    try:
        assert store.covered_days("gemini") == [DAY] == store.covered_days("gemini", "costs")
        (usage,) = store.provider_usage("gemini", DAY, DAY)
        assert usage.tokens["input"] == 1500
        assert sum(c.nanos for c in store.provider_costs("gemini", DAY, DAY)) == 450_000
    finally:
        store.close()


def test_a_gemini_billed_rate_reaches_the_price_import(tmp_path: Path) -> None:
    cell = CostCell(
        "gemini",
        DAY,
        "gemini-2.5-flash",
        "standard",
        provider_nanos=2_000_000,
        provider_classes={"input": 400_000, "output": 1_600_000},
        provider_tokens={"input": 2000, "output": 800},
        causes=["price"],
    )
    entries, notes = effective_price_map([cell])
    assert notes == []
    rates = tmp_path / "rates.json"
    rates.write_text(price_map_text(entries))
    source = read_source("litellm", rates, providers=BILLED_RATE_PROVIDERS, on=DAY)
    (price,) = source.prices
    assert price.model == "gemini-2.5-flash"
    assert (price.input_per_mtok, price.output_per_mtok) == (Decimal("0.2"), Decimal("2"))

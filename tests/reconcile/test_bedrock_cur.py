"""Bedrock's bill as CUR 2.0 rows: tokens and money by day, account, model and class,
matched against the ledger like the admin reports; bad rows named, never half imported."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from reconcile import (
    LedgerCell,
    ReportError,
    mapping_from_data,
    match,
    match_costs,
    open_store,
    read_bedrock_cur,
)

ROOT = Path(__file__).resolve().parents[2]
DAY = date(2026, 11, 3)
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = f"arn:aws:bedrock:us-east-1::foundation-model/{MODEL}"
COLUMNS = (
    "identity_line_item_id",
    "line_item_usage_start_date",
    "line_item_product_code",
    "line_item_line_item_type",
    "line_item_usage_account_id",
    "line_item_usage_type",
    "line_item_resource_id",
    "line_item_usage_amount",
    "line_item_unblended_cost",
)


def cur(*rows: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for n, row in enumerate(rows):
        writer.writerow((f"id{n}", *row))
    return out.getvalue()


def usage_row(usage_type: str, amount: str, cost: str, **change: str) -> tuple[str, ...]:
    row = {
        "start": "2026-11-03T10:00:00Z",
        "product": "AmazonBedrock",
        "kind": "Usage",
        "account": "111122223333",
        "usage_type": f"USE1-Claude4.5Sonnet-{usage_type}",
        "resource": ARN,
        "amount": amount,
        "cost": cost,
    } | change
    return tuple(row.values())


BILL = cur(
    usage_row("input-tokens", "1000", "0.003"),
    usage_row("output-tokens", "200", "0.003"),
    usage_row("cache-read-input-token-count", "500", "0.00015", start="2026-11-03T11:00:00Z"),
    usage_row("input-tokens", "9", "0.1", product="AmazonS3"),  # another service
    usage_row("input-tokens", "0", "-0.5", kind="Credit"),  # a credit, not usage
)


def test_the_rows_read_into_tokens_and_exact_money_by_class() -> None:
    usage, costs = read_bedrock_cur(BILL, "cur.csv")
    (row,) = usage.rows
    assert (row.day, row.api_key_id, row.model, row.tier) == (
        DAY,
        "111122223333",
        MODEL,
        "standard",
    )
    assert row.tokens == {
        "input": 1000,
        "cache_read": 500,
        "cache_write_5m": 0,
        "cache_write_1h": 0,
        "output": 200,
    }
    assert {(c.token_class, c.nanos) for c in costs.rows} == {
        ("input", 3_000_000),
        ("output", 3_000_000),
        ("cache_read", 150_000),
    }
    mapping = mapping_from_data(
        {"credentials": {"sk-bedrock": {"provider": "bedrock", "api_key_id": "111122223333"}}},
        "m",
    )
    ledger = LedgerCell(
        requests=2,
        cost_nanos=6_150_000,
        tokens={
            "input": 1000,
            "cache_read": 500,
            "cache_write_5m": 0,
            "cache_write_1h": 0,
            "output": 150,
        },
    )
    (cell,) = match(
        "bedrock", usage.days, usage.rows, {(DAY, "sk-bedrock", MODEL, "standard"): ledger}, mapping
    )
    assert cell.credential == "sk-bedrock" and cell.deltas["output"] == 50
    assert cell.causes == ["unexplained"]
    (cost,) = match_costs("bedrock", costs.days, costs.rows, [cell])
    assert cost.delta == 0 and cost.causes == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "not a CUR 2.0 export"),
        (cur(usage_row("input-tokens", "1.5", "0.1")), "no token count"),
        (cur(usage_row("input-tokens", "x", "0.1")), "must be numbers"),
        (cur(usage_row("input-tokens", "1", "0.1", resource="")), "names no model"),
        (cur(usage_row("input-tokens", "1", "0.1", start="yesterday")), "is not a time"),
        (cur(usage_row("input-tokens", "1", "0.1", account="")), "account_id is empty"),
    ],
)
def test_a_bad_row_is_refused_naming_its_line(text: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        read_bedrock_cur(text, "cur.csv")


def test_the_cli_imports_a_cur_file_whole_or_not_at_all(tmp_path: Path) -> None:
    bill, bad = tmp_path / "cur.csv", tmp_path / "bad.csv"
    bill.write_text(BILL)
    bad.write_text(BILL + ",".join(("x", *usage_row("output-tokens", "2.5", "1"))) + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPENDBUS_HOME": str(tmp_path),
        "SPENDBUS_PURE": "1",
    }

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spendbus", "reconcile", "import", "--provider", "bedrock", str(path)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip

    refused = run(bad)
    assert refused.returncode == 2 and "line 7" in refused.stdout + refused.stderr
    done = run(bill)
    assert done.returncode == 0, done.stderr
    assert "imported bedrock usage: 1 row(s), 1 day(s)" in done.stdout
    assert "imported bedrock costs: 3 row(s)" in done.stdout
    store = open_store(f"chdb://{tmp_path / 'reconcile'}")
    try:
        assert store.covered_days("bedrock") == [DAY] == store.covered_days("bedrock", "costs")
        (row,) = store.provider_usage("bedrock", DAY, DAY)
        assert row.tokens["input"] == 1000
        assert sum(c.nanos for c in store.provider_costs("bedrock", DAY, DAY)) == 6_150_000
    finally:
        store.close()

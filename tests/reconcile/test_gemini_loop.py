"""Gemini's loop closed: calls through the gateway on the real broker, the worker's
ClickHouse ledger, the fake provider's Cloud Billing export of the calls it served,
imported through the CLI, reconciled: zero residual exactly; then a call sent straight to
the provider shows as its own explained delta, and a model the SKU table lacks as a
named gap."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from pydantic import SecretStr

from schemas.topics import Topics
from spendbus.fake_upstream import FakeUpstreamConfig
from spendbus.fake_upstream.billing import GEMINI_EXPORT_PATH, api_key_id, usage_classes
from tests.gateway.kit import CREDENTIALS, KEY_OF, GatewayStack, gateway_stack
from tests.pipeline_kit import Pipeline
from tests.reconcile.kit import with_worker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "admin-key-for-the-fake-export-0123"
PROJECT = api_key_id("gemini", CREDENTIALS["sk-gemini"])
MAPPING = {"credentials": {"sk-gemini": {"provider": "gemini", "project_id": PROJECT}}}
BODY = {"contents": [{"role": "user", "parts": [{"text": "Reconcile Gemini's bill. " * 12}]}]}


async def generate(
    url: str, model: str, key: str, *, stream: bool = False, batch: bool = False
) -> None:
    """``batch``: billed as the Batch API would (which no gateway proxies)."""
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    headers = {"x-goog-api-key": key} | ({"x-fake-batch": "true"} if batch else {})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1beta/models/{model}:{action}", json=BODY, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        await resp.read()


async def export_file(stack: GatewayStack, path: Path, shape: str) -> Path:
    """The fake provider's billing export of every Gemini call it served, saved."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{stack.upstream.url}{GEMINI_EXPORT_PATH}?format={shape}",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        path.write_text(await resp.text())
    return path


async def cli(env: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spendbus", "reconcile", *args,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "SPENDBUS_PURE": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (args, out.decode(), err.decode())
    return out.decode()


def billed(stack: GatewayStack, model: str, *, batch: bool = False) -> tuple[dict[str, int], int]:
    """What the fake provider billed for ``model`` in a tier: tokens by class, nanos."""
    tokens = dict.fromkeys(("input", "cache_read", "cache_write_5m", "cache_write_1h", "output"), 0)
    nanos = 0
    for call, count in stack.upstream.billing.tally.items():
        if call.model == model and call.batch == batch:
            for token_class, n in usage_classes(call.usage).items():
                tokens[token_class] += n * count
            nanos += sum(stack.upstream.billing.cost_of(call).values()) * count
    return tokens, nanos


async def report(env: dict[str, str]) -> dict[str, Any]:
    """`spendbus reconcile report --json`, parsed."""
    shown: dict[str, Any] = json.loads(await cli(env, "report", "--json"))
    return shown


async def scenario(bootstrap: str, topics: Topics, tmp: Path, pipeline: Pipeline) -> None:
    upstream = FakeUpstreamConfig(
        port=0, seed=5, chunk_latency_ms=5, output_tokens=(16, 48), admin_key=SecretStr(ADMIN_KEY)
    )
    env = dict(pipeline.worker.env)
    (Path(env["SPENDBUS_HOME"]) / "reconcile.yaml").write_text(yaml.safe_dump(MAPPING))
    async with gateway_stack(bootstrap, topics, tmp, upstream=upstream) as stack:
        key = KEY_OF["sk-gemini"]
        await generate(stack.url, "gemini-2.5-flash", key)
        await generate(stack.url, "gemini-2.5-flash", key, stream=True)
        await generate(stack.url, "gemini-2.0-flash", key)
        await stack.publisher.flush(30)
        await asyncio.to_thread(
            pipeline.sql_until,
            "SELECT count() FROM usage_events WHERE provider = 'gemini'",
            lambda rows: bool(rows) and rows[0][0] >= 3,
        )
        # 1. gateway traffic only, the export as JSON lines, imported twice: zero residual
        export = await export_file(stack, tmp / "export.jsonl", "jsonl")
        # the account's free-tier credit on one row: shown beside the cost, never netted
        lines = export.read_text().splitlines()
        credited = json.loads(lines[0])
        credited["credits"] = [{"name": "Free tier", "amount": -0.00001, "type": "FREE_TIER"}]
        export.write_text("\n".join([json.dumps(credited), *lines[1:]]) + "\n")
        for _ in range(2):  # a repeated import replaces, never adds
            out = await cli(env, "import", "--provider", "gemini", str(export))
            assert "imported gemini usage: 2 row(s), 1 day(s)" in out and "gap:" not in out
        first = await report(env)
        assert {(c["model"], c["tier"]) for c in first["cells"]} == {
            ("gemini-2.5-flash", "standard"),
            ("gemini-2.0-flash", "standard"),
        }
        for cell in first["cells"]:
            assert (cell["credential"], cell["api_key_id"]) == ("sk-gemini", PROJECT)
            assert cell["causes"] == [] and not any(cell["deltas"].values()), cell
            assert cell["provider_tokens"] == billed(stack, cell["model"])[0]
        assert len(first["costs"]) == 2
        for cost in first["costs"]:
            assert cost["delta_nanos"] == 0 and cost["causes"] == [], cost
            assert cost["provider_nanos"] == billed(stack, cost["model"])[1] > 0
        assert [(d["residual"], d["cost_residual_nanos"]) for d in first["days"]] == [(0, 0)]
        assert [d["credit_nanos"] for d in first["days"]] == [-10_000]
        assert "credit Free tier: -$0.000010000 (not netted)" in out

        # 2. a call straight to the provider, and a model the SKU table lacks; CSV now (the
        # export counts no requests: a bypass shows where the ledger has no call at all)
        direct = CREDENTIALS["sk-gemini"]
        await generate(stack.upstream.url, "gemini-2.0-flash-lite", direct)
        await generate(stack.upstream.url, "gemini-2.5-flash", direct, batch=True)
        await generate(stack.upstream.url, "gemini-2.5-flash-image", direct)
        export = await export_file(stack, tmp / "export.csv", "csv")
        out = await cli(env, "import", "--provider", "gemini", str(export))
        table = await cli(env, "report")
        second = await report(env)
        truth = billed(stack, "gemini-2.0-flash-lite")[0]
        batch_truth = billed(stack, "gemini-2.5-flash", batch=True)
        image_nanos = billed(stack, "gemini-2.5-flash-image")[1]
    print(table)
    cells = {(c["model"], c["tier"]): c for c in second["cells"]}
    assert set(cells) == {
        ("gemini-2.5-flash", "standard"),
        ("gemini-2.5-flash", "batch"),
        ("gemini-2.0-flash", "standard"),
        ("gemini-2.0-flash-lite", "standard"),
    }
    batch = cells[("gemini-2.5-flash", "batch")]
    assert batch["causes"] == ["batch_tier"] and batch["deltas"] == batch_truth[0]
    for model in ("gemini-2.5-flash", "gemini-2.0-flash"):
        assert cells[(model, "standard")]["causes"] == []
        assert not any(cells[(model, "standard")]["deltas"].values())
    bypass = cells[("gemini-2.0-flash-lite", "standard")]
    assert bypass["causes"] == ["bypass"] and bypass["credential"] == "sk-gemini"
    assert bypass["provider_tokens"] == bypass["deltas"] == truth
    assert any(truth.values())
    # the image model's money: a gap named with its SKU, never guessed into tokens
    gaps = [c for c in second["costs"] if "unmapped_sku" in c["causes"]]
    assert len(gaps) == 2  # its input and output SKUs
    assert all(g["model"].startswith("unmapped SKU ") for g in gaps)
    assert all("gemini-2.5-flash-image" in g["model"] for g in gaps)
    assert sum(g["provider_nanos"] for g in gaps) == image_nanos > 0
    assert "gap: unmapped SKU" in out and "gemini-2.5-flash-image" in out
    money = {c["model"]: c for c in second["costs"] if c["tier"] == "standard"}
    batch_money = next(c for c in second["costs"] if c["tier"] == "batch")
    assert batch_money["causes"] == ["batch_tier"]
    assert batch_money["provider_nanos"] == batch_truth[1] > 0
    assert money["gemini-2.0-flash-lite"]["causes"] == ["bypass"]
    assert money["gemini-2.5-flash"]["causes"] == [] == money["gemini-2.0-flash"]["causes"]
    assert all(c["residual_nanos"] == 0 for c in second["costs"])
    assert all(not any(c["residual"].values()) for c in second["cells"])
    assert all(d["residual"] == d["cost_residual_nanos"] == 0 for d in second["days"])
    # the CSV export of the same day replaced the credited one, its credit with it
    assert [d["credit_nanos"] for d in second["days"]] == [0]
    assert "unmapped_sku" in table and "bypass" in table


def test_gemini_billing_export_reconciles_exactly_and_names_each_cause(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    with_worker(kafka_bootstrap, topics, tmp_path, clickhouse_dsn, scenario)

"""The loop closed: traffic through the gateway on the real broker, the aggregator worker's
ClickHouse ledger, the fake providers' own usage reports fetched over their admin API, and
the reconciliation: zero residual exactly, then each injected cause as its own delta.

The worker prices by a table whose claude-sonnet-4-5 lacks the long-context tier (as a
table imported from a source without tiers would): the provider bills that tier, and the
reconciliation names it ``long_context`` by the shipped table, not ``price``, in a cell
whose other calls are below the edge and agree."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from pydantic import SecretStr

from reconcile import (
    Cell,
    Reconciliation,
    fetch_pages,
    import_report,
    mapping_from_data,
    open_store,
    read_cost_report,
    read_report,
    reconcile,
)
from schemas.pricing import PriceBook, default_price_file, load_price_file
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.fake_upstream import FakeUpstreamConfig
from spendbus.fake_upstream.billing import api_key_id, usage_classes
from tests.gateway.kit import CREDENTIALS, KEY_OF, GatewayStack, gateway_stack
from tests.pipeline_kit import Pipeline
from tests.reconcile.kit import with_worker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "admin-key-for-the-fake-reports-0123"
MAPPING = mapping_from_data(
    {
        "credentials": {
            "sk-openai": {
                "provider": "openai",
                "api_key_id": api_key_id("openai", CREDENTIALS["sk-openai"]),
            },
            "sk-anthropic": {
                "provider": "anthropic",
                "api_key_id": api_key_id("anthropic", CREDENTIALS["sk-anthropic"]),
            },
        }
    },
    "test",
)
MAPPING_YAML = yaml.safe_dump(
    {
        "credentials": {
            secret: {"provider": provider, "api_key_id": key_id}
            for (secret, provider), key_id in MAPPING.keys.items()
        }
    }
)
PROMPT = "Reconcile the meter against the bill, line by line. " * 8
#: a prompt above the 200k-token edge of the Sonnet 4.x long-context tier (4 chars a token)
LONG_PROMPT = "long context " * 70_000
#: the shipped prices: their long-context tiers explain a cost
SHIPPED = PriceBook(load_price_file(default_price_file()))


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}]}


def message(model: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    return body | ({"stream": True} if stream else {})


async def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        await resp.read()


async def clean_traffic(stack: GatewayStack) -> int:
    """Calls through the gateway, each read whole; how many."""
    openai = {"Authorization": f"Bearer {KEY_OF['sk-openai']}"}
    anthropic = {"x-api-key": KEY_OF["sk-anthropic"], "anthropic-version": "2023-06-01"}
    await post(stack.url, "/v1/chat/completions", chat("gpt-4o"), openai)
    await post(stack.url, "/v1/chat/completions", chat("gpt-4o"), openai)
    await post(stack.url, "/v1/messages", message("claude-sonnet-4-5"), anthropic)
    await post(stack.url, "/v1/messages", message("claude-sonnet-4-5", stream=True), anthropic)
    return 4


async def hang_up(stack: GatewayStack) -> None:
    """A stream the client leaves after its first event: the ledger charges an estimate."""
    headers = {
        "x-api-key": KEY_OF["sk-anthropic"],
        "anthropic-version": "2023-06-01",
        "x-fake-output-tokens": "400",
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            stack.url + "/v1/messages",
            json=message("claude-haiku-4-5", stream=True) | {"max_tokens": 1024},
            headers=headers,
        )
        assert resp.status == 200
        await resp.content.readany()
        resp.close()


async def reconcile_now(
    stack: GatewayStack, pipeline: Pipeline, store: Any, events: int
) -> Reconciliation:
    """Wait for ``events`` rows in the ledger, fetch each provider's usage and cost
    reports, import them, reconcile."""
    await stack.publisher.flush(30)
    await asyncio.to_thread(
        pipeline.sql_until,
        "SELECT count() FROM usage_events",
        lambda rows: bool(rows) and rows[0][0] >= events,
    )
    since = datetime.now(UTC).date() - timedelta(days=1)
    url = stack.upstream.url
    for provider in ("openai", "anthropic"):
        usage = await asyncio.to_thread(fetch_pages, provider, ADMIN_KEY, since, url, "usage")
        import_report(store, read_report(provider, usage, "fetched"), "fetched")
        costs = await asyncio.to_thread(fetch_pages, provider, ADMIN_KEY, since, url, "costs")
        import_report(store, read_cost_report(provider, costs, "fetched"), "fetched")
    return await asyncio.to_thread(reconcile, store, pipeline.sql, MAPPING, prices=SHIPPED)


async def cli(env: dict[str, str], *args: str) -> str:
    """`spendbus reconcile ARGS` as its own process (the loop keeps serving); its stdout."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "spendbus",
        "reconcile",
        *args,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "SPENDBUS_PURE": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (args, out.decode(), err.decode())
    return out.decode()


def by_model(cells: Sequence[Cell]) -> dict[tuple[str, str], Cell]:
    return {(c.model, c.tier): c for c in cells if c.billed or c.ledger}


def billed_cost(stack: GatewayStack, model: str, *, batch: bool = False) -> int:
    """What the fake provider charged for ``model``'s calls, in nanos."""
    ledger = stack.upstream.billing
    return sum(
        sum(ledger.cost_of(call).values()) * count
        for call, count in ledger.tally.items()
        if call.model == model and call.batch == batch
    )


def worker_price_file(home: Path) -> Path:
    """spendbus's table: the shipped prices, then a version whose claude-sonnet-4-5 has no
    long-context tier."""
    newest = max(load_price_file(default_price_file()), key=lambda t: t.effective_from)
    since = (newest.effective_from + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = home / "worker-prices.yaml"
    path.write_text(
        default_price_file().read_text()
        + f"""
  - version: "no-long-context-tier"
    effective_from: "{since}"
    extends: "{newest.version}"
    models:
    - match: "claude-sonnet-4-5"
      input_per_mtok: "3.00"
      output_per_mtok: "15.00"
"""
    )
    return path


def provider_price_file(home: Path) -> Path:
    """The provider's list: the shipped prices, then a newer version where claude-opus-4-1
    costs less (a price cut spendbus's table has not seen)."""
    newest = max(load_price_file(default_price_file()), key=lambda t: t.effective_from)
    since = (newest.effective_from + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = home / "provider-prices.yaml"
    path.write_text(
        default_price_file().read_text()
        + f"""
  - version: "provider-list-now"
    effective_from: "{since}"
    extends: "{newest.version}"
    models:
    - match: "claude-opus-4-1"
      input_per_mtok: "12.00"
      output_per_mtok: "60.00"
"""
    )
    return path


def billed_truth(stack: GatewayStack, model: str) -> dict[str, int]:
    """What the fake provider billed for ``model``, in the token classes."""
    total = dict.fromkeys(("input", "cache_read", "cache_write_5m", "cache_write_1h", "output"), 0)
    for call, count in stack.upstream.billing.tally.items():
        if call.model == model:
            for token_class, tokens in usage_classes(call.usage).items():
                total[token_class] += tokens * count
    return total


async def scenario(bootstrap: str, topics: Topics, home: Path, pipeline: Pipeline) -> None:
    upstream = FakeUpstreamConfig(
        port=0,
        seed=11,
        chunk_latency_ms=20,
        output_tokens=(16, 48),
        admin_key=SecretStr(ADMIN_KEY),
        price_file=provider_price_file(home),
    )
    store = open_store(f"chdb://{home / 'reconcile-store'}")
    try:
        await traffic_and_causes(bootstrap, topics, home, pipeline, store, upstream)
    finally:
        store.close()


async def traffic_and_causes(
    bootstrap: str,
    topics: Topics,
    home: Path,
    pipeline: Pipeline,
    store: Any,
    upstream: FakeUpstreamConfig,
) -> None:
    async with gateway_stack(bootstrap, topics, home, upstream=upstream) as stack:
        # 1. gateway traffic only: every cell agrees, exactly
        events = await clean_traffic(stack)
        first = await reconcile_now(stack, pipeline, store, events)
        assert {(c.model, c.tier) for c in first.cells} == {
            ("gpt-4o", "standard"),
            ("claude-sonnet-4-5", "standard"),
        }
        for cell in first.cells:
            assert cell.causes == [], cell.as_dict()
            assert all(d == 0 for d in cell.deltas.values()), cell.as_dict()
            assert sum(cell.provider_tokens.values()) > 0
        assert by_model(first.cells)[("gpt-4o", "standard")].provider_requests == 2
        # and the money: to the nano, each token class billed at the listed rate
        assert len(first.costs) == 2
        for cost in first.costs:
            assert cost.delta == 0 and cost.causes == [], cost.as_dict()
            assert cost.provider_nanos == billed_cost(stack, cost.model) > 0
        assert all(day.residual == 0 and day.cost_residual == 0 for day in first.days)

        # 2. each cause injected in a cell of its own
        await hang_up(stack)
        direct = {"Authorization": f"Bearer {CREDENTIALS['sk-openai']}"}
        await post(stack.upstream.url, "/v1/chat/completions", chat("gpt-4o-mini"), direct)
        await post(
            stack.upstream.url,
            "/v1/chat/completions",
            chat("gpt-4o"),
            direct | {"x-fake-batch": "true"},
        )
        openai = {"Authorization": f"Bearer {KEY_OF['sk-openai']}"}
        await post(stack.url, "/v1/chat/completions", chat("gpt-unlisted-model"), openai)
        stranger = {"Authorization": "Bearer sk-a-key-nobody-mapped"}
        await post(stack.upstream.url, "/v1/chat/completions", chat("gpt-4o"), stranger)
        anthropic = {"x-api-key": KEY_OF["sk-anthropic"], "anthropic-version": "2023-06-01"}
        await post(stack.url, "/v1/messages", message("claude-opus-4-1"), anthropic)
        long_call = message("claude-sonnet-4-5")
        long_call["messages"][0]["content"] = LONG_PROMPT
        await post(stack.url, "/v1/messages", long_call, anthropic)
        second = await reconcile_now(stack, pipeline, store, events + 4)
        # without a reference table, the long-context step is only a price
        unexplained_tier = await asyncio.to_thread(reconcile, store, pipeline.sql, MAPPING)
        cells = second.cells
        # the same through the CLI, in a process of its own: fetch both reports, report
        home_env = dict(pipeline.worker.env)
        admin_key_file = home / "admin.key"
        admin_key_file.write_text(ADMIN_KEY + "\n")
        admin_key_file.chmod(0o600)
        Path(home_env["SPENDBUS_HOME"], "reconcile.yaml").write_text(MAPPING_YAML)
        for provider in ("openai", "anthropic"):
            await cli(
                home_env,
                "fetch",
                "--provider",
                provider,
                "--admin-key-file",
                str(admin_key_file),
                "--since",
                "1d",
                "--base-url",
                stack.upstream.url,
            )
        table = await cli(home_env, "report")
        shown = json.loads(await cli(home_env, "report", "--json"))
        # the billed rates as a new price version, through `prices import`'s path
        repriced = home / "repriced.yaml"
        effective = datetime.now(UTC).replace(microsecond=0)
        await cli(
            home_env,
            "prices",
            "-o",
            str(repriced),
            "--effective-from",
            effective.isoformat().replace("+00:00", "Z"),
        )
    print(table)  # the README's example output
    book = PriceBook(load_price_file(repriced))
    shipped = PriceBook(load_price_file(default_price_file()))

    def price(prices: PriceBook, model: str, input_tokens: int, output_tokens: int) -> int:
        return prices.price_event(
            new_usage_event(
                provider="anthropic",
                api="anthropic-messages",
                model=model,
                secret_id="s",
                org_id="o",
                gateway_id="g",
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                occurred_at=effective + timedelta(seconds=1),
            )
        ).cost_nanos

    # a million tokens each way at the provider's cut rates: $12 in, $60 out
    assert price(book, "claude-opus-4-1", 1_000_000, 0) == 12_000_000_000
    assert price(book, "claude-opus-4-1", 0, 1_000_000) == 60_000_000_000
    # every other model as it was: a long-context step is no base rate
    for model in ("claude-sonnet-4-5", "claude-haiku-4-5"):
        assert price(book, model, 1000, 1000) == price(shipped, model, 1000, 1000)
    assert price(book, "claude-sonnet-4-5", 250_000, 0) == 250_000 * 6_000  # the tier kept
    assert ADMIN_KEY not in table
    assert "claude-sonnet-4-5 [standard]: +$" in table and "long_context" in table
    assert sorted((c["model"], c["tier"], c["causes"]) for c in shown["cells"]) == sorted(
        (c.model, c.tier, c.causes) for c in cells
    )
    assert sorted((c["model"], c["tier"], c["delta_nanos"]) for c in shown["costs"]) == sorted(
        (c.model, c.tier, c.delta) for c in second.costs
    )
    assert all(day["residual"] == day["cost_residual_nanos"] == 0 for day in shown["days"])

    found = by_model(cells)
    clean = [found[("gpt-4o", "standard")], found[("claude-sonnet-4-5", "standard")]]
    unmapped = [c for c in cells if not c.credential]
    assert len(unmapped) == 1 and unmapped[0].causes == ["unmapped_credential"]
    assert unmapped[0].api_key_id == api_key_id("openai", "sk-a-key-nobody-mapped")
    mapped = {(c.model, c.tier): c for c in cells if c.credential}
    assert [c.causes for c in clean] == [[], []]
    assert all(not any(c.deltas.values()) for c in clean)
    assert mapped[("gpt-4o", "standard")] is clean[0]

    hung = mapped[("claude-haiku-4-5", "standard")]
    assert hung.causes == ["estimate"]
    assert hung.ledger is not None and hung.ledger.estimated_calls == 1
    truth = billed_truth(stack, "claude-haiku-4-5")
    assert hung.provider_tokens == truth
    assert hung.deltas == {k: truth[k] - hung.spendbus_tokens[k] for k in truth}
    assert any(hung.deltas.values())

    bypass = mapped[("gpt-4o-mini", "standard")]
    assert bypass.causes == ["bypass"] and bypass.ledger is None
    assert bypass.deltas == billed_truth(stack, "gpt-4o-mini")

    batch = mapped[("gpt-4o", "batch")]
    assert batch.causes == ["batch_tier"] and batch.provider_requests == 1
    assert sum(batch.deltas.values()) > 0

    unpriced = mapped[("gpt-unlisted-model", "standard")]
    assert unpriced.causes == ["unpriced"]
    assert not any(unpriced.deltas.values())
    assert unpriced.ledger is not None and unpriced.ledger.cost_nanos == 0

    stale = mapped[("claude-opus-4-1", "standard")]
    assert stale.causes == [] and not any(stale.deltas.values())
    # the long call's cell: its tokens agree (the other calls' too)
    assert clean[1].provider_tokens["input"] > 200_000

    assert all(not any(c.residual.values()) for c in cells)

    # the money of each cell: every delta exact and explained
    money = {(c.model, c.tier): c for c in second.costs}
    ledger_cost = {
        key: sum(c.ledger.cost_nanos for c in cells if (c.model, c.tier) == key and c.ledger)
        for key in money
    }
    for key, spent in money.items():
        assert spent.spendbus_nanos == ledger_cost[key]
        assert spent.provider_nanos == billed_cost(stack, key[0], batch=key[1] == "batch")
    assert money[("claude-haiku-4-5", "standard")].causes == ["estimate"]
    assert money[("gpt-4o-mini", "standard")].causes == ["bypass"]
    assert money[("gpt-4o", "batch")].causes == ["batch_tier"]
    # the cost report names no key: the stranger's call lands in the mapped keys' cell
    billing = stack.upstream.billing
    stranger_cost = sum(
        sum(billing.cost_of(c).values()) * count
        for c, count in billing.tally.items()
        if c.api_key_id == unmapped[0].api_key_id
    )
    assert money[("gpt-4o", "standard")].delta == stranger_cost > 0
    assert money[("gpt-4o", "standard")].causes == ["unmapped_credential"]
    assert money[("gpt-unlisted-model", "standard")].causes == ["unpriced"]
    assert money[("gpt-unlisted-model", "standard")].spendbus_nanos == 0
    # tokens agree, money does not: the price table differs from the billed rate
    stale_cost = money[("claude-opus-4-1", "standard")]
    assert stale_cost.causes == ["price"] and stale_cost.delta < 0
    rates = stale_cost.effective_rates()
    assert Decimal(rates["input"]) == Decimal("12") and Decimal(rates["output"]) == Decimal("60")
    # the provider billed the long-context tier spendbus's table lacks: exactly that step
    long_cost = money[("claude-sonnet-4-5", "standard")]
    assert long_cost.causes == ["long_context"], long_cost.as_dict()
    assert (long_cost.long_context_calls, long_cost.long_context_edge) == (1, 200_000)
    (long,) = [
        call.usage
        for call in billing.tally
        if call.model == "claude-sonnet-4-5" and call.usage.input_tokens > 200_000
    ]
    # the tier's $6 / $22.50 against the base $3 / $15, on the long call alone
    assert long_cost.delta == long.input_tokens * 3_000 + long.output_tokens * 7_500 > 0
    without = {(c.model, c.tier): c.causes for c in unexplained_tier.costs}
    assert without[("claude-sonnet-4-5", "standard")] == ["price"]
    assert without[("claude-opus-4-1", "standard")] == ["price"]
    assert all(c.residual == 0 for c in second.costs)
    assert all(day.cost_residual == 0 for day in second.days)
    # the same days imported again and again: each import replaced the one before
    rows = store.query("SELECT count() FROM reconciliation_imports")
    assert rows[0][0] >= 8


def test_the_ledger_reconciles_with_the_providers_report_and_each_cause_is_named(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> None:
    with_worker(
        kafka_bootstrap,
        topics,
        tmp_path,
        clickhouse_dsn,
        scenario,
        price_file=worker_price_file(tmp_path),
    )

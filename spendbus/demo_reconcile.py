"""The demo's traffic reconciled against the fake providers' own bill (issue 41).

After its checks, `spendbus demo` serves the admin reports of the fake providers it ran
(billing.py: built from every call they billed) on a loopback port, fetches OpenAI's and
Anthropic's usage and cost reports and Gemini's billing export from it, imports them into
the reconciliation store `spendbus reconcile` uses (``$SPENDBUS_HOME/reconcile`` of the
demo) and prints the report, as `spendbus reconcile fetch` / `import` / `report` would.
Bedrock bills through CUR files the fake providers do not write: its calls are not
reconciled here. The mapping is written to the demo home's ``reconcile.yaml``, so with
``--keep`` `spendbus reconcile report` can be run again over the same stack.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from pydantic import SecretStr
from rich.console import Console

from schemas.money import format_usd
from schemas.pricing import PriceBook, default_price_file, load_price_file
from spendbus.demo_traffic import PRINCIPALS, upstream_credential
from spendbus.fake_upstream.billing import (
    GEMINI_EXPORT_PATH,
    BillingLedger,
    api_key_id,
    report_handlers,
)
from spendbus.settings import Settings

#: the providers whose bill the fake providers serve, as reconcile reads it
REPORTED = ("openai", "anthropic", "gemini")
#: how the demo's last reconciliation line begins (its end: pass or FAIL)
RESULT_LINE = "reconciliation: unexplained residual"


def demo_mapping() -> dict[str, Any]:
    """Each demo secret's upstream credential as each provider's reports name it."""
    return {
        "credentials": {
            secret: [
                {"provider": "openai", "api_key_id": api_key_id("openai", credential)},
                {"provider": "anthropic", "api_key_id": api_key_id("anthropic", credential)},
                {"provider": "gemini", "project_id": api_key_id("gemini", credential)},
            ]
            for _, secret, _, _ in PRINCIPALS
            for credential in [upstream_credential(secret)]
        }
    }


async def _fetch_bills(billing: BillingLedger, admin_key: str) -> dict[str, Any]:
    """The fake providers' reports of ``billing``, fetched over HTTP as `reconcile fetch`
    does: {provider: {"usage": pages, "costs": pages}}, Gemini's as the export's text."""
    from reconcile import fetch_pages

    app = web.Application()
    for path, handler in report_handlers(billing, SecretStr(admin_key)):
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}"
        since = datetime.now(UTC).date() - timedelta(days=1)
        bills: dict[str, Any] = {}
        for provider in ("openai", "anthropic"):
            bills[provider] = {
                kind: await asyncio.to_thread(fetch_pages, provider, admin_key, since, url, kind)
                for kind in ("usage", "costs")
            }
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                url + GEMINI_EXPORT_PATH,
                params={"format": "jsonl"},
                headers={"Authorization": f"Bearer {admin_key}"},
            ) as resp,
        ):
            resp.raise_for_status()
            bills["gemini"] = await resp.text()
        return bills
    finally:
        await runner.cleanup()


def reconcile_demo(
    settings: Settings, worker: Any, billing: BillingLedger | None, console: Console
) -> int:
    """Fetch the fake providers' bill, reconcile the demo's ledger against it and print the
    report; 0 when no delta is left unexplained (tokens and money), else 1."""
    from reconcile import (
        import_report,
        load_sku_table,
        mapping_from_data,
        open_store,
        read_cost_report,
        read_gemini_export,
        read_report,
        reconcile,
        render_table,
    )

    if billing is None:
        console.print("[red]no bill of the fake providers to reconcile against")
        return 1
    mapping_data = demo_mapping()
    (settings.home / "reconcile.yaml").write_text(yaml.safe_dump(mapping_data))
    mapping = mapping_from_data(mapping_data, "the demo's credentials")

    def run_query(sql: str) -> Sequence[Sequence[Any]]:
        rows: Sequence[Sequence[Any]] = worker.post("/sql", {"sql": sql})["rows"]
        return rows

    with console.status("fetching the providers' usage and cost reports, reconciling..."):
        bills = asyncio.run(_fetch_bills(billing, secrets.token_urlsafe(24)))
        store = open_store(f"chdb://{(settings.home / 'reconcile').resolve()}")
        try:
            for provider in ("openai", "anthropic"):
                source = f"{provider} admin API (the fake providers)"
                pages = bills[provider]
                import_report(store, read_report(provider, pages["usage"], source), source)
                import_report(store, read_cost_report(provider, pages["costs"], source), source)
            export = read_gemini_export(bills["gemini"], "gemini billing export", load_sku_table())
            import_report(store, export.usage, "gemini billing export")
            import_report(store, export.costs, "gemini billing export")
            prices = PriceBook(load_price_file(default_price_file()))
            result = reconcile(store, run_query, mapping, providers=REPORTED, prices=prices)
        finally:
            store.close()
    console.rule("reconciliation: the ledger against the providers' bill")
    # the table's [tier] brackets are text, never markup
    console.print(render_table(result), markup=False, highlight=False, soft_wrap=True)
    for gap in export.gaps:
        console.print(f"gap: {gap}", markup=False, highlight=False)
    residual_tokens = sum(day.residual for day in result.days)
    residual_nanos = sum(day.cost_residual for day in result.days)
    ok = bool(result.days) and residual_tokens == 0 and residual_nanos == 0 and not export.gaps
    console.print(
        f"reconciled {', '.join(REPORTED)}; bedrock is not: it bills through CUR files, "
        "which the fake providers do not write",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"{RESULT_LINE} {residual_tokens} tokens, {format_usd(residual_nanos, 9)}: "
        + ("[green]pass" if ok else "[red]FAIL"),
        highlight=False,
    )
    return 0 if ok else 1

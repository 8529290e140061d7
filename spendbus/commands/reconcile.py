"""`spendbus reconcile`: the providers' usage reports fetched or imported, and the ledger
reconciled against them (reconcile/).

The reconciliation's tables live beside the ledger on a ClickHouse server (the
``CLICKHOUSE_DSN`` database); with the embedded engine, whose data path the worker holds,
in an embedded store of their own at ``$SPENDBUS_HOME/reconcile``, and the ledger is read
through the running worker's ``/sql``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from schemas.errors import ConfigError, SpendbusError
from schemas.money import format_usd
from spendbus.commands.output import fail
from spendbus.settings import Settings, load_settings

if TYPE_CHECKING:
    from schemas.pricing import PriceBook

PROVIDER_CHOICE = click.Choice(["openai", "anthropic"])
#: the providers whose billed rates `reconcile prices` writes (LiteLLM's provider names)
BILLED_RATE_PROVIDERS = ("openai", "anthropic", "gemini")


def store_dsn(settings: Settings) -> str:
    """Where the reconciliation tables live (see the module doc)."""
    if settings.dsn.startswith("chdb://"):
        return f"chdb://{(settings.home / 'reconcile').resolve()}"
    return settings.dsn


def since_day(text: str, today: date | None = None) -> date:
    """``30d`` (days back from today, UTC) or a date ``2026-11-01``."""
    today = today or datetime.now(UTC).date()
    match = re.fullmatch(r"(\d{1,4})d", text)
    if match:
        return today - timedelta(days=int(match.group(1)))
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give days back (30d) or a date (2026-11-01)", param_hint="--since"
        ) from None


def ledger_reader(settings: Settings) -> Callable[[str], Sequence[Sequence[Any]]]:
    """Runs SQL on the ledger (the current generation's usage_events)."""
    from spendbus.commands.store_queries import history_query
    from spendbus.stack.local import worker_process

    if settings.dsn.startswith("chdb://") and worker_process(settings).pid() is None:
        raise ConfigError(
            "the embedded ledger is read through the running aggregator worker, and none "
            "runs: start it (`spendbus up`), or point CLICKHOUSE_DSN at a ClickHouse server"
        )
    query = history_query(settings)
    if query is None:
        raise ConfigError(f"the ledger's ClickHouse store cannot be reached ({settings.dsn})")
    return query


def _read(provider: str, reports: dict[str, Any], source: str) -> list[tuple[str, Any]]:
    """Every report read whole (usage, costs) before any is stored: a bad one writes nothing."""
    from reconcile import read_cost_report, read_report

    read: list[tuple[str, Any]] = []
    for kind, pages in reports.items():
        where = f"{source} ({kind})"
        if kind == "usage":
            read.append((kind, read_report(provider, pages, where)))
        else:
            read.append((kind, read_cost_report(provider, pages, where)))
    return read


def _store(provider: str, read: list[tuple[str, Any]], source: str) -> None:
    from reconcile import import_report, open_store

    settings = load_settings()
    store = open_store(store_dsn(settings), settings.clickhouse_access)
    try:
        for kind, report in read:
            import_report(store, report, f"{source} ({kind})")
            days = sorted(report.days)
            span = f"{days[0]}..{days[-1]}" if days else "no day"
            click.echo(
                f"imported {provider} {kind}: {len(report.rows)} row(s), {len(days)} day(s) "
                f"{span} (replacing any earlier import of those days)"
            )
    finally:
        store.close()


@click.command("fetch")
@click.option("--provider", type=PROVIDER_CHOICE, required=True)
@click.option(
    "--admin-key-file",
    required=True,
    help="File (or - for stdin) whose first line is the provider's admin API key.",
)
@click.option("--since", default="30d", show_default=True, help="Days back (30d) or a date.")
@click.option("--base-url", default=None, help="The provider's API root (default: the real one).")
@click.option(
    "--save",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the pages fetched to this file (`reconcile import` reads it).",
)
def reconcile_fetch(
    provider: str, admin_key_file: str, since: str, base_url: str | None, save: Path | None
) -> None:
    """Fetch PROVIDER's usage and cost reports (every page) since --since, and import them."""
    from reconcile import fetch_pages
    from spendbus.secret_input import read_secret

    admin_key = read_secret(admin_key_file, "admin key")
    start = since_day(since)
    try:
        reports = {
            kind: fetch_pages(provider, admin_key, start, base_url, kind)
            for kind in ("usage", "costs")
        }
        if save is not None:
            save.write_text(json.dumps(reports, indent=1))
        source = f"{provider} admin API since {start}"
        _store(provider, _read(provider, reports, source), source)
    except SpendbusError as exc:
        fail(exc)


@click.command("import")
@click.option(
    "--provider", type=click.Choice(["openai", "anthropic", "bedrock", "gemini"]), required=True
)
@click.option(
    "--report",
    "kind",
    type=click.Choice(["usage", "costs"]),
    default=None,
    help="Which report FILE holds (default: told by its results).",
)
@click.option(
    "--sku-table",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="gemini: the SKU table to read the export's SKUs by (default: the shipped one).",
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def reconcile_import(provider: str, kind: str | None, sku_table: Path | None, file: Path) -> None:
    """Import FILE: PROVIDER's usage or cost report as JSON pages (one page or a list of
    them), or both as `fetch --save` writes them ({"usage": [...], "costs": [...]});
    for bedrock, the Bedrock rows of a CUR 2.0 export (CSV); for gemini, the rows of a
    Cloud Billing export to BigQuery (newline-delimited JSON or CSV)."""
    from reconcile import load_sku_table, read_bedrock_cur, read_gemini_export, report_kind

    if provider in ("bedrock", "gemini"):
        try:
            if provider == "bedrock":
                usage, costs = read_bedrock_cur(file.read_text(), str(file))
            else:
                table = load_sku_table(sku_table)
                export = read_gemini_export(file.read_text(), str(file), table)
                usage, costs = export.usage, export.costs
            _store(provider, [("usage", usage), ("costs", costs)], str(file))
            if provider == "gemini":
                click.echo(f"SKU table version {table.version}")
                for gap in export.gaps:
                    click.echo(f"gap: {gap}")
                for name, nanos in sorted(export.credits_nanos.items()):
                    sign = "-" if nanos < 0 else ""
                    click.echo(f"credit {name}: {sign}{format_usd(abs(nanos), 9)} (not netted)")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"{file}: cannot read it ({exc})", param_hint="FILE") from None
        except SpendbusError as exc:
            fail(exc)
        return
    try:
        pages = json.loads(file.read_text())
    except (ValueError, OSError) as exc:
        raise click.BadParameter(f"{file}: not a JSON report ({exc})", param_hint="FILE") from None
    if isinstance(pages, dict) and set(pages) <= {"usage", "costs"} and pages:
        reports = pages
    else:
        kind = kind or report_kind(pages)
        if kind is None:
            raise click.BadParameter(
                f"{file}: no result tells a usage report from a cost report: give --report",
                param_hint="FILE",
            )
        reports = {kind: pages}
    try:
        _store(provider, _read(provider, reports, str(file)), str(file))
    except SpendbusError as exc:
        fail(exc)


@click.command("report")
@click.option(
    "--mapping",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The credential mapping (default: $SPENDBUS_HOME/reconcile.yaml).",
)
@click.option("--since", default=None, help="Only the days from here (30d or a date).")
@click.option("--json", "as_json", is_flag=True, help="The whole reconciliation as JSON.")
@click.option(
    "--alert-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Publish a drift alert on budget.alerts for each day whose token residual exceeds this.",
)
@click.option(
    "--alert-usd",
    default=None,
    help="Publish a drift alert for each day whose cost residual exceeds this many dollars.",
)
@click.option(
    "--prices",
    "prices_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The price file whose long-context tiers explain a cost (default: the shipped one).",
)
def reconcile_report(
    mapping: Path | None,
    since: str | None,
    as_json: bool,
    alert_tokens: int | None,
    alert_usd: str | None,
    prices_file: Path | None,
) -> None:
    """Reconcile every imported day against the ledger: both sides, each delta and its
    cause, the residual no cause explains (stored in the `reconciliation` table)."""
    from reconcile import drift_alerts, load_mapping, open_store, reconcile, render_table

    settings = load_settings()
    alert_nanos = None if alert_usd is None else usd_nanos(alert_usd)
    try:
        credentials = load_mapping(mapping or settings.home / "reconcile.yaml")
        run_query = ledger_reader(settings)
        store = open_store(store_dsn(settings), settings.clickhouse_access)
        try:
            result = reconcile(
                store,
                run_query,
                credentials,
                since=None if since is None else since_day(since),
                prices=reference_prices(prices_file),
            )
        finally:
            store.close()
    except SpendbusError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=1))
    else:
        click.echo(render_table(result))
    alerts = drift_alerts(result.days, residual_tokens=alert_tokens, residual_nanos=alert_nanos)
    if alerts:
        try:
            publish_alerts(settings, alerts)
        except SpendbusError as exc:
            fail(exc)
        click.echo(
            f"published {len(alerts)} drift alert(s) on {settings.topics.budget_alerts}", err=True
        )


@click.command("prices")
@click.option(
    "--mapping",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The credential mapping (default: $SPENDBUS_HOME/reconcile.yaml).",
)
@click.option(
    "--base",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Our price file to extend (default: the one shipped with spendbus).",
)
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the new price file.",
)
@click.option(
    "--version", "version", default=None, help="The new version (default: reconciled-<date>)."
)
@click.option(
    "--effective-from",
    "effective_text",
    default=None,
    metavar="TIMESTAMP",
    help="RFC 3339 time from which the new version prices events (default: today 00:00 UTC).",
)
def reconcile_prices(
    mapping: Path | None,
    base: Path | None,
    output: Path,
    version: str | None,
    effective_text: str | None,
) -> None:
    """Write a new price version at the rates the provider billed where only the price
    differs (cause `price`), through `prices import`'s path; `prices apply` publishes it."""
    import tempfile

    from reconcile import effective_price_map, load_mapping, open_store, price_map_text, reconcile
    from schemas.pricing import PriceBook
    from schemas.pricing.writer import import_prices, price_file_text, read_source
    from spendbus.commands.prices_sync import next_version

    settings = load_settings()
    base_path, tables, newest, effective, version = next_version(
        base, version, effective_text, "reconciled"
    )
    try:
        credentials = load_mapping(mapping or settings.home / "reconcile.yaml")
        run_query = ledger_reader(settings)
        store = open_store(store_dsn(settings), settings.clickhouse_access)
        try:
            # a long-context step is a tier, never a base rate: those costs are left out
            result = reconcile(store, run_query, credentials, prices=PriceBook(tables))
        finally:
            store.close()
        entries, notes = effective_price_map(result.costs)
        if not entries:
            raise ConfigError(
                "no (model, tier) whose tokens agree and whose money does not: no rate to write"
            )
        with tempfile.TemporaryDirectory() as scratch:
            rates = Path(scratch) / "billed-rates.json"
            rates.write_text(price_map_text(entries))
            source = read_source(
                "litellm", rates, providers=BILLED_RATE_PROVIDERS, on=effective.date()
            )
        table, report = import_prices(
            newest, source, version=version, effective_from=effective, add_new=False
        )
    except SpendbusError as exc:
        fail(exc)
    header = (
        f"spendbus price file: {base_path.name} and version {version!r} at the rates the\n"
        "providers billed (`spendbus reconcile prices`, run "
        f"{result.run_id}). Every price is USD per million tokens, exact."
    )
    output.write_text(price_file_text([*tables, table], header=header), encoding="utf-8")
    click.echo(
        f"{output}: version {version!r} from {effective.isoformat()}: "
        f"{len(report.updated)} updated at the billed rates, {len(report.unchanged)} unchanged",
        err=True,
    )
    for item in [*report.updated, *report.conflicts, *notes, *source.warnings]:
        click.echo(f"  {item}", err=True)


def reference_prices(path: Path | None) -> PriceBook:
    """The PriceBook of ``path`` (default: the shipped price file); a bad file fails the
    command naming it."""
    from schemas.pricing import PriceBook, default_price_file, load_price_file

    return PriceBook(load_price_file(path or default_price_file()))


def usd_nanos(text: str) -> int:
    """``--alert-usd`` in nanos: a decimal amount of dollars, >= 0."""
    from decimal import Decimal, InvalidOperation

    try:
        amount = Decimal(text)
    except InvalidOperation:
        amount = Decimal(-1)
    if not amount.is_finite() or amount < 0:
        raise click.BadParameter(f"{text!r}: a dollar amount >= 0", param_hint="--alert-usd")
    return int(amount * 10**9)


def publish_alerts(settings: Settings, alerts: Sequence[Any]) -> None:
    """The alerts on budget.alerts, keyed by counter key as the aggregator's are."""
    import asyncio

    from schemas.codec import ALERT
    from spendbus.stack.compacted import publish
    from spendbus.stack.local import bootstrap_or_fail

    records = [(a["counter_key"].encode(), ALERT.encode(a)) for a in alerts]
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_alerts,
            records,
            security=settings.kafka_security,
        )
    )

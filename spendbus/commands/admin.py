"""Operator commands over the store and the topics: prices apply, usage, sql, verify
(``spendbus budgets`` is budgets.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from schemas.codec import PRICE_TABLE
from schemas.money import format_usd
from schemas.pricing import default_price_file, load_price_file
from spendbus.commands.output import console
from spendbus.commands.store_queries import current_store, history_query
from spendbus.settings import load_settings
from spendbus.stack.compacted import publish
from spendbus.stack.local import bootstrap_or_fail, worker_process


def prices_apply_command() -> click.Command:
    @click.command("apply")
    @click.argument(
        "file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
    )
    def prices_apply(file: Path | None) -> None:
        """Validate FILE (default: the prices shipped with spendbus) and publish each price
        version onto the compacted pricing topic."""
        file = file or default_price_file()
        tables = load_price_file(file)
        settings = load_settings()
        records = [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables]
        asyncio.run(
            publish(
                bootstrap_or_fail(settings),
                settings.topics.pricing,
                records,
                security=settings.kafka_security,
            )
        )
        click.echo(
            f"applied {len(tables)} price version(s) from {file}: {', '.join(t.version for t in tables)}"
        )

    return prices_apply


@click.command()
@click.option("--org-id", help="An org: its counters (with --secret-id: one request's context).")
@click.option(
    "--secret-id",
    help="With --org-id: the counters one request of this secret counts in (the enforcer's "
    "view; --project-id... narrow that context).",
)
@click.option("--budget", "budget_ids", multiple=True, help="Only this budget (repeatable).")
@click.option("--project-id")
@click.option("--grant-id")
@click.option("--user-id")
@click.option("--session-id")
@click.option("--group", "groups", multiple=True)
@click.option("--tag", "tags", multiple=True, help="name=value")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the page's counters.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(min=1), help="Counters a page."
)
@click.option("--offset", default=0, type=click.IntRange(min=0), help="Counters to skip.")
def usage(
    as_json: bool,
    as_csv: bool,
    groups: tuple[str, ...],
    tags: tuple[str, ...],
    budget_ids: tuple[str, ...],
    limit: int,
    offset: int,
    **ids: str | None,
) -> None:
    """Budget counters with their spend, limits, raise, reset and forecast: every live
    counter (of --org-id, of --budget), or with --org-id and --secret-id the ones a request
    of that context counts in, from the enforcer itself.

    Either way these are the numbers the enforcers check: the current generation's
    verdicts. A forecast (exhausts) is shown only when it falls within the period.
    """
    from spendbus.commands.usage_view import live_counters, show

    if as_json and as_csv:
        raise click.UsageError("--json or --csv, one of them")
    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    if ids["secret_id"] and not ids["org_id"]:
        raise click.UsageError("--secret-id names a request's context: give its --org-id too")
    if ids["secret_id"]:
        rows = _context_usage(settings, bootstrap, groups, tags, ids)
        if budget_ids:
            rows = [r for r in rows if r["budget_id"] in budget_ids]
    else:
        narrowing = (
            [k for k, v in ids.items() if v and k != "org_id"]
            + (["group"] if groups else [])
            + (["tag"] if tags else [])
        )
        if narrowing:
            raise click.UsageError(
                f"--{narrowing[0].replace('_', '-')} narrows a request's context: "
                "give --org-id and --secret-id with it"
            )
        rows = live_counters(settings, bootstrap, org_id=ids["org_id"], budget_ids=budget_ids)
    fmt = "json" if as_json else "csv" if as_csv else "table"
    note = show(rows, fmt=fmt, limit=limit, offset=offset, console=console)
    if note is not None:
        click.echo(note, err=True)


def _context_usage(
    settings: Any,
    bootstrap: str,
    groups: tuple[str, ...],
    tags: tuple[str, ...],
    ids: dict[str, str | None],
) -> list[dict[str, Any]]:
    """The enforcer's counters for one request context, caught up with the verdicts."""
    from enforcer import Enforcer, EnforcerConfig

    config = EnforcerConfig(
        bootstrap=bootstrap,
        kafka_security=settings.kafka_security,
        topic_prefix=settings.topic_prefix,
    )
    fields: dict[str, Any] = {k: v for k, v in ids.items() if v}

    async def read() -> list[dict[str, Any]]:
        async with Enforcer(config) as enforcer:
            await enforcer.wait_ready()
            ctx = enforcer.context(
                groups=groups, tags=dict(t.split("=", 1) for t in tags), **fields
            )
            return [status.to_json() for status in enforcer.usage(ctx)]

    return asyncio.run(read())


@click.command()
@click.argument("query")
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON.")
def sql(query: str, as_json: bool) -> None:
    """Run an analyst QUERY on ClickHouse (through the running worker when it owns the store).

    Through the worker the query runs read-only and sends the web token; a server DSN
    is asked directly with its own credentials (CLICKHOUSE_* TLS settings apply).
    """
    settings = load_settings()
    worker = worker_process(settings)
    if worker.pid() is not None and settings.dsn.startswith("chdb://"):
        result = worker.post("/sql", {"sql": query})
        columns, rows = result["columns"], result["rows"]
    else:
        from aggregator import open_client, run_query

        client = open_client(current_store(settings), access=settings.clickhouse_access)
        columns, rows = run_query(client, query)
    if as_json:
        click.echo(
            json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=2)
        )
        return
    table = Table(*columns)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)


@click.command()
@click.option("--json", "as_json", is_flag=True)
def verify(as_json: bool) -> None:
    """Recompute every counter from usage.raw and compare with the live verdicts and with
    every period of ClickHouse's budget_history (read-only).

    Exit status 0 when they agree, 1 with the list of differences otherwise.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from aggregator import current_generation, verify_counters

    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    # the live verdicts are those of the generation the enforcers follow (after a cutover: the new one)
    topics = settings.topics.of_generation(
        asyncio.run(
            current_generation(bootstrap, settings.topics, security=settings.kafka_security)
        )
    )
    store_query = history_query(settings)
    with Progress(
        TextColumn("[bold]reading usage.raw"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    ) as bar:
        task = bar.add_task("ledger", total=None)
        report = asyncio.run(
            verify_counters(
                bootstrap,
                topics,
                lambda done, total: bar.update(task, completed=done, total=total),
                security=settings.kafka_security,
                history_query=store_query,
                session_idle_seconds=settings.session_idle_seconds,
            )
        )
    summary = {
        "records": report.records,
        "charged": report.stats.charged,
        "duplicates": report.stats.duplicates,
        "dead_letters": report.stats.dead_letters,
        "cost_nanos": report.stats.cost_nanos,
        "counters": report.counters,
        "verdicts_compared": report.verdicts_compared,
        "periods_compared": report.periods_compared,
        "differences": [d.__dict__ for d in report.differences],
    }
    if as_json:
        click.echo(json.dumps(summary, default=str))
    else:
        console.print(
            f"{report.records:,} records, {report.stats.charged:,} charged "
            f"({format_usd(report.stats.cost_nanos)}), {report.counters:,} counters recomputed"
        )
        periods = (
            "budget_history not compared (ClickHouse did not answer)"
            if report.periods_compared is None
            else f"{report.periods_compared:,} (counter, period) pairs compared with budget_history"
        )
        console.print(
            f"{report.verdicts_compared:,} newest periods compared with their live verdicts, "
            f"{periods}"
        )
        if report.ok:
            console.print("[green]every compared period equals the recomputation[/green]")
        else:
            table = Table("counter", "period", "field", "recomputed", "stored", title="differences")
            for d in report.differences:
                table.add_row(
                    d.counter_key, d.period or "(verdict)", d.field, str(d.recomputed), str(d.live)
                )
            console.print(table)
    sys.exit(0 if report.ok else 1)

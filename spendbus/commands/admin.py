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
from spendbus.commands.output import console, limits_text
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
@click.option("--org-id", required=True)
@click.option("--secret-id", required=True)
@click.option("--project-id")
@click.option("--grant-id")
@click.option("--user-id")
@click.option("--session-id")
@click.option("--group", "groups", multiple=True)
@click.option("--tag", "tags", multiple=True, help="name=value")
@click.option("--json", "as_json", is_flag=True)
def usage(as_json: bool, groups: tuple[str, ...], tags: tuple[str, ...], **ids: str | None) -> None:
    """Per applicable budget, the numbers the enforcer uses (its verdicts), with limits and
    resets, and the forecast: the burn over the trailing hour and when a limit runs out at it.

    This is the enforcer itself, caught up with the verdict topic: reporting and
    enforcement read the same counters.
    """
    from enforcer import Enforcer, EnforcerConfig

    settings = load_settings()
    config = EnforcerConfig(
        bootstrap=bootstrap_or_fail(settings),
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

    rows = asyncio.run(read())
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    table = Table(
        "budget", "scope", "period", "state", "spent", "limit", "reset", "burn/h", "exhausts"
    )
    for r in rows:
        burn = r["burn_per_hour"]
        table.add_row(
            r["budget_id"],
            "/".join(r["scope_values"]),
            r["period"],
            r["state"],
            limits_text(
                r["spent_nanos"] if r["limit_nanos"] is not None else None,
                r["spent_tokens"] if r["limit_tokens"] is not None else None,
                r["spent_requests"] if r["limit_requests"] is not None else None,
            ),
            limits_text(r["limit_nanos"], r["limit_tokens"], r["limit_requests"]),
            str(r["reset_at"] or "never"),
            "-" if burn is None else burn_text(burn, r),
            str(r["exhausts_at"] or "-"),
        )
    console.print(table)


def burn_text(burn: dict[str, int], row: dict[str, Any]) -> str:
    """The trailing-hour burn of the limits a counter has (``usage``'s burn/h column)."""
    return limits_text(
        burn["nanos"] if row["limit_nanos"] is not None else None,
        burn["tokens"] if row["limit_tokens"] is not None else None,
        burn["requests"] if row["limit_requests"] is not None else None,
    )


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

"""Operator commands over the compacted topics and the store: budgets, prices apply, usage, sql."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, PRICE_TABLE
from schemas.errors import ConfigError, ContractError, SpendbusError
from schemas.ids import canonical_id
from schemas.money import format_usd, usd_to_nanos
from schemas.periods import from_micros, to_micros
from schemas.pricing import PriceBook, PriceTable, default_price_file, load_price_file
from schemas.raises import BudgetRaise, scope_values_of
from spendbus.settings import Settings, load_settings
from spendbus.stack.compacted import publish, read_compacted
from spendbus.stack.local import bootstrap_or_fail, worker_process

console = Console()


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


@click.group()
def budgets() -> None:
    """Budget policies on the compacted budget.policies topic."""


@budgets.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--model",
    "models",
    multiple=True,
    help="A model your proxies route (repeatable): checked for a price beside those in use.",
)
def budgets_apply(file: Path, models: tuple[str, ...]) -> None:
    """Validate FILE (a YAML list of budgets) and publish every budget in it.

    Warns about every model without a price that a budget with limit_usd would see: the
    models its ``match`` names, those given with --model, and those in usage_events over
    the last 30 days (when ClickHouse answers)."""
    parsed = budgets_from_yaml(_load_yaml(file), source=str(file))
    settings = load_settings()
    now = datetime.now(UTC)
    bootstrap = bootstrap_or_fail(settings)
    routed = list(models)
    if any(b.limit_nanos is not None for b in parsed):
        seen = _models_in_use(settings)
        if seen is None:
            console.print(
                f"[yellow]note:[/yellow] {file}: the models in use were not checked for a "
                "price (ClickHouse did not answer); name them with --model",
                highlight=False,
            )
        else:
            routed.extend(seen)
    tables = asyncio.run(
        read_compacted(bootstrap, settings.topics.pricing, security=settings.kafka_security)
    )
    book = PriceBook([PriceTable.from_record(PRICE_TABLE.decode(v)) for v in tables.values() if v])
    for warning in unpriced_warnings(book, parsed, routed, now):
        console.print(f"[yellow]warning:[/yellow] {file}: {warning}", highlight=False)
    records = [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in parsed]
    asyncio.run(
        publish(
            bootstrap, settings.topics.budget_policies, records, security=settings.kafka_security
        )
    )
    click.echo(f"applied {len(parsed)} budgets from {file}")


#: how far back ``budgets apply`` looks for the models in use, and how many it reads
MODELS_IN_USE_DAYS = 30
MODELS_IN_USE_LIMIT = 10_000


def _models_in_use(settings: Settings) -> list[str] | None:
    """The models of usage_events over the last MODELS_IN_USE_DAYS days; None when the
    store does not answer."""
    from aggregator.sink.errors import SinkError

    try:
        query = _history_query(settings)
        if query is None:
            return None
        rows = query(
            "SELECT DISTINCT model FROM usage_events WHERE occurred_at >= now() - INTERVAL "
            f"{MODELS_IN_USE_DAYS} DAY ORDER BY model LIMIT {MODELS_IN_USE_LIMIT}"
        )
    except (SpendbusError, SinkError, OSError, RuntimeError, ValueError):
        return None
    return [str(row[0]) for row in rows]


def unpriced_warnings(
    book: PriceBook, budgets: list[Budget], routed: list[str], now: datetime
) -> list[str]:
    """A warning per (budget with limit_usd, model it would see without a price): the
    models its ``match`` names, and every routed model when its ``match`` allows it."""
    warnings = []
    for budget in budgets:
        if budget.limit_nanos is None:
            continue
        named = budget.match.get("model", ())
        candidates = list(named) + [
            m for m in routed if not named or canonical_id(m, "model") in named
        ]
        for model in book.unpriced_models(candidates, now):
            source = "named by its match" if model in named else "routed"
            if budget.action != "enforce":
                then = "a warn budget: its events count $0"
            elif budget.unpriced == "allow_free":
                then = "admitted and charged $0 (unpriced: allow_free)"
            elif budget.unpriced == "refuse":
                then = "its requests are refused (unpriced: refuse)"
            else:
                then = (
                    "its requests are refused (the enforcer's default unpriced_models: refuse, "
                    "unless configured allow_free: then charged $0)"
                )
            warnings.append(
                f"budget {budget.budget_id!r}: limit_usd, and model {model!r} ({source}) has "
                f"no price in the applied price versions: {then}"
            )
    return warnings


@budgets.command("list")
@click.option("--json", "as_json", is_flag=True)
def budgets_list(as_json: bool) -> None:
    """The live budgets."""
    settings = load_settings()
    values = asyncio.run(
        read_compacted(
            bootstrap_or_fail(settings),
            settings.topics.budget_policies,
            security=settings.kafka_security,
        )
    )
    live = [Budget.from_record(BUDGET_POLICY.decode(v)) for v in values.values() if v is not None]
    live.sort(key=lambda b: b.budget_id)
    if as_json:
        click.echo(json.dumps([_budget_json(b) for b in live], indent=2))
        return
    table = Table("id", "scope", "match", "window", "limit", "action", "alerts")
    for b in live:
        table.add_row(
            b.budget_id,
            b.scope,
            ", ".join(f"{k}={'|'.join(v)}" for k, v in b.match.items()) or "-",
            " ".join([b.window.spec, *(f"{k}={v}" for k, v in b.window.calendar.items())]),
            " · ".join(
                part
                for part in (_limits(b.limit_nanos, b.limit_tokens, b.limit_requests), _rate(b))
                if part
            ),
            b.action,
            ", ".join(f"{t:g}" for t in b.alert_at) or "-",
        )
    console.print(table)


@budgets.command("delete")
@click.argument("budget_id")
def budgets_delete(budget_id: str) -> None:
    """Delete a budget (a tombstone on budget.policies)."""
    settings = load_settings()
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_policies,
            [(budget_id.encode(), None)],
            security=settings.kafka_security,
        )
    )
    click.echo(f"deleted budget {budget_id}")


def _budget_json(b: Budget) -> dict[str, Any]:
    record = b.to_record()
    record.pop("applied_at")
    return record


def _rate(b: Budget) -> str:
    """A budget's rate limits, e.g. ``600 req/min, 2,000 tok/s``."""
    if b.rate is None:
        return ""
    short = {"requests": "req", "tokens": "tok"}
    return ", ".join(
        f"{count:,} {short[unit]}/{'s' if seconds == 1 else 'min'}"
        for unit, count, seconds in b.rate.limits()
    )


def _limits(nanos: int | None, tokens: int | None, requests: int | None) -> str:
    parts = []
    if nanos is not None:
        parts.append(format_usd(nanos, 2))
    if tokens is not None:
        parts.append(f"{tokens:,} tok")
    if requests is not None:
        parts.append(f"{requests:,} req")
    return " / ".join(parts)


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
    """Per applicable budget, the numbers the enforcer uses (its verdicts), with limits and resets.

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
    table = Table("budget", "scope", "period", "state", "spent", "limit", "reset")
    for r in rows:
        table.add_row(
            r["budget_id"],
            "/".join(r["scope_values"]),
            r["period"],
            r["state"],
            _limits(
                r["spent_nanos"] if r["limit_nanos"] is not None else None,
                r["spent_tokens"] if r["limit_tokens"] is not None else None,
                r["spent_requests"] if r["limit_requests"] is not None else None,
            ),
            _limits(r["limit_nanos"], r["limit_tokens"], r["limit_requests"]),
            str(r["reset_at"] or "never"),
        )
    console.print(table)


def _current_store(settings: Settings) -> str:
    """The ClickHouse store of the generation the enforcers follow (after a cutover: the new one).

    Without Kafka the control topic cannot be read: the default generation's store is
    used, and the analyst is told so.
    """
    from aiokafka.errors import KafkaError

    from aggregator.generations import current_generation, generation_dsn

    try:
        bootstrap = bootstrap_or_fail(settings)
        generation = asyncio.run(
            asyncio.wait_for(
                current_generation(bootstrap, settings.topics, security=settings.kafka_security), 10
            )
        )
    except (ConfigError, TimeoutError, OSError, KafkaError) as exc:
        click.echo(
            f"warning: current generation unknown ({type(exc).__name__}); "
            "reading the default generation's store",
            err=True,
        )
        return settings.dsn
    return generation_dsn(settings.dsn, generation)


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
        from aggregator.sink.query import run_query
        from aggregator.sink.store import open_client

        client = open_client(_current_store(settings), access=settings.clickhouse_access)
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


def fail(exc: SpendbusError) -> None:
    console.print(f"[red]error:[/red] {exc}", highlight=False)
    sys.exit(2)


def _history_query(settings: Any) -> Callable[[str], list[Any]] | None:
    """Runs a query on the current generation's store: through the running worker when it
    owns the embedded engine, else directly; None when neither answers (verify then
    compares the live verdicts only, and says so)."""
    worker = worker_process(settings)
    if worker.pid() is not None and settings.dsn.startswith("chdb://"):
        return lambda query: list(worker.post("/sql", {"sql": query})["rows"])
    from aggregator.sink.errors import SinkError
    from aggregator.sink.query import run_query
    from aggregator.sink.store import open_client

    try:
        client = open_client(_current_store(settings), access=settings.clickhouse_access)
    except SinkError:
        return None
    return lambda query: list(run_query(client, query)[1])


@click.command()
@click.option("--json", "as_json", is_flag=True)
def verify(as_json: bool) -> None:
    """Recompute every counter from usage.raw and compare with the live verdicts and with
    every period of ClickHouse's budget_history (read-only).

    Exit status 0 when they agree, 1 with the list of differences otherwise.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from aggregator.generations import current_generation
    from aggregator.verify import verify as run_verify

    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    # the live verdicts are those of the generation the enforcers follow (after a cutover: the new one)
    topics = settings.topics.of_generation(
        asyncio.run(
            current_generation(bootstrap, settings.topics, security=settings.kafka_security)
        )
    )
    history_query = _history_query(settings)
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
            run_verify(
                bootstrap,
                topics,
                lambda done, total: bar.update(task, completed=done, total=total),
                security=settings.kafka_security,
                history_query=history_query,
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


# --- temporary raises (budget.raises) ---------------------------------------------------


def _raise_until(text: str, now: datetime) -> datetime:
    """``--until``: an ISO 8601 time with its zone (``2026-12-31T18:00:00Z``) or a duration
    from now (``90s``, ``30m``, ``6h``, ``2d``)."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return now + timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        until = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--until {text!r}: give a time with its zone (2026-12-31T18:00:00Z) or a "
            "duration from now (90s, 30m, 6h, 2d)"
        ) from None
    if until.tzinfo is None:
        raise ConfigError(f"--until {text!r}: the time needs a zone (Z or +01:00)")
    return until.astimezone(UTC)


def _live_budget(settings: Settings, budget_id: str) -> Budget:
    values = asyncio.run(
        read_compacted(
            bootstrap_or_fail(settings),
            settings.topics.budget_policies,
            security=settings.kafka_security,
        )
    )
    value = values.get(budget_id.encode())
    if value is None:
        raise ConfigError(f"no budget {budget_id!r} (spendbus budgets list shows them)")
    return Budget.from_record(BUDGET_POLICY.decode(value))


def _raises(settings: Settings) -> list[BudgetRaise]:
    values = asyncio.run(
        read_compacted(
            bootstrap_or_fail(settings),
            settings.topics.budget_raises,
            security=settings.kafka_security,
        )
    )
    out = [BudgetRaise.from_record(BUDGET_RAISE.decode(v)) for v in values.values() if v]
    return sorted(out, key=lambda r: r.starts_at_us)


def _raise_text(r: BudgetRaise) -> str:
    sign = "+" if r.mode == "by" else "="
    parts = []
    if r.raise_nanos is not None:
        parts.append(f"{sign}{format_usd(r.raise_nanos, 2)}")
    if r.raise_tokens is not None:
        parts.append(f"{sign}{r.raise_tokens:,} tokens")
    if r.raise_requests is not None:
        parts.append(f"{sign}{r.raise_requests:,} requests")
    return ", ".join(parts)


@budgets.command("raise")
@click.argument("budget_id")
@click.option("--scope", "scope_text", help="One counter (as usage shows it: ORG or ORG/ID).")
@click.option("--by", "by_usd", help="USD added to the budget's limit while the raise lasts.")
@click.option("--to", "to_usd", help="The USD limit while the raise lasts.")
@click.option(
    "--tokens", type=click.IntRange(min=1), help="Tokens added (or, with --to, the limit)."
)
@click.option(
    "--requests", type=click.IntRange(min=1), help="Requests added (or, with --to, the limit)."
)
@click.option(
    "--until", "until_text", required=True, help="An ISO time with zone, or 90s/30m/6h/2d."
)
@click.option("--reason", required=True, help="Why (kept with the raise on the topic).")
def budgets_raise(
    budget_id: str,
    scope_text: str | None,
    by_usd: str | None,
    to_usd: str | None,
    tokens: int | None,
    requests: int | None,
    until_text: str,
    reason: str,
) -> None:
    """Raise a budget's limits (one counter with --scope, else every counter) until --until."""
    import getpass
    import uuid

    settings = load_settings()
    try:
        if by_usd is not None and to_usd is not None:
            raise ConfigError("give --by or --to, not both")
        if by_usd is None and to_usd is None and tokens is None and requests is None:
            raise ConfigError("give --by USD or --to USD (and/or --tokens, --requests)")
        if not reason.strip():
            raise ConfigError("--reason: say why the limit is raised")
        now = datetime.now(UTC)
        until = _raise_until(until_text, now)
        if until <= now:
            raise ConfigError(f"--until {until.isoformat()} has passed")
        budget = _live_budget(settings, budget_id)
        usd = by_usd if by_usd is not None else to_usd
        nanos = None if usd is None else usd_to_nanos(usd)
        if nanos is not None and nanos <= 0:
            raise ConfigError("the USD amount must be > 0")
        for amount, limit, name in (
            (nanos, budget.limit_nanos, "a USD limit (limit_usd)"),
            (tokens, budget.limit_tokens, "limit_tokens"),
            (requests, budget.limit_requests, "limit_requests"),
        ):
            if amount is not None and limit is None:
                raise ConfigError(f"budget {budget_id!r} has no {name} to raise")
        scope_values = () if scope_text is None else scope_values_of(budget.scope, scope_text)
    except (ConfigError, ContractError) as exc:
        fail(exc)
    granted = BudgetRaise(
        raise_id=f"r-{uuid.uuid4().hex[:12]}",
        budget_id=budget_id,
        scope_values=scope_values,
        mode="to" if to_usd is not None else "by",
        raise_nanos=nanos,
        raise_tokens=tokens,
        raise_requests=requests,
        starts_at_us=to_micros(now),
        until_us=to_micros(until),
        reason=reason.strip(),
        created_by=getpass.getuser(),
    )
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_raises,
            [(granted.raise_id.encode(), BUDGET_RAISE.encode(granted.to_record()))],
            security=settings.kafka_security,
        )
    )
    ln, lt, lr = granted.limits(budget.limit_nanos, budget.limit_tokens, budget.limit_requests)
    target = "/".join(scope_values) if scope_values else "every counter"
    click.echo(
        f"raised {budget_id} ({target}) {_raise_text(granted)}: limits "
        f"{_limits(budget.limit_nanos, budget.limit_tokens, budget.limit_requests)} -> "
        f"{_limits(ln, lt, lr)} until {until.isoformat().replace('+00:00', 'Z')} "
        f"(raise {granted.raise_id})"
    )


@budgets.command("revoke-raise")
@click.argument("budget_id")
@click.option("--scope", "scope_text", help="The counter raised (ORG or ORG/ID); else budget-wide.")
@click.option("--raise-id", help="Only this raise.")
def budgets_revoke_raise(budget_id: str, scope_text: str | None, raise_id: str | None) -> None:
    """End a budget's active raises now (the records stay on the topic, marked revoked)."""
    settings = load_settings()
    try:
        budget = _live_budget(settings, budget_id)
        scope_values = () if scope_text is None else scope_values_of(budget.scope, scope_text)
    except (ConfigError, ContractError) as exc:
        fail(exc)
    now_us = to_micros(datetime.now(UTC))
    ending = [
        r
        for r in _raises(settings)
        if r.budget_id == budget_id
        and r.active(now_us)
        and (r.raise_id == raise_id if raise_id else r.scope_values == scope_values)
    ]
    if not ending:
        fail(ConfigError(f"no active raise of {budget_id!r} matches"))
    records = [
        (r.raise_id.encode(), BUDGET_RAISE.encode(replace(r, revoked_at_us=now_us).to_record()))
        for r in ending
    ]
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_raises,
            records,
            security=settings.kafka_security,
        )
    )
    click.echo(f"revoked {', '.join(r.raise_id for r in ending)} of {budget_id}")


@budgets.command("raises")
@click.option("--json", "as_json", is_flag=True)
def budgets_raises(as_json: bool) -> None:
    """Every raise on budget.raises (active, expired and revoked), oldest first."""
    settings = load_settings()
    now_us = to_micros(datetime.now(UTC))
    rows = _raises(settings)

    def status(r: BudgetRaise) -> str:
        if r.active(now_us):
            return "active"
        if r.revoked_at_us is not None and r.revoked_at_us <= now_us:
            return "revoked"
        return "expired" if r.until_us <= now_us else "pending"

    if as_json:
        click.echo(
            json.dumps(
                [{**r.to_record(), "status": status(r)} for r in rows], default=str, indent=2
            )
        )
        return
    table = Table("raise", "budget", "counter", "raise", "from", "until", "status", "by", "reason")
    for r in rows:
        table.add_row(
            r.raise_id,
            r.budget_id,
            "/".join(r.scope_values) or "*",
            _raise_text(r),
            iso_of(r.starts_at_us),
            iso_of(r.ends_at_us),
            status(r),
            r.created_by,
            r.reason,
        )
    console.print(table)


def iso_of(us: int) -> str:
    return from_micros(us).isoformat(timespec="seconds").replace("+00:00", "Z")

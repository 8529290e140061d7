"""`spendbus budgets apply | list | delete`: budget policies on the compacted budget.policies
topic (the group is spendbus/cli.py's; the temporary raises are in budget_raises.py, the
check with no broker in budget_validate.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml
from rich.table import Table

from runtime.topic_reader import read_latest_values
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.errors import ConfigError, SpendbusError
from schemas.ids import canonical_id
from schemas.pricing import PriceBook, PriceTable
from spendbus.commands.budget_loading import Loading, spent_lines, wait_counted, worker_stats
from spendbus.commands.output import console, limits_text
from spendbus.commands.store_queries import history_query
from spendbus.settings import Settings, load_settings
from spendbus.stack.compacted import publish
from spendbus.stack.local import bootstrap_or_fail


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


@click.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--model",
    "models",
    multiple=True,
    help="A model your proxies route (repeatable): checked for a price beside those in use.",
)
@click.option(
    "--wait",
    "wait_s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for the workers to count each budget from its period's start "
    "(0: do not wait).",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    help="An aggregator worker's web address (repeatable; default: the local worker).",
)
def budgets_apply(
    file: Path, models: tuple[str, ...], wait_s: float, workers: tuple[str, ...]
) -> None:
    """Validate FILE (a YAML list of budgets) and publish every budget in it.

    Warns about every model without a price that a budget with limit_usd would see: the
    models its ``match`` names, those given with --model, and those in usage_events over
    the last 30 days (when ClickHouse answers).

    A budget counts its current period from its first moment: the workers fold the
    period's events already in the ledger into it. This waits (--wait) until they have and
    prints what each budget has spent this period; a new enforce budget goes out as warn
    until then, so enforcers enforce it on that spend."""
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
        read_latest_values(bootstrap, settings.topics.pricing, security=settings.kafka_security)
    )
    book = PriceBook([PriceTable.from_record(PRICE_TABLE.decode(v)) for v in tables.values() if v])
    for warning in unpriced_warnings(book, parsed, routed, now):
        console.print(f"[yellow]warning:[/yellow] {file}: {warning}", highlight=False)
    # a new enforce budget goes out as warn first: the workers count its period from the
    # ledger meanwhile, and the enforcers enforce it only once its verdicts hold that spend
    staged = _new_enforce_budgets(settings, bootstrap, parsed) if wait_s > 0 else set()
    _publish_budgets(
        settings,
        bootstrap,
        [replace(b, action="warn") if b.budget_id in staged else b for b in parsed],
        now,
    )
    click.echo(f"applied {len(parsed)} budgets from {file}")
    if wait_s <= 0:
        return
    loading = _report_spent(settings, bootstrap, parsed, workers, wait_s)
    enforced = [b for b in parsed if b.budget_id in staged]
    if enforced:
        _publish_budgets(settings, bootstrap, enforced, now)
    for budget in enforced:
        if budget.budget_id in loading.counted:
            click.echo(f"{budget.budget_id}: enforced from now")
        else:
            console.print(
                f"[yellow]warning:[/yellow] {budget.budget_id}: enforced before every worker "
                "counted its period: until they have, enforcers see only the spend its "
                "verdicts show so far",
                highlight=False,
            )


def _publish_budgets(
    settings: Settings, bootstrap: str, budgets: list[Budget], now: datetime
) -> None:
    records = [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in budgets]
    asyncio.run(
        publish(
            bootstrap, settings.topics.budget_policies, records, security=settings.kafka_security
        )
    )


def _new_enforce_budgets(settings: Settings, bootstrap: str, parsed: list[Budget]) -> set[str]:
    """The enforce budgets of ``parsed`` that budget.policies does not hold yet."""
    current = asyncio.run(
        read_latest_values(
            bootstrap, settings.topics.budget_policies, security=settings.kafka_security
        )
    )
    known = {key.decode() for key, value in current.items() if value is not None}
    return {b.budget_id for b in parsed if b.action == "enforce" and b.budget_id not in known}


def _report_spent(
    settings: Settings,
    bootstrap: str,
    parsed: list[Budget],
    workers: tuple[str, ...],
    wait_s: float,
) -> Loading:
    """What each applied budget has spent this period, once the workers count it."""
    from spendbus.commands.usage_view import live_counters
    from spendbus.stack.local import worker_process

    urls = [w if "://" in w else f"http://{w}" for w in workers]
    urls = urls or [worker_process(settings).base_url]
    loading = wait_counted(parsed, urls, worker_stats(settings), wait_s)
    for url in loading.silent:
        console.print(f"[yellow]note:[/yellow] no aggregator worker answers on {url}")
    counted = [b.budget_id for b in parsed if b.budget_id in loading.counted]
    counters = (
        live_counters(settings, bootstrap, org_id=None, budget_ids=tuple(counted))
        if counted
        else []
    )
    for line in spent_lines(parsed, loading, counters):
        click.echo(line)
    return loading


#: how far back ``budgets apply`` looks for the models in use, and how many it reads
MODELS_IN_USE_DAYS = 30
MODELS_IN_USE_LIMIT = 10_000


def _models_in_use(settings: Settings) -> list[str] | None:
    """The models of usage_events over the last MODELS_IN_USE_DAYS days; None when the
    store does not answer."""
    from aggregator import SinkError

    try:
        query = history_query(settings)
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


@click.command("list")
@click.option("--json", "as_json", is_flag=True)
def budgets_list(as_json: bool) -> None:
    """The live budgets."""
    settings = load_settings()
    values = asyncio.run(
        read_latest_values(
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
                for part in (limits_text(b.limit_nanos, b.limit_tokens, b.limit_requests), _rate(b))
                if part
            ),
            b.action,
            ", ".join(f"{t:g}" for t in b.alert_at) or "-",
        )
    console.print(table)


@click.command("delete")
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

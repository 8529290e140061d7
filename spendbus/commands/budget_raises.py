"""`spendbus budgets raise | revoke-raise | raises`: temporary raises of a budget's limits,
on the compacted budget.raises topic."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime

import click
from rich.table import Table

from runtime.compacted import publish
from runtime.topic_reader import read_latest_values
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE
from schemas.errors import ConfigError, ContractError
from schemas.money import format_usd
from schemas.periods import from_micros, to_micros
from schemas.raises import BudgetRaise, grant_raise, scope_values_of
from spendbus.commands.output import console, fail, limits_text
from spendbus.settings import Settings, load_settings
from spendbus.stack.local import bootstrap_or_fail


def _live_budget(settings: Settings, budget_id: str) -> Budget:
    values = asyncio.run(
        read_latest_values(
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
        read_latest_values(
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


@click.command("raise")
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

    settings = load_settings()
    now = datetime.now(UTC)
    try:
        budget = _live_budget(settings, budget_id)
        granted = grant_raise(
            budget,
            scope_text=scope_text,
            by_usd=by_usd,
            to_usd=to_usd,
            tokens=tokens,
            requests=requests,
            until_text=until_text,
            reason=reason,
            created_by=getpass.getuser(),
            now=now,
        )
    except (ConfigError, ContractError) as exc:
        fail(exc)
    until = from_micros(granted.until_us)
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_raises,
            [(granted.raise_id.encode(), BUDGET_RAISE.encode(granted.to_record()))],
            security=settings.kafka_security,
        )
    )
    ln, lt, lr = granted.limits(budget.limit_nanos, budget.limit_tokens, budget.limit_requests)
    target = "/".join(granted.scope_values) if granted.scope_values else "every counter"
    click.echo(
        f"raised {budget_id} ({target}) {_raise_text(granted)}: limits "
        f"{limits_text(budget.limit_nanos, budget.limit_tokens, budget.limit_requests)} -> "
        f"{limits_text(ln, lt, lr)} until {until.isoformat().replace('+00:00', 'Z')} "
        f"(raise {granted.raise_id})"
    )


@click.command("revoke-raise")
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


@click.command("raises")
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

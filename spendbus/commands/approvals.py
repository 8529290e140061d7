"""`spendbus approvals list | approve | deny` and `spendbus jobs` (seed 001).

Approvals: the steps on ``budget.approvals`` (schemas/jobs.py), read whole. ``approve``
raises the job's session counter (a raise on ``budget.raises``: by the budget's own limits
unless told otherwise) and records the decision; ``deny`` records it. Every step says who
and when; ``approvals list`` prints them all (the audit trail), with the org, identity and
session each job key stands for (the operator's correlation).

Jobs: the session budgets' counters from the verdicts, by opaque key only
(``job_key``: an HMAC under the job-key secret), with their count against the ceiling.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from runtime.topic_reader import TopicReader, read_latest_values
from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, JOB_APPROVAL, VERDICT
from schemas.errors import ConfigError, ContractError
from schemas.jobs import APPROVE, DENY, PENDING, ApprovalBook, ApprovalStep, job_key
from schemas.periods import to_micros
from schemas.raises import BudgetRaise, raise_until
from spendbus.commands.budget_raises import _raise_text, iso_of
from spendbus.commands.output import console, fail, limits_text
from spendbus.settings import Settings, load_settings
from spendbus.stack.compacted import publish
from spendbus.stack.key_secret import job_key_secret
from spendbus.stack.local import bootstrap_or_fail


def _book(settings: Settings) -> ApprovalBook:
    async def read() -> ApprovalBook:
        book = ApprovalBook()
        async with TopicReader(
            bootstrap_or_fail(settings),
            settings.topics.budget_approvals,
            security=settings.kafka_security,
        ) as reader:
            async for _, records in reader:
                for record in records:
                    if record.value is not None:
                        book.apply(ApprovalStep.from_record(JOB_APPROVAL.decode(record.value)))
        return book

    return asyncio.run(read())


@click.group("approvals")
def approvals() -> None:
    """Jobs a spend policy held for approval: list them, approve (a raise) or deny."""


@approvals.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("--pending", is_flag=True, help="Only jobs waiting for a decision.")
def approvals_list(as_json: bool, pending: bool) -> None:
    """Every job asked for, its standing and every step (who, when, what)."""
    book = _book(load_settings())
    rows: list[dict[str, Any]] = []
    for key, steps in book.steps.items():
        standing = book.standing(key)
        if pending and standing != PENDING:
            continue
        first = steps[0]
        rows.append(
            {
                "job": key,
                "standing": standing,
                "org_id": first.org_id,
                "identity": first.identity,
                "session_id": first.session_id,
                "budget_id": next((s.budget_id for s in steps if s.budget_id), None),
                "steps": [
                    {
                        "kind": s.kind,
                        "at": iso_of(s.at_us),
                        "by": s.by,
                        "reason": s.reason,
                        "raise_id": s.raise_id,
                    }
                    for s in steps
                ],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("job", "standing", "org", "identity", "session", "budget", "steps")
    for row in rows:
        table.add_row(
            row["job"],
            row["standing"],
            row["org_id"],
            row["identity"],
            row["session_id"],
            row["budget_id"] or "",
            "\n".join(
                f"{s['at']} {s['kind']} by {s['by']}"
                + (f" ({s['raise_id']})" if s["raise_id"] else "")
                + (f": {s['reason']}" if s["reason"] else "")
                for s in row["steps"]
            ),
        )
    console.print(table)


def _asked(book: ApprovalBook, key: str) -> ApprovalStep:
    step = book.first(key)
    if step is None:
        raise ConfigError(f"no approval request for job {key!r} (spendbus approvals list)")
    return step


def _decision(asked: ApprovalStep, kind: str, reason: str, raise_id: str | None) -> ApprovalStep:
    return ApprovalStep(
        job_key=asked.job_key,
        kind=kind,
        at_us=to_micros(datetime.now(UTC)),
        by=getpass.getuser(),
        org_id=asked.org_id,
        identity=asked.identity,
        session_id=asked.session_id,
        budget_id=asked.budget_id,
        reason=reason,
        raise_id=raise_id,
    )


@approvals.command("approve")
@click.argument("job")
@click.option(
    "--requests", type=click.IntRange(min=1), help="Requests added (default: the limit again)."
)
@click.option(
    "--tokens", type=click.IntRange(min=1), help="Tokens added (default: the limit again)."
)
@click.option("--by", "by_usd", help="USD added (default: the limit again).")
@click.option(
    "--until",
    "until_text",
    default="7d",
    show_default=True,
    help="An ISO time with zone, or 90s/30m/6h/2d.",
)
@click.option("--reason", default="approved", show_default=True, help="Kept with the decision.")
def approvals_approve(
    job: str,
    requests: int | None,
    tokens: int | None,
    by_usd: str | None,
    until_text: str,
    reason: str,
) -> None:
    """Let a held job go on: a raise of its session counter, and the decision recorded."""
    from schemas.money import usd_to_nanos

    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    try:
        asked = _asked(_book(settings), job)
        if asked.budget_id is None:
            raise ConfigError(f"job {job!r} was held by no session budget: nothing to raise")
        values = asyncio.run(
            read_latest_values(
                bootstrap, settings.topics.budget_policies, security=settings.kafka_security
            )
        )
        value = values.get(asked.budget_id.encode())
        if value is None:
            raise ConfigError(f"budget {asked.budget_id!r} no longer exists")
        budget = Budget.from_record(BUDGET_POLICY.decode(value))
        now = datetime.now(UTC)
        until = raise_until(until_text, now)
        if until <= now:
            raise ConfigError(f"--until {until.isoformat()} has passed")
        given = by_usd is not None or tokens is not None or requests is not None
        nanos = usd_to_nanos(by_usd) if by_usd is not None else None
        if not given:  # the ceiling once more
            nanos, tokens, requests = budget.limit_nanos, budget.limit_tokens, budget.limit_requests
    except (ConfigError, ContractError) as exc:
        fail(exc)
    granted = BudgetRaise(
        raise_id=f"r-{uuid.uuid4().hex[:12]}",
        budget_id=budget.budget_id,
        scope_values=asked.scope_values,
        mode="by",
        raise_nanos=nanos,
        raise_tokens=tokens,
        raise_requests=requests,
        starts_at_us=to_micros(now),
        until_us=to_micros(until),
        reason=f"approval of {job}: {reason}",
        created_by=getpass.getuser(),
    )
    step = _decision(asked, APPROVE, reason, granted.raise_id)

    async def write() -> None:
        raise_record = BUDGET_RAISE.encode(granted.to_record())
        await publish(
            bootstrap,
            settings.topics.budget_raises,
            [(granted.raise_id.encode(), raise_record)],
            security=settings.kafka_security,
        )
        await publish(
            bootstrap,
            settings.topics.budget_approvals,
            [(job.encode(), JOB_APPROVAL.encode(step.to_record()))],
            security=settings.kafka_security,
        )

    asyncio.run(write())
    click.echo(
        f"approved {job}: {budget.budget_id} {_raise_text(granted)} until "
        f"{iso_of(granted.until_us)} (raise {granted.raise_id})"
    )


@approvals.command("deny")
@click.argument("job")
@click.option("--reason", default="denied", show_default=True, help="Kept with the decision.")
def approvals_deny(job: str, reason: str) -> None:
    """Keep a held job refused (403 approval_denied), the decision recorded."""
    settings = load_settings()
    try:
        asked = _asked(_book(settings), job)
    except ConfigError as exc:
        fail(exc)
    step = _decision(asked, DENY, reason, None)
    asyncio.run(
        publish(
            bootstrap_or_fail(settings),
            settings.topics.budget_approvals,
            [(job.encode(), JOB_APPROVAL.encode(step.to_record()))],
            security=settings.kafka_security,
        )
    )
    click.echo(f"denied {job}")


@click.command("jobs")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--audit",
    is_flag=True,
    help="An operator's correlation: each key with the tenant, identity and session it "
    "stands for (the listing alone never shows them).",
)
def jobs(as_json: bool, audit: bool) -> None:
    """Jobs (session budgets' counters) by opaque key, with their count against the ceiling."""
    settings = load_settings()
    secret = job_key_secret(settings)
    values = asyncio.run(
        read_latest_values(
            bootstrap_or_fail(settings),
            settings.topics.budget_verdicts,
            security=settings.kafka_security,
        )
    )
    rows: list[dict[str, Any]] = []
    for value in values.values():
        if value is None:
            continue
        verdict = VERDICT.decode(value)
        scope_values = verdict["scope_values"]
        if verdict["scope"] != "session" or len(scope_values) != 3:
            continue
        rows.append(
            {
                "job": job_key(secret, *scope_values),
                "budget_id": verdict["budget_id"],
                "period": verdict["period"],
                "state": verdict["state"],
                "spent_requests": verdict["spent_requests"],
                "limit_requests": verdict["limit_requests"],
                "spent_tokens": verdict["spent_tokens"],
                "limit_tokens": verdict["limit_tokens"],
                "spent_nanos": verdict["spent_nanos"],
                "limit_nanos": verdict["limit_nanos"],
                "as_of": verdict["as_of"].isoformat().replace("+00:00", "Z"),
                **(
                    dict(zip(("org_id", "identity", "session_id"), scope_values, strict=True))
                    if audit
                    else {}
                ),
            }
        )
    rows.sort(key=lambda r: (r["budget_id"], r["job"]))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    correlation = ("org", "identity", "session") if audit else ()
    table = Table("job", *correlation, "budget", "state", "spent", "ceiling", "as of")
    for row in rows:
        who = (row["org_id"], row["identity"], row["session_id"]) if audit else ()
        table.add_row(
            row["job"],
            *who,
            row["budget_id"],
            row["state"],
            limits_text(row["spent_nanos"], row["spent_tokens"], row["spent_requests"]),
            limits_text(row["limit_nanos"], row["limit_tokens"], row["limit_requests"]),
            row["as_of"],
        )
    console.print(table)

"""`spendbus topics`: the contract's topics on the cluster, and their replication."""

from __future__ import annotations

import asyncio
import json
import sys

import click
from rich.console import Console

from spendbus.settings import Settings, load_settings
from spendbus.stack.local import bootstrap_or_fail
from spendbus.stack.topics import fix_replication, replication_report

console = Console()


@click.group()
def topics() -> None:
    """The topics spendbus creates, and their replication (runtime/replication.py)."""


def _names(settings: Settings, bootstrap: str) -> list[str]:
    """The contract's topics and the counters' changelogs of every generation."""
    from aiokafka.admin import AIOKafkaAdminClient

    base = [s.name for s in settings.topics.specs(settings.partitions)]

    async def changelogs() -> list[str]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, **settings.kafka_security.client_kwargs()
        )
        await admin.start()
        try:
            prefix = f"{settings.topics.prefix}spendbus-aggregator"
            return sorted(
                n
                for n in await admin.list_topics()
                if n.startswith(prefix) and n.endswith("-changelog")
            )
        finally:
            await admin.close()

    return base + asyncio.run(changelogs())


@topics.command("check")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def check(as_json: bool) -> None:
    """The replication plan for this cluster and every topic below it (exit 1 when any)."""
    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    names = _names(settings, bootstrap)
    plan, under = asyncio.run(
        replication_report(
            bootstrap,
            names,
            security=settings.kafka_security,
            replication=settings.replication,
        )
    )
    if as_json:
        print(
            json.dumps(
                {"plan": plan.model_dump(), "under_replicated": [p.model_dump() for p in under]}
            )
        )
    else:
        console.print(
            f"{plan.brokers} broker(s): {plan.replication_factor} replica(s), "
            f"min.insync.replicas={plan.min_insync_replicas}",
            highlight=False,
        )
        for problem in under:
            console.print(f"[red]below:[/red] {problem}", highlight=False)
        if not under:
            console.print(f"[green]all {len(names)} topics at the plan[/green]")
    sys.exit(1 if under else 0)


@topics.command("fix-replication")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds to wait for the new replicas to catch up.",
)
def fix(timeout: float) -> None:
    """Raise every topic below the plan: more replicas (the admin API's partition
    reassignment; the brokers copy the data while the topic stays writable), then
    min.insync.replicas. Safe to run again; changes nothing when all is well."""
    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    names = _names(settings, bootstrap)
    with console.status("reassigning partitions and waiting for the new replicas..."):
        fixed = asyncio.run(
            fix_replication(
                bootstrap,
                names,
                security=settings.kafka_security,
                replication=settings.replication,
                timeout=timeout,
            )
        )
    for problem in fixed:
        console.print(f"fixed {problem}", highlight=False)
    if not fixed:
        console.print(f"[green]all {len(names)} topics at the plan: nothing to do[/green]")

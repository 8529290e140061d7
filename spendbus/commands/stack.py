"""`spendbus up | down | demo`: the local stack (`spendbus status` is in status.py)."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from runtime.clickhouse_access import redact_dsn
from spendbus.settings import load_settings
from spendbus.stack.local import LocalStack, worker_process

console = Console()


@click.command()
@click.option("--no-worker", is_flag=True, help="Start Kafka and the topics only.")
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=None,
    help="Brokers of the local Kafka (KRaft, loopback), each also a controller voter; "
    "topics get min(3, N) replicas. Default: 1, or the size started before.",
)
def up(no_worker: bool, brokers: int | None) -> None:
    """Start the local stack: Kafka (unless KAFKA_BOOTSTRAP is set), topics, an aggregator worker."""
    settings = load_settings()
    with console.status("starting the local stack (the first run fetches the Kafka broker)..."):
        bootstrap = LocalStack(settings).up(with_worker=not no_worker, brokers=brokers)
    dsn = redact_dsn(settings.dsn)
    console.print(f"kafka: [bold]{bootstrap}[/bold]  clickhouse: [bold]{dsn}[/bold]")
    if not no_worker:
        console.print(f"aggregator worker: {worker_process(settings).base_url}/stats")


@click.command()
def down() -> None:
    """Stop what `spendbus up` started."""
    LocalStack(load_settings()).down()
    console.print("stopped")


@click.command()
@click.option("--events", default=3000, show_default=True, help="Usage events in the workload.")
@click.option("--keep", is_flag=True, help="Leave the demo stack running afterwards.")
@click.option(
    "--hold",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Serve the spend console this long once the checks pass, or until Ctrl-C "
    "(default: 900 s on a terminal, not at all off one).",
)
def demo(events: int, keep: bool, hold: float | None) -> None:
    """The whole pipeline on the embedded default, checked end to end."""
    from spendbus.demo import run_demo
    from spendbus.demo_console import hold_seconds

    hold_s = hold_seconds(hold, sys.stdin is not None and sys.stdin.isatty())
    sys.exit(run_demo(load_settings(), events=events, keep=keep, hold_s=hold_s))

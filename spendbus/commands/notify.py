"""`spendbus notify run | deliveries`: alerts to webhooks, each once per webhook (notify/).

The command wires the room to the settings: Kafka (``KAFKA_*``), the topics' prefix and,
when ``CLICKHOUSE_DSN`` is set, the delivery log (``alert_deliveries``, applied with the
rest of the DDL). Without ``CLICKHOUSE_DSN`` the log is the topic alone
(``spendbus notify deliveries``): the embedded default store is one process's, and a
running worker holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import click
from rich.console import Console
from rich.table import Table

from spendbus.settings import Settings, load_settings

console = Console()


@click.group()
def notify() -> None:
    """Deliver budget alerts to webhooks (Slack-compatible), each once per webhook."""


def _delivery_log(settings: Settings) -> tuple[Any, Any] | None:
    """(write rows, read keys) on ``alert_deliveries``, or None without CLICKHOUSE_DSN."""
    if not settings.clickhouse_dsn:
        return None
    from concurrent.futures import ThreadPoolExecutor

    from aggregator import apply_schema, open_client
    from notify import Delivery

    client = open_client(settings.clickhouse_dsn, access=settings.clickhouse_access)
    apply_schema(client)
    # one thread: a clickhouse-connect client is not shared between threads
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notify-log")
    columns = [
        "alert_id",
        "webhook",
        "webhook_url",
        "kind",
        "budget_id",
        "status",
        "attempts",
        "http_status",
        "error",
        "delivered_at",
        "alert_offset",
    ]

    def insert(rows: Sequence[Delivery]) -> None:
        client.insert(
            "alert_deliveries",
            [
                [
                    d.alert_id,
                    d.webhook,
                    d.webhook_url,
                    d.kind,
                    d.budget_id,
                    d.status,
                    d.attempts,
                    d.http_status,
                    d.error,
                    d.finished_at,
                    d.alert_offset,
                ]
                for d in rows
            ],
            column_names=columns,
        )

    def keys() -> set[tuple[str, str]]:
        result = client.query("SELECT webhook, alert_id FROM alert_deliveries")
        return {(str(w), str(a)) for w, a in result.result_rows}

    async def write(rows: Sequence[Delivery]) -> None:
        await asyncio.get_running_loop().run_in_executor(pool, insert, rows)

    async def logged() -> set[tuple[str, str]]:
        return await asyncio.get_running_loop().run_in_executor(pool, keys)

    return write, logged


@notify.command("run")
@click.option("--webhook", "urls", multiple=True, help="A webhook URL; repeatable.")
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A file whose first line signs the --webhook bodies (HMAC-SHA256).",
)
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML: webhooks with their secret_file and filters (notify/README.md).",
)
@click.option(
    "--from",
    "start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a webhook seen for the first time starts on the alert topic.",
)
@click.option("--retry-base-seconds", type=float, help="First retry's wait (default 1).")
@click.option("--retry-max-seconds", type=float, help="Longest wait between tries (default 300).")
@click.option("--max-attempts", type=int, help="Give up after N tries (default 0: never).")
@click.option("--timeout-seconds", type=float, help="One try's timeout (default 10).")
@click.option("--allow-http", is_flag=True, help="Allow plain http:// webhooks off loopback.")
@click.option("--metrics-port", type=int, default=None, help="Serve /metrics on 127.0.0.1:PORT.")
@click.option("--log-level", default="INFO", show_default=True)
def notify_run(
    urls: tuple[str, ...],
    secret_file: Path | None,
    config: Path | None,
    start: Literal["earliest", "latest"],  # click.Choice gives one of the two
    retry_base_seconds: float | None,
    retry_max_seconds: float | None,
    max_attempts: int | None,
    timeout_seconds: float | None,
    allow_http: bool,
    metrics_port: int | None,
    log_level: str,
) -> None:
    """Follow budget.alerts and POST each alert to every webhook that takes it, once."""
    from notify import Notifier, NotifyMetrics, load_webhooks
    from spendbus.stack.local import bootstrap_or_fail

    retry = {
        name: value
        for name, value in (
            ("base_seconds", retry_base_seconds),
            ("max_seconds", retry_max_seconds),
            ("max_attempts", max_attempts),
            ("timeout_seconds", timeout_seconds),
        )
        if value is not None
    }
    webhooks = load_webhooks(
        config, urls, secret_file=secret_file, retry=retry, allow_http=allow_http
    )
    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # aiokafka and aiohttp log at INFO what a notifier operator does not need
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    store = _delivery_log(settings)
    metrics = NotifyMetrics()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
    notifier = Notifier(
        bootstrap,
        settings.topics,
        webhooks,
        security=settings.kafka_security,
        start=start,
        delivery_log=None if store is None else store[0],
        logged_keys=None if store is None else store[1],
        metrics=metrics,
    )
    logging.getLogger("notify").info(
        "notifying %d webhook(s): %s; delivery log: %s",
        len(webhooks),
        ", ".join(w.shown for w in webhooks),
        "ClickHouse alert_deliveries" if store else f"topic {settings.topics.notify_deliveries}",
    )

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await notifier.run()

    asyncio.run(main())


@notify.command("deliveries")
@click.option("--webhook", "webhook_id", help="Only this webhook id.")
@click.option("--json", "as_json", is_flag=True)
def notify_deliveries(webhook_id: str | None, as_json: bool) -> None:
    """The delivery records: each (alert, webhook) delivered or failed, with its attempts."""
    from notify import DeliveryState, read_topic
    from spendbus.stack.local import bootstrap_or_fail

    settings = load_settings()
    bootstrap = bootstrap_or_fail(settings)
    state = DeliveryState()
    for key, value in asyncio.run(
        read_topic(bootstrap, settings.topics.notify_deliveries, security=settings.kafka_security)
    ):
        if key is not None:
            state.add(key, value)
    rows = sorted(
        (d for d in state.finished.values() if webhook_id is None or d.webhook == webhook_id),
        key=lambda d: d.finished_at,
    )
    if as_json:
        click.echo(json.dumps([json.loads(d.encode()) for d in rows]))
        return
    table = Table("finished", "webhook", "url", "alert", "status", "attempts", "http")
    for d in rows:
        table.add_row(
            d.finished_at.isoformat(timespec="seconds"),
            d.webhook,
            d.webhook_url,
            d.alert_id,
            d.status,
            str(d.attempts),
            "" if d.http_status is None else str(d.http_status),
        )
    console.print(table)

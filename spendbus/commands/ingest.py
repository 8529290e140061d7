"""`spendbus ingest`: publish UsageEvents from a JSON-lines file, or serve the HTTP ingest.

Both forms work::

    spendbus ingest FILE.jsonl [--skip-invalid]     # same as: spendbus ingest file FILE.jsonl
    spendbus ingest serve [--port 8787]

``ingest`` is a click group whose unknown first word is taken as a file name
and handed to its ``file`` command (a group cannot also take an argument
itself without swallowing the sub-command's name). A file literally named
``serve`` is published with ``spendbus ingest file serve``.

Only this module reads the environment (through ``spendbus.settings`` and
click's ``envvar``); the ingest room takes explicit configuration.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ingest import InvalidLines, PublishTimeout, ingest_file, serve_http_ingest
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.errors import ConfigError

MAX_ERRORS_SHOWN = 20


class _IngestGroup(click.Group):
    """A group where ``ingest PATH ...`` means ``ingest file PATH ...``."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "file", self.commands["file"], args
        return super().resolve_command(ctx, args)


def _publisher_config(
    *,
    bootstrap: str | None,
    topic_prefix: str | None,
    spool_dir: Path | None,
    role: str,
    **extra: Any,
) -> PublisherConfig:
    from spendbus.settings import load_settings
    from spendbus.stack.local import bootstrap_or_fail

    settings = load_settings(kafka_bootstrap=bootstrap, topic_prefix=topic_prefix)
    resolved = bootstrap_or_fail(settings)
    spool = spool_dir or (settings.home / "ingest-spool" / role)
    try:
        return PublisherConfig(
            bootstrap=resolved,
            kafka_security=settings.kafka_security,
            topic_prefix=settings.topic_prefix,
            spool_dir=spool.resolve(),
            **{k: v for k, v in extra.items() if v is not None},
        )
    except ValueError as exc:  # pydantic's ValidationError
        raise ConfigError(f"invalid publisher settings: {exc}") from None


def _common(func: Any) -> Any:
    options = [
        click.option(
            "--bootstrap",
            help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP or the local broker).",
        ),
        click.option("--topic-prefix", help="Topic name prefix (default: $SPENDBUS_TOPIC_PREFIX)."),
        click.option(
            "--spool-dir",
            type=click.Path(file_okay=False, path_type=Path),
            help="The publisher's spool (default: $SPENDBUS_HOME/ingest-spool/<serve|file>); "
            "one process per directory.",
        ),
        click.option(
            "--spool-max-bytes", type=click.IntRange(min=64 * 1024), help="Bound of the spool."
        ),
        click.option(
            "--spool-full-policy",
            type=click.Choice(["block", "drop_newest"]),
            help="When the spool is full: wait then refuse (block, default) or drop new events.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.group("ingest", cls=_IngestGroup)
def ingest() -> None:
    """Publish UsageEvents: `ingest FILE.jsonl` or `ingest serve` (HTTP for other languages)."""


@ingest.command("file")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Publish the valid lines and write the invalid ones to FILE.rejected.jsonl "
    "(default: any invalid line stops everything before anything is published).",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the broker's acknowledgement at the end.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_common
def ingest_file_command(
    file: Path,
    skip_invalid: bool,
    timeout: float,
    as_json: bool,
    bootstrap: str | None,
    topic_prefix: str | None,
    spool_dir: Path | None,
    spool_max_bytes: int | None,
    spool_full_policy: str | None,
) -> None:
    """Validate FILE (JSON lines, one UsageEvent each) and publish its events."""
    config = _publisher_config(
        bootstrap=bootstrap,
        topic_prefix=topic_prefix,
        spool_dir=spool_dir,
        role="file",
        spool_max_bytes=spool_max_bytes,
        spool_full_policy=spool_full_policy,
    )
    err = Console(stderr=True)

    async def go() -> Any:
        publisher = UsagePublisher(config)
        await publisher.start()
        try:
            return await ingest_file(
                file, publisher, skip_invalid=skip_invalid, ack_timeout_s=timeout, console=err
            )
        finally:
            await publisher.stop(timeout=5.0)

    try:
        report = asyncio.run(go())
    except InvalidLines as exc:
        for error in exc.report.errors[:MAX_ERRORS_SHOWN]:
            err.print(f"[red]✗[/red] {error.describe()}", markup=True, highlight=False)
        more = exc.report.rejected - MAX_ERRORS_SHOWN
        if more > 0:
            err.print(f"... and {more} more")
        err.print(
            f"{exc.report.rejected} invalid line(s) in {file}: nothing published. "
            "Fix them, or pass --skip-invalid to publish the valid lines and write the "
            f"others to {file.name.removesuffix('.jsonl')}.rejected.jsonl",
            highlight=False,
        )
        raise SystemExit(1) from None
    except PublishTimeout as exc:
        err.print(
            f"[yellow]not acknowledged in {timeout}s[/yellow]: {exc}. The events are in the "
            f"spool {config.spool_dir} and are sent the next time it is used "
            "(same event ids: nothing is counted twice).",
            highlight=False,
        )
        raise SystemExit(2) from None
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    rate = report.published / report.seconds if report.seconds else 0.0
    summary = (
        f"published {report.published} events from {file} in {report.seconds:.2f}s "
        f"({rate:,.0f}/s); {report.rejected} rejected"
    )
    if report.rejects_path:
        summary += f" (written to {report.rejects_path})"
    click.echo(summary)


@ingest.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token-file",
    help="A file whose first line is the bearer token clients must send (`-`: standard "
    "input); or $SPENDBUS_INGEST_TOKEN. Required.",
)
@click.option(
    "--token",
    envvar="SPENDBUS_INGEST_TOKEN",
    hidden=True,  # the variable's home; as an argument it is refused (ps shows argv)
)
@click.option(
    "--max-body-bytes", type=click.IntRange(min=1024), default=4 * 1024 * 1024, show_default=True
)
@click.option(
    "--ack-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds a request waits for the broker's acknowledgement before answering 503.",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a client has to send a request head (and the longest a connection idles).",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds a client has to send a body once its head is in (408 after).",
)
@_common
def serve(
    host: str,
    port: int,
    token_file: str | None,
    token: str | None,
    max_body_bytes: int,
    ack_timeout: float,
    header_timeout: float,
    body_timeout: float,
    bootstrap: str | None,
    topic_prefix: str | None,
    spool_dir: Path | None,
    spool_max_bytes: int | None,
    spool_full_policy: str | None,
) -> None:
    """Serve POST /v1/usage (JSON arrays of UsageEvents), /healthz and /metrics."""
    from spendbus.secret_input import read_secret, refuse_on_command_line

    refuse_on_command_line(
        "token", "use --token-file FILE (or -, standard input) or set SPENDBUS_INGEST_TOKEN"
    )
    if token_file is not None:
        if token:
            raise ConfigError("--token-file and SPENDBUS_INGEST_TOKEN are both set: keep one")
        token = read_secret(token_file, "bearer token")
    if not token:
        raise ConfigError(
            "the HTTP ingest needs a bearer token: --token-file or SPENDBUS_INGEST_TOKEN"
        )
    config = _publisher_config(
        bootstrap=bootstrap,
        topic_prefix=topic_prefix,
        spool_dir=spool_dir,
        role="serve",
        spool_max_bytes=spool_max_bytes,
        spool_full_policy=spool_full_policy,
    )
    serve_http_ingest(
        config,
        token=token,
        host=host,
        port=port,
        max_body_bytes=max_body_bytes,
        ack_timeout_s=ack_timeout,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
    )

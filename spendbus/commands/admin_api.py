"""`spendbus admin serve | tokens | audit`: the admin API (admin/) and its tokens.

The tokens are kept as keyed digests in ``$SPENDBUS_HOME/admin.tokens`` (mode 0600),
keyed with ``$SPENDBUS_HOME/admin.secret`` (32 random bytes as hex, 0600, made the first
time it is needed, like the key secret: spendbus/stack/key_secret.py). A token is shown
once, by ``tokens new``, on standard output; never as an argument, never in a log.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import asdict
from typing import Any, Final

import click
from rich.table import Table

from admin import ROLES, AdminConfig, SpendQuery, TokenBook, serve_admin
from runtime.private_files import check_secret_file
from runtime.topic_reader import read_latest_values
from schemas.admin_audit import decode_entry
from schemas.errors import ConfigError, ContractError, SpendbusError
from spendbus.commands.keys import private_stdout
from spendbus.commands.output import console
from spendbus.settings import Settings, load_settings
from spendbus.stack.key_secret import key_secret
from spendbus.stack.local import bootstrap_or_fail, worker_process
from spendbus.stack.secret_file import create_once
from spendbus.stack.topics import ensure_topics

ADMIN_SECRET_FILE: Final = "admin.secret"
ADMIN_TOKENS_FILE: Final = "admin.tokens"
#: random bytes of the admin secret
SECRET_BYTES: Final = 32


def admin_secret(settings: Settings) -> bytes:
    """``$SPENDBUS_HOME/admin.secret``, created (random, 0600) when missing."""
    path = (settings.home / ADMIN_SECRET_FILE).resolve()
    if not path.exists():
        create_once(path, secrets.token_hex(SECRET_BYTES))
    check_secret_file(path, str(path))  # readable by others: refused
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the admin secret ({exc.strerror})") from None
    if not lines or len(lines[0].strip()) < 32:
        raise ConfigError(f"{path}: not an admin secret (expected 64 hex digits)")
    return lines[0].strip().encode()


def spend_query(settings: Settings) -> SpendQuery:
    """How the admin API runs a spend report's SELECT: through the running worker when it
    owns the embedded store (one process may open it), else on the current generation's
    ClickHouse server, a client per report."""

    def run(sql: str) -> list[Any]:
        if settings.dsn.startswith("chdb://"):
            worker = worker_process(settings)
            if worker.pid() is None:
                raise ConfigError("the embedded store is read through the worker: none runs")
            return list(worker.post("/sql", {"sql": sql})["rows"])
        from aggregator import open_client, run_query
        from spendbus.commands.store_queries import current_store

        client = open_client(current_store(settings), access=settings.clickhouse_access)
        try:
            return list(run_query(client, sql)[1])
        finally:
            client.close()

    return run


def token_book(settings: Settings) -> TokenBook:
    settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return TokenBook((settings.home / ADMIN_TOKENS_FILE).resolve(), admin_secret(settings))


@click.command("serve")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="The port (default: SPENDBUS_ADMIN_PORT, else 6070); it binds 127.0.0.1.",
)
def admin_serve(port: int | None) -> None:
    """Serve the admin API on loopback: budgets, keys, raises and the audit trail under
    /v1/admin/, its OpenAPI document at /openapi.json."""
    settings = load_settings()
    try:
        bootstrap = bootstrap_or_fail(settings)
        # the audit topic is new: a stack made before it gets it here
        asyncio.run(
            ensure_topics(
                bootstrap,
                settings.topics,
                settings.partitions,
                security=settings.kafka_security,
                replication=settings.replication,
            )
        )
        config = AdminConfig(
            bootstrap=bootstrap,
            topics=settings.topics,
            key_secret=key_secret(settings),
            security=settings.kafka_security,
        )
        tokens = token_book(settings)
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    serve_admin(
        config,
        tokens,
        spend_query=spend_query(settings),
        port=port or settings.admin_port,
    )


@click.group("tokens")
def admin_tokens() -> None:
    """The admin API's bearer tokens (stored as keyed digests only)."""


@admin_tokens.command("new")
@click.option("--role", required=True, type=click.Choice(ROLES), help="What the token may do.")
@click.option("--org", "org_id", help="The org an org-admin or org-viewer token is fenced in.")
def tokens_new(role: str, org_id: str | None) -> None:
    """Make a token, shown this once on standard output (its id on standard error)."""
    try:
        token, record = token_book(load_settings()).mint(role, org_id)
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    private_stdout()
    click.echo(token)
    where = "every org" if record.org_id is None else f"org {record.org_id}"
    click.echo(f"token {record.token_id}: {record.role} of {where}; shown once, keep it", err=True)


@admin_tokens.command("list")
@click.option("--json", "as_json", is_flag=True)
def tokens_list(as_json: bool) -> None:
    """Every token made: id, role, org, when made and revoked (never the token)."""
    try:
        records = token_book(load_settings()).records()
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        shown = [{k: v for k, v in asdict(r).items() if k != "digest"} for r in records]
        click.echo(json.dumps(shown, indent=2))
        return
    table = Table("token", "role", "org", "created", "revoked")
    for r in records:
        table.add_row(r.token_id, r.role, r.org_id or "*", r.created_at, r.revoked_at or "-")
    console.print(table)


@admin_tokens.command("revoke")
@click.argument("token_id")
def tokens_revoke(token_id: str) -> None:
    """Revoke a token by its id (a running server refuses it from its next request)."""
    try:
        record = token_book(load_settings()).revoke(token_id)
    except SpendbusError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked admin token {record.token_id} ({record.role})")


@click.command("audit")
@click.option("--org", "org_id", help="Only the changes of this org.")
@click.option("--resource", type=click.Choice(["budgets", "keys", "raises"]))
@click.option("--json", "as_json", is_flag=True)
def admin_audit(org_id: str | None, resource: str | None, as_json: bool) -> None:
    """Every change the admin API made, oldest first: who (token, role), what (before and
    after), when, from where (the admin.audit topic; in SQL: the admin_audit table)."""
    settings = load_settings()
    values = asyncio.run(
        read_latest_values(
            bootstrap_or_fail(settings),
            settings.topics.admin_audit,
            security=settings.kafka_security,
        )
    )
    entries = []
    for value in values.values():
        try:
            entries.append(decode_entry(value or b""))
        except ContractError:  # not the admin API's: no change of its to show
            continue
    entries.sort(key=lambda e: (e["at"], e["audit_id"]))
    entries = [
        e
        for e in entries
        if (org_id is None or e["org_id"] == org_id)
        and (resource is None or e["resource"] == resource)
    ]
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    table = Table("at", "token", "role", "from", "action", "id", "org")
    for e in entries:
        table.add_row(
            e["at"],
            e["token_id"],
            e["role"],
            e["remote"],
            e["action"],
            e["resource_id"],
            e["org_id"] or "*",
        )
    console.print(table)

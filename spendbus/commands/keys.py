"""`spendbus keys apply|list|revoke`: the gateways' virtual keys on the compacted keys topic.

A key is published under the SHA-256 hex of the virtual key, never the key
itself; its value is the key entry's name and principal (``VirtualKey``), and
a tombstone revokes it. Gateways with ``keys_topic: {follow: true}`` apply
every change live (ingest/gateway/README.md).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Column, Table

from schemas.codec import GATEWAY_KEY
from schemas.errors import ConfigError, DecodeError, SpendbusError
from schemas.kafka import PLAINTEXT, KafkaSecurity
from spendbus.settings import load_settings
from spendbus.stack.compacted import publish, read_compacted
from spendbus.stack.local import bootstrap_or_fail

console = Console()
#: the hash prefix `keys list` shows (and `keys revoke` accepts, when unique)
SHOWN_PREFIX = 12
MIN_PREFIX = 8


def _live_keys(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(digest -> decoded record of every live key, digest -> problem of each undecodable one)."""
    values = asyncio.run(read_compacted(bootstrap, topic, security=security))
    live: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for raw_key, value in values.items():
        if value is None:
            continue
        digest = raw_key.decode("ascii", "replace")
        try:
            live[digest] = GATEWAY_KEY.decode(value)
        except DecodeError as exc:
            problems[digest] = f"{exc} ({exc.reason})"
    return live, problems


def _fail(exc: SpendbusError) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group()
def keys() -> None:
    """Virtual keys of the gateways on the compacted gateway.keys topic (hashed, never in clear)."""


@keys.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--gateway-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also check each key against this gateway config: its secret exists, and no key "
    "or name of the file's own keys is reused.",
)
def keys_apply(file: Path, gateway_config: Path | None) -> None:
    """Validate FILE (key entries as a gateway config's `keys` takes them) and publish them."""
    from ingest.gateway import key_record, load_config, parse_key_entries

    try:
        try:
            data = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from None
        entries = parse_key_entries(data, str(file))
        if gateway_config is not None:
            config = load_config(gateway_config)
            file_names = {vk.name: vk.digest for vk in config.keys}
            for i, vk in enumerate(entries):
                label = f"{file}: entry {i} ({vk.name!r})"
                if vk.principal.secret_id not in config.secrets:
                    raise ConfigError(
                        f"{label}: field 'principal.secret_id': no secret named "
                        f"{vk.principal.secret_id!r} in {gateway_config}"
                    )
                if vk.name in file_names or vk.digest in file_names.values():
                    raise ConfigError(
                        f"{label}: {gateway_config} defines this key or name itself "
                        "(its own keys win over the topic)"
                    )
        settings = load_settings()
        bootstrap = bootstrap_or_fail(settings)
        topic = settings.topics.gateway_keys
        live, _ = _live_keys(bootstrap, topic, security=settings.kafka_security)
        for i, vk in enumerate(entries):
            holder = next(
                (d for d, r in live.items() if r["name"] == vk.name and d != vk.digest), None
            )
            if holder is not None:
                raise ConfigError(
                    f"{file}: entry {i} ({vk.name!r}): field 'name': already the name of live "
                    f"key {holder[:SHOWN_PREFIX]} (revoke it first, or choose another name)"
                )
    except SpendbusError as exc:
        raise _fail(exc) from None
    now = datetime.now(UTC)
    records = [(vk.digest.encode(), GATEWAY_KEY.encode(key_record(vk, now))) for vk in entries]
    asyncio.run(publish(bootstrap, topic, records, security=settings.kafka_security))
    click.echo(f"applied {len(entries)} keys from {file}")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON (full hashes).")
def keys_list(as_json: bool) -> None:
    """The live keys: hash prefix and principal (a key itself is never stored, so never shown)."""
    settings = load_settings()
    try:
        live, problems = _live_keys(
            bootstrap_or_fail(settings),
            settings.topics.gateway_keys,
            security=settings.kafka_security,
        )
    except SpendbusError as exc:
        raise _fail(exc) from None
    rows = sorted(live.items(), key=lambda item: item[1]["name"])
    if as_json:
        out = [{"key_sha256": d, **r, "applied_at": r["applied_at"].isoformat()} for d, r in rows]
        click.echo(json.dumps(out, indent=2))
        return
    table = Table(Column("sha256", no_wrap=True), Column("name", no_wrap=True), "principal")
    for digest, r in rows:
        principal = [f"org={r['org_id']}", f"secret={r['secret_id']}"]
        principal += [
            f"{field}={r[f'{field}_id']}"
            for field in ("project", "grant", "user")
            if r[f"{field}_id"] is not None
        ]
        if r["groups"]:
            principal.append(f"groups={','.join(r['groups'])}")
        principal += [f"tag:{k}={v}" for k, v in sorted(r["tags"].items())]
        table.add_row(digest[:SHOWN_PREFIX], r["name"], " ".join(principal))
    console.print(table)
    for digest, problem in sorted(problems.items()):
        console.print(
            f"[yellow]unreadable:[/yellow] record {digest[:SHOWN_PREFIX]}: {problem} "
            "(gateways skip it; `keys revoke` removes it)",
            highlight=False,
        )


@keys.command("revoke")
@click.argument("key_or_hash")
def keys_revoke(key_or_hash: str) -> None:
    """Revoke a key (a tombstone): give the key itself, its SHA-256 hex, or a unique prefix
    of it as `keys list` shows (at least 8 hex digits)."""
    from ingest.gateway import key_digest

    settings = load_settings()
    try:
        bootstrap = bootstrap_or_fail(settings)
        topic = settings.topics.gateway_keys
        live, unreadable = _live_keys(bootstrap, topic, security=settings.kafka_security)
    except SpendbusError as exc:
        raise _fail(exc) from None
    # an unreadable record is revocable too (that is how an operator removes it)
    digest = _resolve(key_or_hash, set(live) | set(unreadable), key_digest(key_or_hash))
    asyncio.run(
        publish(bootstrap, topic, [(digest.encode(), None)], security=settings.kafka_security)
    )
    name = live[digest]["name"] if digest in live else "unreadable record"
    click.echo(f"revoked key {digest[:SHOWN_PREFIX]} ({name})")


def _resolve(given: str, live: set[str], digest_if_key: str) -> str:
    """The live digest ``given`` names: the key itself, a full hash, or a unique hash prefix."""
    if digest_if_key in live:
        return digest_if_key
    lowered = given.lower()
    if lowered in live:
        return lowered
    if len(lowered) >= MIN_PREFIX and all(c in "0123456789abcdef" for c in lowered):
        found = [d for d in live if d.startswith(lowered)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise click.ClickException(
                f"hash prefix {lowered!r} matches {len(found)} live keys: give more digits"
            )
    raise click.ClickException(
        "no live key matches (give the key itself, its sha256, or a prefix `keys list` shows)"
    )

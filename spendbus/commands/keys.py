"""`spendbus keys new|apply|list|revoke|migrate`: the gateways' virtual keys.

A key is published on the compacted keys topic under its keyed digest
(``hmac-sha256:`` + HMAC-SHA256 under the server-side key secret of a key's
SHA-256; spendbus/stack/key_secret.py), never the key itself; its value is the
key entry's name and principal (``VirtualKey``), and a tombstone revokes it.
Records written before keyed digests (the plain SHA-256 hex) are still read;
``keys migrate`` rewrites them. Gateways with ``keys_topic: {follow: true}``
apply every change live (ingest/gateway/README.md). A key is never an argument:
``revoke`` takes it from a file or standard input.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Column, Table

from runtime.kafka import PLAINTEXT, KafkaSecurity
from runtime.topic_reader import read_latest_values
from schemas.codec import GATEWAY_KEY
from schemas.errors import ConfigError, DecodeError, SpendbusError
from spendbus.secret_input import read_secret
from spendbus.settings import load_settings
from spendbus.stack.compacted import publish
from spendbus.stack.key_secret import key_secret
from spendbus.stack.local import bootstrap_or_fail

console = Console()
#: the hash prefix `keys list` shows (and `keys revoke` accepts, when unique)
SHOWN_PREFIX = 12
MIN_PREFIX = 8
#: random bytes of a key `keys new` makes (256 bits), and what it starts with
NEW_KEY_BYTES = 32
NEW_KEY_PREFIX = "sb-"
KEYED = "hmac-sha256:"


def _hex(record_key: str) -> str:
    """The hex digest of a record key (keyed or legacy)."""
    return record_key.removeprefix(KEYED)


def _live_keys(
    bootstrap: str, topic: str, *, security: KafkaSecurity = PLAINTEXT
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(digest -> decoded record of every live key, digest -> problem of each undecodable one)."""
    values = asyncio.run(read_latest_values(bootstrap, topic, security=security))
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
    """Virtual keys of the gateways on the compacted gateway.keys topic (keyed digests,
    never in clear)."""


@keys.command("new")
@click.option("--json", "as_json", is_flag=True, help="Print the key and its key_hmac as JSON.")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write the key to this new file, mode 0600 (an existing file is refused); its "
    "key_hmac goes to standard output.",
)
def keys_new(as_json: bool, out: Path | None) -> None:
    """Make a virtual key (256 random bits), shown this once: written to --out FILE (0600),
    or on standard output (a file it is redirected to is made 0600 first), with its
    `key_hmac` (for a gateway config or a keys file) on standard error."""
    from ingest.gateway import key_hmac

    try:
        secret = key_secret(load_settings())
    except SpendbusError as exc:
        raise _fail(exc) from None
    key = NEW_KEY_PREFIX + secrets.token_urlsafe(NEW_KEY_BYTES)
    digest = key_hmac(secret, key)
    text = json.dumps({"key": key, "key_hmac": digest}) if as_json else key
    if out is not None:
        _write_private(out, text + "\n")
        click.echo(json.dumps({"key_file": str(out), "key_hmac": digest}) if as_json else digest)
        click.echo(f"the key is in {out} (mode 0600): keep it, it cannot be recovered", err=True)
        return
    private_stdout()
    click.echo(text)
    if not as_json:
        click.echo(
            f"key_hmac: {digest}  # the key above is shown once; keep it, it cannot be recovered",
            err=True,
        )


def _write_private(path: Path, text: str) -> None:
    """``text`` into a new file only its owner can read; an existing file is refused (a key
    is never written over another, nor into a file others could already hold open)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise click.ClickException(f"{path} exists: give a new file for the key") from None
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot create it ({exc.strerror})") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def private_stdout() -> None:
    """Standard output redirected to a regular file (``keys new > alice.key``, which the
    shell made under its own umask, often 0644): make that file 0600 before the key is in it
    (``admin tokens new`` prints its token the same way)."""
    try:
        fd = sys.stdout.fileno()
        info = os.fstat(fd)
    except (OSError, ValueError, io.UnsupportedOperation):
        return  # not a file descriptor (an embedding, a test runner)
    if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
        try:
            os.fchmod(fd, 0o600)
        except OSError as exc:
            raise click.ClickException(
                f"standard output is a file others can read and it cannot be made private "
                f"({exc.strerror}): use `spendbus keys new --out FILE`"
            ) from None
        click.echo("the file standard output goes to was made mode 0600", err=True)


@keys.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--gateway-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also check each key against this gateway config: its secret exists, and no key "
    "or name of the file's own keys is reused.",
)
def keys_apply(file: Path, gateway_config: Path | None) -> None:
    """Validate FILE (key entries as a gateway config's `keys` takes them) and publish them
    under their keyed digests (a key given in clear must be strong: `keys new`)."""
    from ingest.gateway import key_record, load_config, parse_key_entries, weak_key_problem

    try:
        try:
            data = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from None
        entries = parse_key_entries(data, str(file))
        for i, vk in enumerate(entries):
            problem = weak_key_problem(vk.key) if vk.key is not None else None
            if problem is not None:
                raise ConfigError(f"{file}: entry {i} ({vk.name!r}): field 'key': {problem}")
        settings = load_settings()
        secret = key_secret(settings)
        digests = [vk.digest(secret) for vk in entries]
        if gateway_config is not None:
            config = load_config(gateway_config)
            file_names = {vk.name: vk.digest(secret) for vk in config.keys}
            for i, vk in enumerate(entries):
                label = f"{file}: entry {i} ({vk.name!r})"
                if vk.principal.secret_id not in config.secrets:
                    raise ConfigError(
                        f"{label}: field 'principal.secret_id': no secret named "
                        f"{vk.principal.secret_id!r} in {gateway_config}"
                    )
                if vk.name in file_names or digests[i] in file_names.values():
                    raise ConfigError(
                        f"{label}: {gateway_config} defines this key or name itself "
                        "(its own keys win over the topic)"
                    )
        bootstrap = bootstrap_or_fail(settings)
        topic = settings.topics.gateway_keys
        live, _ = _live_keys(bootstrap, topic, security=settings.kafka_security)
        from ingest.gateway import keyed_digest

        def keyed(record_key: str) -> str:
            hex_digest = _hex(record_key)
            return hex_digest if record_key.startswith(KEYED) else keyed_digest(secret, hex_digest)

        for i, vk in enumerate(entries):
            holder = next(
                (d for d, r in live.items() if r["name"] == vk.name and keyed(d) != digests[i]),
                None,
            )
            if holder is not None:
                raise ConfigError(
                    f"{file}: entry {i} ({vk.name!r}): field 'name': already the name of live "
                    f"key {_hex(holder)[:SHOWN_PREFIX]} (revoke it first, or choose another name)"
                )
    except SpendbusError as exc:
        raise _fail(exc) from None
    now = datetime.now(UTC)
    records: list[tuple[bytes, bytes | None]] = [
        ((KEYED + digest).encode(), GATEWAY_KEY.encode(key_record(vk, now)))
        for vk, digest in zip(entries, digests, strict=True)
    ]
    # a key this file gives again replaces its legacy record: no unsalted digest stays behind
    legacy = {d for d in live if not d.startswith(KEYED)}
    for vk in entries:
        if vk.identity.startswith("sha256:") and vk.identity[7:] in legacy:
            records.append((vk.identity[7:].encode(), None))
    asyncio.run(publish(bootstrap, topic, records, security=settings.kafka_security))
    click.echo(f"applied {len(entries)} keys from {file}")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON (full digests).")
def keys_list(as_json: bool) -> None:
    """The live keys: digest prefix and principal (a key itself is never stored, so never
    shown); `legacy` marks an unsalted SHA-256 digest (`keys migrate`)."""
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
        out = [
            {
                ("key_hmac" if d.startswith(KEYED) else "key_sha256"): _hex(d),
                **r,
                "applied_at": r["applied_at"].isoformat(),
            }
            for d, r in rows
        ]
        click.echo(json.dumps(out, indent=2))
        return
    table = Table(Column("digest", no_wrap=True), Column("name", no_wrap=True), "principal")
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
        shown = _hex(digest)[:SHOWN_PREFIX] + ("" if digest.startswith(KEYED) else " legacy")
        table.add_row(shown, r["name"], " ".join(principal))
    console.print(table)
    for digest, problem in sorted(problems.items()):
        console.print(
            f"[yellow]unreadable:[/yellow] record {_hex(digest)[:SHOWN_PREFIX]}: {problem} "
            "(gateways skip it; `keys revoke` removes it)",
            highlight=False,
        )


@keys.command("revoke")
@click.argument("digest_or_prefix", required=False)
@click.option(
    "--key-file",
    help="Revoke the key held in this file (first line; `-`: standard input) instead.",
)
def keys_revoke(digest_or_prefix: str | None, key_file: str | None) -> None:
    """Revoke a key (a tombstone): give its digest or a unique prefix of it as `keys list`
    shows (at least 8 hex digits), or the key itself by --key-file (never as an argument)."""
    from ingest.gateway import key_digest, key_hmac

    if (digest_or_prefix is None) == (key_file is None):
        raise click.UsageError("give a digest (or its prefix) or --key-file, one of them")
    if digest_or_prefix is not None:
        _digest_argument(digest_or_prefix)  # before connecting: a key given here is refused
    settings = load_settings()
    try:
        bootstrap = bootstrap_or_fail(settings)
        topic = settings.topics.gateway_keys
        live, unreadable = _live_keys(bootstrap, topic, security=settings.kafka_security)
        candidates = set(live) | set(unreadable)  # an unreadable record is revocable too
        if key_file is not None:
            key = read_secret(key_file, "key")
            forms = {KEYED + key_hmac(key_secret(settings), key), key_digest(key)}
            found = sorted(forms & candidates)
            if not found:
                raise click.ClickException("no live key matches the key given")
        else:
            assert digest_or_prefix is not None
            found = _resolve(digest_or_prefix, candidates)
    except SpendbusError as exc:
        raise _fail(exc) from None
    asyncio.run(
        publish(
            bootstrap, topic, [(d.encode(), None) for d in found], security=settings.kafka_security
        )
    )
    for digest in found:
        name = live[digest]["name"] if digest in live else "unreadable record"
        click.echo(f"revoked key {_hex(digest)[:SHOWN_PREFIX]} ({name})")


def _digest_argument(given: str) -> str:
    """``given`` as a hex digest or prefix; a usage error when it is not one (a key?)."""
    lowered = given.lower().removeprefix(KEYED)
    if not lowered or not all(c in "0123456789abcdef" for c in lowered) or len(lowered) > 64:
        raise click.UsageError(
            "that is not a digest: to revoke by the key itself, pass it on standard input "
            "(`spendbus keys revoke --key-file -`); a key is never taken as an argument "
            "(other users see it in ps, shells keep it in history)"
        )
    return lowered


def _resolve(given: str, live: set[str]) -> list[str]:
    """The live record key ``given`` names: a full digest or a unique digest prefix."""
    lowered = _digest_argument(given)
    found = [d for d in live if _hex(d) == lowered]
    if not found and len(lowered) >= MIN_PREFIX:
        found = [d for d in live if _hex(d).startswith(lowered)]
        if len(found) > 1:
            raise click.ClickException(
                f"hash prefix {lowered!r} matches {len(found)} live keys: give more digits"
            )
    if not found:
        raise click.ClickException(
            "no live key matches (give its digest or a prefix `keys list` shows, "
            "or the key by --key-file)"
        )
    return found


@keys.command("migrate")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Print the key_hmac of each key a gateway config gives as key_sha256 (or in clear), "
    "instead of rewriting the topic.",
)
def keys_migrate(config_path: Path | None) -> None:
    """Rewrite every legacy record (unsalted SHA-256) of the keys topic under its keyed
    digest, then tombstone the legacy one; the keys keep working throughout."""
    from ingest.gateway import keyed_digest, load_config

    try:
        settings = load_settings()
        secret = key_secret(settings)
        if config_path is not None:
            config = load_config(config_path)
            for i, vk in enumerate(config.keys):
                if vk.key_hmac is None:
                    source = "key_sha256" if vk.legacy else "key"
                    click.echo(f"keys.{i} ({vk.name}): {source} -> key_hmac: {vk.digest(secret)}")
            return
        bootstrap = bootstrap_or_fail(settings)
        topic = settings.topics.gateway_keys
        live, unreadable = _live_keys(bootstrap, topic, security=settings.kafka_security)
    except SpendbusError as exc:
        raise _fail(exc) from None
    legacy = sorted(d for d in live if not d.startswith(KEYED))
    # each keyed record before the tombstone of its legacy one (one partition: in order),
    # and the follower ignores a tombstone of a form that no longer holds the key
    records: list[tuple[bytes, bytes | None]] = [
        ((KEYED + keyed_digest(secret, d)).encode(), GATEWAY_KEY.encode(live[d])) for d in legacy
    ]
    records += [(d.encode(), None) for d in legacy]
    if records:
        asyncio.run(publish(bootstrap, topic, records, security=settings.kafka_security))
    left = sorted(d for d in unreadable if not d.startswith(KEYED))
    click.echo(f"migrated {len(legacy)} legacy keys to keyed digests")
    if left:
        click.echo(
            f"{len(left)} unreadable legacy records left as they are (`keys revoke` removes "
            f"them): {', '.join(d[:SHOWN_PREFIX] for d in left)}",
            err=True,
        )

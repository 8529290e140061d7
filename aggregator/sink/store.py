"""Connecting to ClickHouse and applying the analyst schema (``aggregator/sink/ddl/*.sql``).

The one setting is a DSN:

- ``chdb:///abs/path``: the ClickHouse engine embedded in this process (chdb),
  its data under ``/abs/path``. One process per data path: the engine locks
  ``<path>/status`` (released when the process dies, even by kill -9). Within
  one process every client on that path shares the one engine, so opening the
  same DSN twice works; a different path fails until every client of the first
  one is closed.
- ``http(s)://user:pass@host:8123/db``: a ClickHouse server. Over ``https://`` the
  :class:`~runtime.clickhouse_access.ClickHouseAccess` passed as ``access`` gives the CA,
  verification, a client certificate and the password (kept out of the DSN, never shown).

Results come back with time-zone-aware datetimes (``tz_mode="aware"``).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from aggregator.sink.backfill import FILLED, create_filled_view, set_comment
from aggregator.sink.errors import DataPathInUse, SinkError, SinkRejected, translate
from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess, redact_dsn
from schemas.errors import ConfigError

#: the DDL, package data of this module (a wheel carries it; infra/clickhouse/README.md explains it)
DDL_DIR: Final = Path(__file__).resolve().parent / "ddl"
HTTP_SCHEMES: Final = ("http", "https")


def chdb_path(dsn: str) -> str | None:
    """The data path of a ``chdb:///abs/path`` DSN, None for an http(s) DSN.

    Raises ConfigError for anything else. clickhouse-connect would read
    ``chdb://rel/path`` as location ``rel`` and database ``path``; only the
    absolute form is accepted so a DSN always names one directory.
    """
    parsed = urlparse(dsn)
    if parsed.scheme in HTTP_SCHEMES:
        if not parsed.hostname:
            raise ConfigError(f"CLICKHOUSE_DSN {_redact(dsn)!r}: no host")
        return None
    if parsed.scheme != "chdb":
        raise ConfigError(
            f"CLICKHOUSE_DSN {_redact(dsn)!r}: expected chdb:///abs/path or "
            "http(s)://user:pass@host:8123/db"
        )
    if parsed.netloc or not parsed.path.startswith("/") or parsed.query:
        raise ConfigError(
            f"CLICKHOUSE_DSN {dsn!r}: an embedded engine is named chdb:///abs/path "
            "(three slashes, an absolute directory, no options)"
        )
    return os.path.realpath(parsed.path)


def open_client(
    dsn: str,
    *,
    database: str | None = None,
    access: ClickHouseAccess | None = None,
    **settings: Any,
) -> Client:
    """A clickhouse-connect client for ``dsn``; ``settings`` are ClickHouse session settings.

    ``database`` (which must exist) overrides the DSN's; chdb's default is ``default``.
    ``access`` holds the TLS options and the password of a server (ignored by chdb).

    Raises ConfigError for a malformed DSN or unusable access options (naming the
    setting), SinkUnavailable (retriable) when the server cannot be reached or the data
    path is held by another process (DataPathInUse), SinkRejected otherwise (a wrong
    password, a certificate that does not verify). No message carries the password.
    """
    path = chdb_path(dsn)
    if path is not None:
        return _open_chdb(path, database, settings)
    parsed = urlparse(dsn)
    options = _server_options(dsn, access or DEFAULT_ACCESS)  # ConfigError as it is
    try:
        # the DSN's scheme is not used by clickhouse-connect 1.12 to pick TLS
        # (only the port or interface is), so pass it as the interface
        return clickhouse_connect.get_client(
            dsn=dsn,
            interface=parsed.scheme,
            database=database,
            tz_mode="aware",
            settings=settings or None,
            **options,
        )
    except Exception as exc:
        raise translate(exc, f"connecting to {_redact(dsn)}") from exc


def _server_options(dsn: str, access: ClickHouseAccess) -> dict[str, Any]:
    """get_client's TLS and password arguments for ``dsn``; ConfigError when they do not fit."""
    parsed = urlparse(dsn)
    options: dict[str, Any] = {}
    if access.password is not None:
        if parsed.password:
            raise ConfigError(
                f"CLICKHOUSE_DSN {_redact(dsn)!r} has a password and so has "
                "CLICKHOUSE_PASSWORD / CLICKHOUSE_PASSWORD_FILE: keep one"
            )
        options["password"] = access.password.get_secret_value()
    if parsed.scheme != "https":
        if access.uses_tls_options:
            raise ConfigError(
                f"CLICKHOUSE_DSN {_redact(dsn)!r} is plain http://: the CA file, client "
                "certificate and verify settings need an https:// DSN"
            )
        return options
    options["verify"] = access.verify
    for setting, path, option in (
        ("CLICKHOUSE_CA_FILE", access.ca_file, "ca_cert"),
        ("CLICKHOUSE_CLIENT_CERT", access.client_cert, "client_cert"),
        ("CLICKHOUSE_CLIENT_KEY", access.client_key, "client_cert_key"),
    ):
        if path is None:
            continue
        if not os.access(path, os.R_OK) or not Path(path).is_file():
            raise ConfigError(f"{setting}={path}: no readable file there")
        options[option] = str(path)
    return options


def _open_chdb(path: str, database: str | None, settings: dict[str, Any]) -> Client:
    Path(path).mkdir(parents=True, exist_ok=True)
    try:
        return clickhouse_connect.get_client(
            interface="chdb",
            path=path,
            database=database,
            tz_mode="aware",
            settings=settings or None,
        )
    except Exception as exc:
        # chdb hides why it could not start (the reason goes to stderr): a lock
        # held by another process is the usual one, so look for it ourselves
        holder = _status_lock_holder(path)
        if holder is not None:
            raise DataPathInUse(path, holder) from exc
        raise SinkRejected(
            f"cannot open the chdb engine at {path}: {exc} (one data path per "
            "process: close every client of another path first; more on stderr)"
        ) from exc


def _status_lock_holder(path: str) -> str | None:
    """Who holds the engine lock on ``<path>/status`` (``pid N``), None when nobody does."""
    status = Path(path) / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            # the engine writes "PID: <pid>" as the file's first line
            for line in status.read_text(errors="replace").splitlines():
                if line.startswith("PID:"):
                    return f"pid {line[4:].strip()}"
            return "pid unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


_redact = redact_dsn


def ddl_files(ddl_dir: Path | str | None = None) -> list[Path]:
    """The numbered ``NNN_*.sql`` files of ``ddl_dir`` (default: the shipped ones), in order."""
    folder = Path(ddl_dir) if ddl_dir is not None else DDL_DIR
    files = sorted(p for p in folder.glob("*.sql") if p.name[:3].isdigit())
    if not files:
        raise ConfigError(f"no numbered .sql files in {folder}")
    return files


def apply_schema(client: Client, ddl_dir: Path | str | None = None) -> list[str]:
    """Run every DDL file in order, one statement at a time; returns the file names.

    The files only use ``CREATE ... IF NOT EXISTS``, so applying them again is a no-op. A
    materialized view it creates is filled from usage_events' history exactly once
    (``backfill.create_filled_view``), so a rollup added to a store with events misses none.
    """
    applied = []
    for path in ddl_files(ddl_dir):
        for number, statement in enumerate(split_statements(path.read_text()), 1):
            try:
                view = _VIEW.match(statement)
                if view is None:
                    client.command(statement)
                else:
                    name, target, select = view.groups()
                    create_filled_view(client, name, target, statement, select)
            except SinkError:
                raise
            except Exception as exc:
                raise translate(exc, f"{path.name}, statement {number}") from exc
        applied.append(path.name)
    return applied


_VIEW: Final = re.compile(
    r"CREATE\s+MATERIALIZED\s+VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+TO\s+(\w+)\s+AS\s+(SELECT\b.*)",
    re.IGNORECASE | re.DOTALL,
)


def rebuild_rollups(client: Client, ddl_dir: Path | str | None = None) -> list[str]:
    """Empty every rollup fed by a materialized view and refill it from usage_events.

    Uses the views' own SELECT from the DDL, so a rebuild sums exactly what the
    views sum. Stop the sink first: rows inserted during the rebuild would be
    counted twice (by the view and by the refill) or not at all. Each rebuilt table is
    marked filled (a fill ``apply_schema`` left half-way is then complete). Returns the
    rebuilt tables.
    """
    rebuilt = []
    for path in ddl_files(ddl_dir):
        for statement in split_statements(path.read_text()):
            match = _VIEW.match(statement)
            if match is None:
                continue
            _, target, select = match.groups()
            try:
                names = [row[0] for row in client.query(f"DESCRIBE ({select})").result_rows]
                client.command(f"TRUNCATE TABLE {target}")
                # the refill of an identical block must not be taken for a retry
                client.command(
                    f"INSERT INTO {target} ({', '.join(names)}) {select}",
                    settings={"insert_deduplicate": 0},
                )
                set_comment(client, target, FILLED)
            except Exception as exc:
                raise translate(exc, f"rebuilding {target}") from exc
            rebuilt.append(target)
    return rebuilt


def split_statements(sql: str) -> list[str]:
    """Split a SQL script on the ``;`` that end statements.

    A ``;`` inside a quoted string or identifier ('...', "...", `...`) or a
    comment (``-- ...``, ``/* ... */``) does not end a statement. Comments are
    dropped; statements that hold nothing else are skipped.
    """
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            end = i + 1
            while end < n and sql[end] != ch:
                end += 2 if sql[end] == "\\" else 1
            current.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch == ";":
            statements.append("".join(current))
            current = []
            i += 1
        else:
            current.append(ch)
            i += 1
    statements.append("".join(current))
    return [s.strip() for s in statements if s.strip()]

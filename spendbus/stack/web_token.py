"""The aggregator worker's web token: where it comes from, and its file in SPENDBUS_HOME.

``/sql`` always needs ``Authorization: Bearer <token>``; every page does when the worker
binds anything but loopback. The token is, in order:

1. ``SPENDBUS_WEB_TOKEN`` (the value; prefer the file form: no secret in the environment);
2. ``SPENDBUS_WEB_TOKEN_FILE`` (a file whose first line is the token; it must exist);
3. ``$SPENDBUS_HOME/web.token``, which ``spendbus up`` and ``spendbus aggregator run``
   create (random, mode 0600) when the worker binds loopback and nothing else is set.

A worker bound to another address never makes a token up: it needs 1 or 2, else it
refuses to start (the same rule as the enforcer sidecar). The token never goes on a
command line, into a log or into an error message.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Final

from pydantic import SecretStr

from runtime.net import is_loopback
from runtime.private_files import check_secret_file
from schemas.errors import ConfigError
from spendbus.settings import Settings
from spendbus.stack.secret_file import create_once
from spendbus.stack.worker import DEFAULT_TOKEN_FILE

#: bytes of randomness in a token created here (URL-safe base64: 43 characters)
TOKEN_BYTES: Final = 32


def default_token_file(settings: Settings) -> Path:
    return (settings.home / DEFAULT_TOKEN_FILE).resolve()


def configured_token(settings: Settings) -> SecretStr | None:
    """The token set by SPENDBUS_WEB_TOKEN or SPENDBUS_WEB_TOKEN_FILE; None when neither is."""
    if settings.web_token is not None:
        if settings.web_token_file is not None:
            raise ConfigError(
                "SPENDBUS_WEB_TOKEN and SPENDBUS_WEB_TOKEN_FILE are both set: keep one"
            )
        if not settings.web_token.get_secret_value().strip():
            raise ConfigError("SPENDBUS_WEB_TOKEN is empty")
        return SecretStr(settings.web_token.get_secret_value().strip())
    if settings.web_token_file is not None:
        return _read(settings.web_token_file, "SPENDBUS_WEB_TOKEN_FILE")
    return None


def worker_token(settings: Settings) -> SecretStr:
    """The token a worker serves with, creating the default file on loopback.

    ConfigError when the worker binds another address and no token is configured.
    """
    token = configured_token(settings)
    if token is not None:
        return token
    if not is_loopback(settings.web_host):
        raise ConfigError(
            f"SPENDBUS_WEB_HOST={settings.web_host}: a worker listening off loopback needs "
            "a token: set SPENDBUS_WEB_TOKEN_FILE (or SPENDBUS_WEB_TOKEN), or bind 127.0.0.1"
        )
    return ensure_default_token(settings)


def client_token(settings: Settings) -> SecretStr | None:
    """The token a client (``spendbus sql``, ``status``) sends; None when there is none."""
    token = configured_token(settings)
    if token is not None:
        return token
    path = default_token_file(settings)
    return _read(path, None) if path.exists() else None


def ensure_default_token(settings: Settings) -> SecretStr:
    """``$SPENDBUS_HOME/web.token``, created (random, 0600) when missing."""
    path = default_token_file(settings)
    if path.exists():
        return _read(path, None)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    if not create_once(path, token):
        return _read(path, None)
    return SecretStr(token)


def _read(path: Path, setting: str | None) -> SecretStr:
    where = f"{setting}={path}" if setting else str(path)
    check_secret_file(path, where)  # readable by others: refused
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the web token ({exc.strerror})") from None
    if not lines or not lines[0].strip():
        raise ConfigError(f"{where}: the web token file is empty")
    return SecretStr(lines[0].strip())

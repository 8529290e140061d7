"""The server-side secret virtual keys' digests are keyed with (HMAC-SHA256).

Gateways look keys up by ``HMAC-SHA256(secret, SHA-256(key))``; ``spendbus keys``
publishes and revokes them under the same digest, so every gateway following a keys
topic and the operator's CLI must share one secret. It is, in order:

1. ``SPENDBUS_KEY_SECRET`` (the value; prefer the file form: no secret in the environment);
2. ``SPENDBUS_KEY_SECRET_FILE`` (a file whose first line is the secret; it must exist);
3. ``$SPENDBUS_HOME/keys.secret``, created (32 random bytes as hex, mode 0600) the first
   time a command or gateway needs it and nothing else is set.

Copy that file to every gateway host (and set ``SPENDBUS_KEY_SECRET_FILE``) when they do
not share ``SPENDBUS_HOME``: a gateway with another secret matches no key (it refuses
every client, it never lets one through). The secret never goes on a command line, into
a log or an error message. It must be at least 16 characters.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Final

from runtime.private_files import check_secret_file
from schemas import jobs
from schemas.errors import ConfigError
from spendbus.settings import Settings
from spendbus.stack.secret_file import create_once

DEFAULT_KEY_SECRET_FILE: Final = "keys.secret"
#: random bytes of a secret created here
SECRET_BYTES: Final = 32
MIN_SECRET_CHARS: Final = 16


def default_key_secret_file(settings: Settings) -> Path:
    return (settings.home / DEFAULT_KEY_SECRET_FILE).resolve()


def key_secret(settings: Settings) -> bytes:
    """The key secret (see the module doc), creating the default file when nothing is set."""
    if settings.key_secret is not None:
        if settings.key_secret_file is not None:
            raise ConfigError(
                "SPENDBUS_KEY_SECRET and SPENDBUS_KEY_SECRET_FILE are both set: keep one"
            )
        return _checked(settings.key_secret.get_secret_value().strip(), "SPENDBUS_KEY_SECRET")
    if settings.key_secret_file is not None:
        return _read(settings.key_secret_file, "SPENDBUS_KEY_SECRET_FILE")
    path = default_key_secret_file(settings)
    if path.exists():
        return _read(path, None)
    value = secrets.token_hex(SECRET_BYTES)
    if not create_once(path, value):
        return _read(path, None)
    return value.encode()


def job_key_secret(settings: Settings) -> bytes:
    """What jobs' opaque keys are keyed with (schemas/jobs.py): derived from the key secret,
    so every gateway, sidecar and the CLI that share it make the same keys."""
    return jobs.job_key_secret(key_secret(settings))


def _checked(value: str, where: str) -> bytes:
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(f"{where}: the key secret must be at least {MIN_SECRET_CHARS} characters")
    return value.encode()


def _read(path: Path, setting: str | None) -> bytes:
    where = f"{setting}={path}" if setting else str(path)
    check_secret_file(path, where)  # readable by others: refused
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the key secret ({exc.strerror})") from None
    if not lines or not lines[0].strip():
        raise ConfigError(f"{where}: the key secret file is empty")
    return _checked(lines[0].strip(), where)

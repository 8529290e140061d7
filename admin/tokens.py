"""The admin API's bearer tokens: roles, how a token looks, and the private file that keeps
only their keyed digests.

A token is ``sbadm_<token_id>_<secret>``; ``token_id`` (12 hex digits) names it in the
audit trail and in ``spendbus admin tokens list``; only ``HMAC-SHA256(admin secret,
token)`` is stored, in a JSON file only its owner may read (runtime/private_files.py),
rewritten whole through a new private file and a rename. The server re-reads the file
when it changes, so a token minted or revoked while it runs counts at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from runtime.private_files import check_secret_file
from schemas.errors import ConfigError
from schemas.ids import canonical_id

PLATFORM_ADMIN: Final = "platform-admin"
ORG_ADMIN: Final = "org-admin"
ORG_VIEWER: Final = "org-viewer"
ROLES: Final = (PLATFORM_ADMIN, ORG_ADMIN, ORG_VIEWER)
TOKEN_PREFIX: Final = "sbadm_"
#: random bytes of a token's secret part (256 bits)
TOKEN_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What the tokens file holds of one token (never the token)."""

    token_id: str
    role: str
    #: the org an org-admin or org-viewer is fenced in; None for a platform-admin
    org_id: str | None
    digest: str
    created_at: str
    revoked_at: str | None = None


def check_role(role: str, org_id: str | None) -> str | None:
    """``org_id`` made canonical for ``role``; ConfigError when they do not go together."""
    if role not in ROLES:
        raise ConfigError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    if role == PLATFORM_ADMIN:
        if org_id is not None:
            raise ConfigError("a platform-admin token is for every org: give no --org")
        return None
    if org_id is None or not org_id.strip():
        raise ConfigError(f"an {role} token is fenced in one org: give --org ORG")
    return canonical_id(org_id.strip(), "org_id")


def token_digest(secret: bytes, token: str) -> str:
    return hmac.new(secret, token.encode(), hashlib.sha256).hexdigest()


class TokenBook:
    """The tokens file at ``path``, keyed with ``secret``."""

    def __init__(self, path: Path, secret: bytes) -> None:
        self.path = path
        self.secret = secret
        self._stamp: tuple[int, int] | None = None
        self._records: dict[str, TokenRecord] = {}

    def records(self) -> list[TokenRecord]:
        self._reload()
        return sorted(self._records.values(), key=lambda r: r.created_at)

    def mint(self, role: str, org_id: str | None) -> tuple[str, TokenRecord]:
        """A new token (shown once by the caller) and its stored record."""
        org = check_role(role, org_id)
        self._reload()
        token_id = secrets.token_hex(6)
        token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(TOKEN_BYTES)}"
        record = TokenRecord(
            token_id=token_id,
            role=role,
            org_id=org,
            digest=token_digest(self.secret, token),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        self._write({**self._records, token_id: record})
        return token, record

    def revoke(self, token_id: str) -> TokenRecord:
        self._reload()
        record = self._records.get(token_id)
        if record is None:
            raise ConfigError(f"no admin token {token_id!r} (`spendbus admin tokens list`)")
        if record.revoked_at is None:
            record = replace(record, revoked_at=datetime.now(UTC).isoformat(timespec="seconds"))
            self._write({**self._records, token_id: record})
        return record

    def verify(self, token: str) -> TokenRecord | None:
        """The live record of ``token``, or None (unknown, revoked or malformed)."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        token_id, _, rest = token[len(TOKEN_PREFIX) :].partition("_")
        if not rest:
            return None
        self._reload()
        record = self._records.get(token_id)
        if record is None or record.revoked_at is not None:
            return None
        if not hmac.compare_digest(record.digest, token_digest(self.secret, token)):
            return None
        return record

    def _reload(self) -> None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._records = None, {}
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        check_secret_file(self.path, str(self.path))
        try:
            rows = json.loads(self.path.read_text())
            records = {r["token_id"]: TokenRecord(**r) for r in rows}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{self.path}: not a readable admin tokens file ({exc})") from None
        self._stamp, self._records = stamp, records

    def _write(self, records: dict[str, TokenRecord]) -> None:
        text = json.dumps([asdict(r) for r in records.values()], indent=1)
        fresh = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(fresh, self.path)
        self._stamp = None
        self._reload()

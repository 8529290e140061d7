"""Virtual keys' digests and their topic records: what the gateways look keys up by and
what ``spendbus keys`` and the admin API publish (the compacted ``gateway.keys`` topic).

A key is stored only as its keyed digest: ``HMAC-SHA256(secret, SHA-256(key))`` under the
server-side key secret (spendbus/stack/key_secret.py), as a record key
``hmac-sha256:<hex>``; the legacy form is the plain SHA-256 hex.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime
from typing import Any, Final

#: the record key of a keyed digest: this prefix, then the HMAC-SHA256 hex
KEYED_PREFIX: Final = "hmac-sha256:"
#: random bytes of a key minted here (256 bits), and what it starts with
NEW_KEY_BYTES: Final = 32
NEW_KEY_PREFIX: Final = "sb-"


def key_digest(key: str) -> str:
    """The plain SHA-256 (hex) of a virtual key: the legacy stored form (``key_sha256``)."""
    return hashlib.sha256(key.encode()).hexdigest()


def keyed_digest(secret: bytes, sha256_hex: str) -> str:
    """The HMAC-SHA256 (hex), under the server-side key secret, of a key's SHA-256.

    Keyed over the SHA-256 rather than the key itself so that a legacy ``key_sha256``
    converts to its keyed form without the key (``spendbus keys migrate``); what is
    stored is useless without the secret, so a leaked topic or config file cannot be
    searched offline for weak keys.
    """
    return hmac.new(secret, bytes.fromhex(sha256_hex), hashlib.sha256).hexdigest()


def key_hmac(secret: bytes, key: str) -> str:
    """The keyed digest (``key_hmac``) a virtual key is stored and looked up by."""
    return keyed_digest(secret, key_digest(key))


def new_key() -> str:
    """A fresh virtual key: 256 random bits."""
    return NEW_KEY_PREFIX + secrets.token_urlsafe(NEW_KEY_BYTES)


def key_topic_record(
    *,
    name: str,
    org_id: str,
    secret_id: str,
    project_id: str | None,
    grant_id: str | None,
    user_id: str | None,
    groups: tuple[str, ...],
    tags: dict[str, str],
    applied_at: datetime,
) -> dict[str, Any]:
    """The ``VirtualKey`` value of a key on the keys topic (its keyed digest is the record key)."""
    return {
        "name": name,
        "org_id": org_id,
        "secret_id": secret_id,
        "project_id": project_id,
        "grant_id": grant_id,
        "user_id": user_id,
        "groups": list(groups),
        "tags": dict(tags),
        "applied_at": applied_at,
    }

"""Idempotency-Key answers as records of the compacted ``admin.idempotency`` topic, so a
retried POST gets its first answer from any admin server, after a restart too.

An answer can hold a virtual key minted for it (a key's mint or rotation), so the record
is sealed: AES-256-GCM under a key derived (HKDF-SHA256, its own label) from the key
secret the servers already hold; the record's key is its additional data, so a sealed
answer copied under another slot does not open. What is sealed: a digest of the request
body (the same key with another body is refused), the status, the body and when it
expires (``IDEMPOTENCY_LIFETIME_S``). The record's key holds the token id and a digest of
(route, Idempotency-Key), never the header itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from schemas.topics import IDEMPOTENCY_LIFETIME_S

#: the HKDF label of the answers' key: no other use of the key secret derives the same
HKDF_INFO: Final = b"spendbus admin.idempotency answers v1"
#: the first byte of a sealed record: its format
SEALED_V1: Final = b"\x01"
NONCE_BYTES: Final = 12


def answers_key(key_secret: bytes) -> AESGCM:
    """The AES-256-GCM key of the answers, derived from the servers' key secret."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(
        key_secret
    )
    return AESGCM(derived)


def slot_key(token_id: str, route: str, idempotency_key: str) -> bytes:
    """The record key of one caller's POST to ``route`` under ``idempotency_key``."""
    digest = hashlib.sha256(json.dumps([route, idempotency_key]).encode()).hexdigest()
    return f"{token_id}|{digest}".encode()


def request_digest(request: bytes) -> str:
    return hashlib.sha256(request).hexdigest()


@dataclass(frozen=True)
class Answer:
    """A POST's answer under its Idempotency-Key, and a digest of what was asked."""

    request_digest: str
    status: int
    body: dict[str, Any]
    expires_at: float

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at


def new_answer(request: bytes, status: int, body: dict[str, Any]) -> Answer:
    return Answer(request_digest(request), status, body, time.time() + IDEMPOTENCY_LIFETIME_S)


def seal(key: AESGCM, slot: bytes, answer: Answer) -> bytes:
    plain = json.dumps(
        {
            "request_digest": answer.request_digest,
            "status": answer.status,
            "body": answer.body,
            "expires_at": answer.expires_at,
        },
        default=str,
    ).encode()
    nonce = os.urandom(NONCE_BYTES)
    return SEALED_V1 + nonce + key.encrypt(nonce, plain, slot)


def unseal(key: AESGCM, slot: bytes, sealed: bytes) -> Answer | None:
    """The answer sealed under ``slot``; None when it does not open (another key secret,
    another slot's record, a format this server does not know)."""
    if not sealed.startswith(SEALED_V1) or len(sealed) <= 1 + NONCE_BYTES:
        return None
    nonce, ciphertext = sealed[1 : 1 + NONCE_BYTES], sealed[1 + NONCE_BYTES :]
    try:
        fields = json.loads(key.decrypt(nonce, ciphertext, slot))
    except (InvalidTag, ValueError):
        return None
    return Answer(
        str(fields["request_digest"]),
        int(fields["status"]),
        dict(fields["body"]),
        float(fields["expires_at"]),
    )

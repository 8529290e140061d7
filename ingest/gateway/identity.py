"""Who is calling: virtual keys to principals, and the session a request belongs to.

A client proves who it is with a virtual key, presented where its SDK puts a
provider key (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key`` or
Gemini's ``?key=``). Keys are stored and looked up by an HMAC-SHA256 keyed with
a server-side secret (``key_hmac``), so neither the configuration nor the keys
topic needs to hold them in clear, and what they hold cannot be searched offline;
legacy unsalted SHA-256 digests are read too, converted under the secret. Nothing else a client sends
changes the principal (docs/design.md invariant 6); the one thing it may name is its
session (the job an agent framework runs), and that name is scoped by org so
one tenant can never reach another's session counter.
"""

from __future__ import annotations

import secrets as random_secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from schemas.ids import MAX_ID_LENGTH
from schemas.virtual_keys import key_hmac, keyed_digest

from .config import Principal, VirtualKey

#: where SDKs put the API key, in the order they are looked at
KEY_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")


def presented_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The virtual key a request presents, or None."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    for name in KEY_HEADERS[1:]:
        found = headers.get(name)
        if found and found.strip():
            return found.strip()
    in_query = query.get("key")
    return in_query.strip() if in_query and in_query.strip() else None


#: bytes of a key secret made when none is given (a store of keys in clear or legacy form)
KEY_SECRET_BYTES = 32


class KeyStore:
    """Virtual keys by keyed digest. ``replace`` swaps the whole set atomically.

    ``secret`` is the server-side key secret the digests are keyed with; without one a
    random secret of this process is used, which serves keys given in clear or as
    legacy SHA-256 (both converted here) but can match no ``key_hmac``: such a store
    refuses them.
    """

    def __init__(self, keys: Iterable[VirtualKey] = (), *, secret: bytes | None = None) -> None:
        self.keyed = secret is not None
        self.secret = secret if secret is not None else random_secrets.token_bytes(KEY_SECRET_BYTES)
        self._by_digest: dict[str, VirtualKey] = {}
        self.replace(keys)

    def digest(self, vk: VirtualKey) -> str:
        if vk.key_hmac is not None and not self.keyed:
            raise ValueError(
                f"key {vk.name!r} is given as key_hmac: the gateway needs the key secret "
                "it was made with"
            )
        return vk.digest(self.secret)

    def digest_of_sha256(self, sha256_hex: str) -> str:
        """The keyed digest of a legacy SHA-256 digest."""
        return keyed_digest(self.secret, sha256_hex)

    def replace(self, keys: Iterable[VirtualKey]) -> None:
        self._by_digest = {self.digest(vk): vk for vk in keys}

    def put(self, vk: VirtualKey) -> None:
        self._by_digest[self.digest(vk)] = vk

    def remove(self, digest: str) -> None:
        self._by_digest.pop(digest, None)

    def lookup(self, key: str | None) -> VirtualKey | None:
        if not key:
            return None
        return self._by_digest.get(key_hmac(self.secret, key))

    @property
    def legacy(self) -> int:
        """Keys held in the legacy unsalted form where they are stored."""
        return sum(vk.legacy for vk in self._by_digest.values())

    def __len__(self) -> int:
        return len(self._by_digest)


class SessionTracker:
    """Session ids: the client's header (scoped by org), else a sliding idle window per key.

    Without a header, a key's requests belong to one automatic session until it
    has been idle ``idle_ttl_s``; the next request starts a new one. Ids are
    ``auto:<key name>:<start, UTC>``; the ``max_tracked`` least recently used
    keys are remembered.
    """

    def __init__(
        self,
        idle_ttl_s: float,
        max_tracked: int = 100_000,
        clock: Callable[[], float] = time.time,
        *,
        auto: bool = True,
    ) -> None:
        self.auto = auto
        self.idle_ttl_s = idle_ttl_s
        self.max_tracked = max_tracked
        self.clock = clock
        self._open: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def session_id(self, vk: VirtualKey, header: str | None) -> str | None:
        """The request's session id (None: no header and ``auto`` off); raises ValueError
        when the header cannot be one."""
        if header is not None and header.strip():
            value = f"{vk.principal.org_id}/{header.strip()}"
            if len(value) > MAX_ID_LENGTH:
                raise ValueError(f"session header longer than {MAX_ID_LENGTH} characters")
            if not value.isprintable():
                raise ValueError("session header has unprintable characters")
            return value
        if not self.auto:
            return None
        now = self.clock()
        seen = self._open.get(vk.name)
        if seen is not None and now - seen[1] <= self.idle_ttl_s:
            session = seen[0]
            self._open.move_to_end(vk.name)
        else:
            start = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
            session = f"auto:{vk.name}:{start}"
        self._open[vk.name] = (session, now)
        while len(self._open) > self.max_tracked:
            self._open.popitem(last=False)
        return session


__all__ = ["KEY_HEADERS", "KeyStore", "Principal", "SessionTracker", "presented_key"]

"""Who may do what: a caller is a live token's role and org; every resource has an org
(or none: then only a platform-admin sees it).

- ``platform-admin``: every org, every verb.
- ``org-admin``: its org's budgets, keys and raises, read and written; what belongs to
  another org (or to none) is answered 404, exactly like an id that does not exist.
- ``org-viewer``: what an org-admin sees, read only (a write is 403).
- ``virtual-key``: a request authenticated with a gateway virtual key itself (not an
  admin token) reads the counters that key's requests count in, and nothing else: every
  other route is 403 for it (``Route.keys_may_call``).

An org-scoped caller names the budgets and keys it creates under its org
(``<org>.<name>``): budget ids and key names are shared by every org on the topics, so a
name taken by another org must never be the caller's to find out by a 409.
"""

from __future__ import annotations

from dataclasses import dataclass

from admin.errors import ApiError
from admin.tokens import ORG_VIEWER, PLATFORM_ADMIN, TokenRecord

#: the role of a caller that presented a virtual key (gateway.keys), not an admin token
VIRTUAL_KEY = "virtual-key"


@dataclass(frozen=True, slots=True)
class Caller:
    token_id: str
    role: str
    #: None: every org (a platform-admin)
    org_id: str | None
    remote: str
    #: a virtual key's record key on gateway.keys (its keyed digest), for that role only
    key_record: str | None = None

    @classmethod
    def of(cls, record: TokenRecord, remote: str) -> Caller:
        return cls(record.token_id, record.role, record.org_id, remote)

    @classmethod
    def of_key(cls, record_key: str, org_id: str, remote: str) -> Caller:
        # named in the audit trail and logs by a short prefix of its digest, never the key
        return cls(f"key:{record_key[-12:]}", VIRTUAL_KEY, org_id, remote, record_key)

    def sees(self, org_id: str | None) -> bool:
        return self.org_id is None or self.org_id == org_id

    def may_write(self) -> None:
        if self.role in (ORG_VIEWER, VIRTUAL_KEY):
            raise ApiError(403, f"role {self.role} is read only")

    def owned_name(self, name: str, field: str) -> None:
        """An org-scoped caller's new budget id or key name starts with ``<org>.``."""
        if self.role != PLATFORM_ADMIN and not name.startswith(f"{self.org_id}."):
            raise ApiError(
                422, f"field {field!r}: must start with '{self.org_id}.' (your org)", field
            )

    def org_of_new(self, given: str | None, field: str) -> str:
        """The org a new resource belongs to: the caller's own (an org-scoped caller may
        leave it out, and may not name another), or the one a platform-admin gives."""
        if self.org_id is None:
            if given is None:
                raise ApiError(422, f"field {field!r}: required (the org it belongs to)", field)
            return given
        if given is not None and given != self.org_id:
            raise ApiError(403, f"field {field!r}: your token is fenced in org {self.org_id!r}")
        return self.org_id

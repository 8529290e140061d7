"""An admin.audit entry: what the admin API writes (admin/store.py) and the sink copies
into ClickHouse's ``admin_audit`` table (aggregator/sink/admin_audit.py, the table's DDL in
``aggregator/sink/ddl/012_admin_audit.sql``), defined once.

The value is JSON keyed by its audit id: who (token id, role, remote address), what
(action, resource, its id and org, the value before and after: never a key, only its
digest), when (``at``, ISO 8601 UTC with microseconds).
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any, Final

from schemas.errors import ContractError

#: the table's columns, in the order :func:`audit_row` gives them
AUDIT_COLUMNS: Final = (
    "audit_id",
    "at",
    "token_id",
    "role",
    "remote",
    "action",
    "resource",
    "resource_id",
    "org_id",
    "before",
    "after",
)
_TEXT_FIELDS: Final = ("audit_id", "at", "token_id", "role", "remote", "action", "resource")


def new_audit_entry(
    *,
    token_id: str,
    role: str,
    remote: str,
    action: str,
    resource: str,
    resource_id: str,
    org_id: str | None,
    before: Any,
    after: Any,
) -> dict[str, Any]:
    """A fresh entry (a random audit id, now)."""
    return {
        "audit_id": f"a-{secrets.token_hex(8)}",
        "at": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "token_id": token_id,
        "role": role,
        "remote": remote,
        "action": action,
        "resource": resource,
        "resource_id": resource_id,
        "org_id": org_id,
        "before": before,
        "after": after,
    }


def encode_entry(entry: dict[str, Any]) -> tuple[bytes, bytes]:
    """(record key, value) of ``entry`` on admin.audit."""
    return str(entry["audit_id"]).encode(), json.dumps(entry, default=str).encode()


def decode_entry(value: bytes) -> dict[str, Any]:
    """The entry of a record's value; ContractError naming what is wrong otherwise."""
    try:
        entry = json.loads(value)
    except (ValueError, RecursionError):
        raise ContractError("admin.audit: the value is not JSON") from None
    if not isinstance(entry, dict):
        raise ContractError("admin.audit: the value is not a JSON object")
    for name in (*_TEXT_FIELDS, "resource_id"):
        if not isinstance(entry.get(name), str):
            raise ContractError(f"admin.audit: field {name!r} is missing or not text")
    if entry.get("org_id") is not None and not isinstance(entry["org_id"], str):
        raise ContractError("admin.audit: field 'org_id' is not text")
    try:
        at(entry)
    except ValueError:
        raise ContractError(f"admin.audit: field 'at' {entry['at']!r} is no ISO time") from None
    return entry


def at(entry: dict[str, Any]) -> datetime:
    """When the change was made, in UTC."""
    when = datetime.fromisoformat(str(entry["at"]).replace("Z", "+00:00"))
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def audit_row(entry: dict[str, Any]) -> list[Any]:
    """The ``admin_audit`` row of a decoded entry, in ``AUDIT_COLUMNS`` order (before and
    after as JSON text)."""
    return [
        entry["audit_id"],
        at(entry),
        entry["token_id"],
        entry["role"],
        entry["remote"],
        entry["action"],
        entry["resource"],
        entry["resource_id"],
        entry.get("org_id"),
        _json_text(entry.get("before")),
        _json_text(entry.get("after")),
    ]

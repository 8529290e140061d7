"""Every route of the admin API, once: the server mounts them and the OpenAPI document
is written from them (admin/openapi.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel

from admin import api
from admin.models import (
    AlertList,
    AuditList,
    BudgetBody,
    BudgetList,
    CounterList,
    DeadLetterList,
    Deleted,
    KeyBody,
    KeyList,
    KeyView,
    MintedKey,
    RaiseBody,
    RaiseList,
    RaiseView,
    Revoked,
    SpendReport,
)
from admin.reports import DEFAULT_LIMIT, MAX_LIMIT

PREFIX: Final = "/v1/admin"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: api.Handler
    summary: str
    #: what a success answers
    answer: type[BaseModel]
    body: type[BaseModel] | None = None
    #: a write (an org-viewer's is 403)
    writes: bool = False
    #: answers POST with Idempotency-Key
    idempotent: bool = False
    #: optional query parameters (strings)
    query: tuple[str, ...] = ()
    #: (parameter, its description in the OpenAPI document)
    query_help: tuple[tuple[str, str], ...] = ()
    #: a caller with a virtual key (not an admin token) may call it (else 403)
    keys_may_call: bool = False


ROUTES: Final = (
    Route("GET", "/budgets", api.list_budgets, "The budgets the caller sees.", BudgetList),
    Route(
        "POST",
        "/budgets",
        api.create_budget,
        "Create a budget (409 if its id exists).",
        BudgetBody,
        BudgetBody,
        True,
        True,
    ),
    Route("GET", "/budgets/{budget_id}", api.get_budget, "One budget.", BudgetBody),
    Route(
        "PUT",
        "/budgets/{budget_id}",
        api.put_budget,
        "Create or replace a budget by id.",
        BudgetBody,
        BudgetBody,
        True,
    ),
    Route(
        "PATCH",
        "/budgets/{budget_id}",
        api.patch_budget,
        "Change some fields of a budget (null: back to the default).",
        BudgetBody,
        BudgetBody,
        True,
    ),
    Route(
        "DELETE", "/budgets/{budget_id}", api.delete_budget, "Delete a budget.", Deleted, None, True
    ),
    Route(
        "GET",
        "/keys",
        api.list_keys,
        "The live virtual keys the caller sees (never a key).",
        KeyList,
    ),
    Route(
        "POST",
        "/keys",
        api.create_key,
        "Mint a virtual key: the key is in this answer only.",
        MintedKey,
        KeyBody,
        True,
        True,
    ),
    Route("GET", "/keys/{key_id}", api.get_key, "One live key (never the key).", KeyView),
    Route("DELETE", "/keys/{key_id}", api.revoke_key, "Revoke a key.", Revoked, None, True),
    Route(
        "POST",
        "/keys/{key_id}/rotate",
        api.rotate_key,
        "A new key with the same name and principal; the old one is revoked.",
        MintedKey,
        None,
        True,
        True,
    ),
    Route(
        "GET", "/raises", api.list_raises, "Every raise of the budgets the caller sees.", RaiseList
    ),
    Route(
        "POST",
        "/raises",
        api.create_raise,
        "Raise a budget's limits until a time.",
        RaiseView,
        RaiseBody,
        True,
        True,
    ),
    Route("GET", "/raises/{raise_id}", api.get_raise, "One raise.", RaiseView),
    Route(
        "POST",
        "/raises/{raise_id}/revoke",
        api.revoke_raise,
        "End a raise now.",
        RaiseView,
        None,
        True,
    ),
    Route(
        "GET",
        "/counters",
        api.list_counters,
        "Every live counter of the budgets the caller sees (one budget's with budget_id); "
        "with a virtual key as the bearer token, the counters that key's requests count in.",
        CounterList,
        query=("budget_id",),
        keys_may_call=True,
    ),
    Route(
        "GET",
        "/reports/spend",
        api.spend,
        "Spend by day, week or month and by org, project, secret, user, model or tag, "
        f"a page at a time: limit rows (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}), "
        "then cursor=next_cursor for the next page.",
        SpendReport,
        query=("by", "group", "from", "to", "org_id", "limit", "cursor"),
        query_help=(
            ("limit", f"rows a page: 1 to {MAX_LIMIT}, default {DEFAULT_LIMIT}"),
            ("cursor", "the previous page's next_cursor, as given (opaque)"),
        ),
    ),
    Route(
        "GET",
        "/alerts",
        api.list_alerts,
        "The budget alerts of the budgets the caller sees, each with its webhook deliveries "
        "(filters: budget_id, kind, since as a time or a duration back such as 6h).",
        AlertList,
        query=("budget_id", "kind", "since"),
    ),
    Route(
        "GET",
        "/dead-letters",
        api.dead_letters,
        "The dead letters (what could not be read or priced) counted per reason: an org's "
        "those of its own events; a letter whose bytes do not read, a platform-admin only.",
        DeadLetterList,
    ),
    Route(
        "GET",
        "/audit",
        api.list_audit,
        "Every change made through the API the caller may see (one resource's with resource).",
        AuditList,
        query=("resource",),
    ),
)

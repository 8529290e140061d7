"""The admin API's handlers: budgets, virtual keys, raises and the audit trail under
``/v1/admin/``, each fenced by the caller's org (admin/access.py).

Every body is read within a deadline and a size limit (runtime/http_receive.py), parsed
as JSON and validated whole before anything is written: a bad request is a 4xx whose
JSON body names the problem, and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from admin.access import Caller
from admin.alerts import ALERT_KINDS, alert_json, alert_scope_values, parse_since
from admin.dead_letters import DeadLetterFollower
from admin.errors import ApiError, invalid
from admin.models import KeyBody, RaiseBody
from admin.reports import SpendQuery, spend_report
from admin.store import AdminStore
from admin.tokens import PLATFORM_ADMIN, TokenBook
from runtime.http_receive import BodyRefused, read_body
from schemas.budgets import Budget, applicable, budget_fields, parse_budget
from schemas.codec import BUDGET_POLICY, BUDGET_RAISE, GATEWAY_KEY
from schemas.counter_rows import counter_row
from schemas.errors import ConfigError, ContractError
from schemas.ids import canonical_id
from schemas.periods import from_micros, to_micros
from schemas.raises import BudgetRaise, grant_raise
from schemas.virtual_keys import KEYED_PREFIX, key_digest, key_hmac, key_topic_record, new_key

#: the largest body taken (a budget, a key or a raise is well under 8 KiB)
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024
#: seconds a client has to send a body once its head arrived
DEFAULT_BODY_TIMEOUT_S: Final = 10.0
#: a JSON body nested deeper than this is refused (it is no budget)
MAX_JSON_DEPTH: Final = 32

STORE: Final = web.AppKey("store", AdminStore)
TOKENS: Final = web.AppKey("tokens", TokenBook)
LIMITS: Final = web.AppKey("limits", tuple)
SPEND_QUERY: Final[web.AppKey[SpendQuery | None]] = web.AppKey("spend_query")
DEAD_LETTERS: Final = web.AppKey("dead_letters", DeadLetterFollower)
#: a body handed in by the server itself (the console calls these handlers in process
#: with its form as JSON): request storage, which no client can set
GIVEN_BODY: Final = web.RequestKey("given_body", bytes)

_Model = TypeVar("_Model", bound=BaseModel)

Handler = Callable[[web.Request, Caller], Awaitable[web.StreamResponse]]


def _iso(us: int) -> str:
    return from_micros(us).isoformat().replace("+00:00", "Z")


def budget_org(budget: Budget) -> str | None:
    """The org a budget belongs to: the one org its ``match`` names, else none (a budget
    over several orgs, or all: a platform-admin's)."""
    orgs = budget.match.get("org_id", ())
    return orgs[0] if len(orgs) == 1 else None


def budget_json(budget: Budget) -> dict[str, Any]:
    return budget_fields(budget)


def key_json(record_key: str, record: dict[str, Any]) -> dict[str, Any]:
    """A live key as listed: its id (the keyed digest) and principal, never the key."""
    return {
        "key_id": record_key.removeprefix(KEYED_PREFIX),
        "name": record["name"],
        "org_id": record["org_id"],
        "secret_id": record["secret_id"],
        "project_id": record["project_id"],
        "grant_id": record["grant_id"],
        "user_id": record["user_id"],
        "groups": list(record["groups"]),
        "tags": dict(record["tags"]),
        "applied_at": record["applied_at"].isoformat().replace("+00:00", "Z"),
    }


def raise_json(r: BudgetRaise, now_us: int) -> dict[str, Any]:
    if r.active(now_us):
        status = "active"
    elif r.revoked_at_us is not None and r.revoked_at_us <= now_us:
        status = "revoked"
    else:
        status = "expired" if r.until_us <= now_us else "pending"
    return {
        "raise_id": r.raise_id,
        "budget_id": r.budget_id,
        "scope": "/".join(r.scope_values) or None,
        "mode": r.mode,
        "raise_nanos": r.raise_nanos,
        "raise_tokens": r.raise_tokens,
        "raise_requests": r.raise_requests,
        "starts_at": _iso(r.starts_at_us),
        "until": _iso(r.until_us),
        "revoked_at": None if r.revoked_at_us is None else _iso(r.revoked_at_us),
        "reason": r.reason,
        "created_by": r.created_by,
        "status": status,
    }


# --- request bodies ---------------------------------------------------------------------
def _depth(value: Any) -> int:
    stack, deepest = [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            return depth
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children)
    return deepest


async def raw_body(request: web.Request) -> bytes:
    if GIVEN_BODY in request:
        return request[GIVEN_BODY]
    max_bytes, timeout_s = request.app[LIMITS]
    try:
        return await read_body(request, timeout_s=timeout_s, max_bytes=max_bytes)
    except BodyRefused as refused:
        raise ClosingError(refused.status, refused.reason) from None


class ClosingError(ApiError):
    """A refused body: answered, then the connection closes (the rest is never read)."""


def json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise ApiError(400, "the body is empty: a JSON object is expected")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(value).__name__}")
    if _depth(value) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def model_of(model: type[_Model], data: dict[str, Any]) -> _Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "<body>"
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError(422, f"field {path!r}: {message}", path) from None


# --- budgets ----------------------------------------------------------------------------
def _visible_budget(store: AdminStore, caller: Caller, budget_id: str) -> Budget:
    budget = store.budgets().get(budget_id)
    if budget is None or not caller.sees(budget_org(budget)):
        raise ApiError(404, f"no budget {budget_id!r}")
    return budget


def _checked_budget(caller: Caller, fields: dict[str, Any], budget_id: str | None) -> Budget:
    """A budget from its YAML fields, fenced: an org-scoped caller's budget matches its
    own org (added when left out) and is named under it."""
    if budget_id is not None:
        if "id" in fields and fields["id"] != budget_id:
            raise ApiError(
                422, f"field 'id': {fields['id']!r} is not the path's {budget_id!r}", "id"
            )
        fields = {**fields, "id": budget_id}
    if caller.org_id is not None:
        match = fields.get("match")
        if match is None:
            match = {}
        if not isinstance(match, dict):
            raise ApiError(422, "field 'match': must be a mapping", "match")
        given = match.get("org_id")
        if given is None:
            fields = {**fields, "match": {**match, "org_id": caller.org_id}}
        else:
            named = given if isinstance(given, list) else [given]
            if [canonical_id(str(g), "org_id") for g in named] != [caller.org_id]:
                raise ApiError(
                    403, f"field 'match.org_id': your token is fenced in org {caller.org_id!r}"
                )
        if isinstance(fields.get("id"), str):
            caller.owned_name(fields["id"], "id")
    budget, errors = parse_budget(fields, source="body")
    if budget is None:
        raise invalid(errors)
    if not caller.sees(budget_org(budget)):
        raise ApiError(403, f"field 'match.org_id': your token is fenced in org {caller.org_id!r}")
    return budget


async def _publish_budget(
    store: AdminStore,
    caller: Caller,
    action: str,
    before: Budget | None,
    after: Budget | None,
    budget_id: str,
) -> None:
    topic = store.config.topics.budget_policies
    value = None if after is None else BUDGET_POLICY.encode(after.to_record(datetime.now(UTC)))
    org = budget_org(after or before)  # type: ignore[arg-type]  # one of them is a budget
    await store.write(
        caller,
        topic=topic,
        records=[(budget_id.encode(), value)],
        action=action,
        resource="budgets",
        resource_id=budget_id,
        org_id=org,
        before=None if before is None else budget_json(before),
        after=None if after is None else budget_json(after),
    )


async def list_budgets(request: web.Request, caller: Caller) -> web.StreamResponse:
    budgets = request.app[STORE].budgets().values()
    shown = [
        budget_json(b)
        for b in sorted(budgets, key=lambda b: b.budget_id)
        if caller.sees(budget_org(b))
    ]
    return web.json_response({"budgets": shown})


async def get_budget(request: web.Request, caller: Caller) -> web.StreamResponse:
    budget = _visible_budget(request.app[STORE], caller, request.match_info["budget_id"])
    return web.json_response(budget_json(budget))


async def create_budget(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    raw = await raw_body(request)

    async def answer() -> tuple[int, dict[str, Any]]:
        budget = _checked_budget(caller, json_object(raw), None)
        async with store.writing():
            if budget.budget_id in store.budgets():
                raise ApiError(409, f"budget {budget.budget_id!r} exists (PUT replaces it)")
            await _publish_budget(store, caller, "budgets.create", None, budget, budget.budget_id)
        return 201, budget_json(budget)

    return await _answered(store, caller, request, raw, answer)


async def put_budget(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    budget_id = request.match_info["budget_id"]
    raw = await raw_body(request)
    async with store.writing():
        before = store.budgets().get(budget_id)
        # an id another org holds, or one an org-scoped caller could never hold: the same
        # 404 as an id nobody holds (no answer tells them apart)
        hidden = before is not None and not caller.sees(budget_org(before))
        if hidden or (caller.org_id is not None and not budget_id.startswith(f"{caller.org_id}.")):
            raise ApiError(404, f"no budget {budget_id!r}")
        budget = _checked_budget(caller, json_object(raw), budget_id)
        if before != budget:  # the same budget again converges without a new record
            await _publish_budget(store, caller, "budgets.replace", before, budget, budget_id)
    return web.json_response(budget_json(budget), status=200 if before is not None else 201)


async def patch_budget(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    budget_id = request.match_info["budget_id"]
    patch = json_object(await raw_body(request))
    async with store.writing():
        before = _visible_budget(store, caller, budget_id)
        # a field given null goes back to its default (JSON merge patch, RFC 7396)
        fields = {k: v for k, v in {**budget_fields(before), **patch}.items() if v is not None}
        budget = _checked_budget(caller, fields, budget_id)
        if before != budget:
            await _publish_budget(store, caller, "budgets.patch", before, budget, budget_id)
    return web.json_response(budget_json(budget))


async def delete_budget(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    budget_id = request.match_info["budget_id"]
    async with store.writing():
        before = _visible_budget(store, caller, budget_id)
        await _publish_budget(store, caller, "budgets.delete", before, None, budget_id)
    return web.json_response({"deleted": budget_id})


# --- virtual keys -----------------------------------------------------------------------
def _visible_key(store: AdminStore, caller: Caller, key_id: str) -> tuple[str, dict[str, Any]]:
    record_key = KEYED_PREFIX + key_id.lower()
    record = store.keys().get(record_key)
    if record is None or not caller.sees(record["org_id"]):
        raise ApiError(404, f"no key {key_id!r}")
    return record_key, record


async def _mint(
    store: AdminStore, caller: Caller, action: str, record: dict[str, Any], retire: str | None
) -> dict[str, Any]:
    """Publish a new key with ``record``'s principal (and tombstone ``retire``, a rotation:
    one partition, in order); the key is in the answer, and nowhere else."""
    key = new_key()
    digest = key_hmac(store.config.key_secret, key)
    fresh = {**record, "applied_at": datetime.now(UTC)}
    records: list[tuple[bytes, bytes | None]] = [
        ((KEYED_PREFIX + digest).encode(), GATEWAY_KEY.encode(fresh))
    ]
    if retire is not None:
        records.append((retire.encode(), None))
    shown = key_json(KEYED_PREFIX + digest, fresh)
    await store.write(
        caller,
        topic=store.config.topics.gateway_keys,
        records=records,
        action=action,
        resource="keys",
        resource_id=shown["key_id"],
        org_id=record["org_id"],
        before=None if retire is None else {"key_id": retire.removeprefix(KEYED_PREFIX)},
        after=shown,
    )
    return {**shown, "key": key}


async def list_keys(request: web.Request, caller: Caller) -> web.StreamResponse:
    keys = request.app[STORE].keys()
    shown = [
        key_json(k, r)
        for k, r in keys.items()
        if k.startswith(KEYED_PREFIX) and caller.sees(r["org_id"])
    ]
    return web.json_response({"keys": sorted(shown, key=lambda k: k["name"])})


async def get_key(request: web.Request, caller: Caller) -> web.StreamResponse:
    record_key, record = _visible_key(request.app[STORE], caller, request.match_info["key_id"])
    return web.json_response(key_json(record_key, record))


async def create_key(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    raw = await raw_body(request)

    async def answer() -> tuple[int, dict[str, Any]]:
        body = model_of(KeyBody, json_object(raw))
        org = canonical_id(caller.org_of_new(body.org_id, "org_id"), "org_id")
        caller.owned_name(body.name, "name")
        record = key_topic_record(
            name=body.name,
            org_id=org,
            secret_id=body.secret_id,
            project_id=body.project_id,
            grant_id=body.grant_id,
            user_id=body.user_id,
            groups=tuple(body.groups),
            tags=body.tags,
            applied_at=datetime.now(UTC),
        )
        async with store.writing():
            if any(r["name"] == body.name for r in store.keys().values()):
                raise ApiError(409, f"field 'name': a live key is named {body.name!r}", "name")
            return 201, await _mint(store, caller, "keys.create", record, None)

    return await _answered(store, caller, request, raw, answer)


async def rotate_key(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]

    async def answer() -> tuple[int, dict[str, Any]]:
        async with store.writing():
            record_key, record = _visible_key(store, caller, request.match_info["key_id"])
            return 201, await _mint(store, caller, "keys.rotate", record, record_key)

    # a retry with its Idempotency-Key gets the key it rotated to, not a third one
    return await _answered(store, caller, request, b"", answer)


async def revoke_key(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    async with store.writing():
        record_key, record = _visible_key(store, caller, request.match_info["key_id"])
        shown = key_json(record_key, record)
        await store.write(
            caller,
            topic=store.config.topics.gateway_keys,
            records=[(record_key.encode(), None)],
            action="keys.revoke",
            resource="keys",
            resource_id=shown["key_id"],
            org_id=record["org_id"],
            before=shown,
            after=None,
        )
    return web.json_response({"revoked": shown["key_id"]})


# --- raises -----------------------------------------------------------------------------
def _raise_org(store: AdminStore, r: BudgetRaise) -> str | None:
    """A raise belongs to its budget's org (the budget gone: to its counter's org)."""
    budget = store.budgets().get(r.budget_id)
    if budget is not None:
        return budget_org(budget)
    return r.scope_values[0] if r.scope_values else None


def _visible_raise(store: AdminStore, caller: Caller, raise_id: str) -> BudgetRaise:
    found = store.raises().get(raise_id)
    if found is None or not caller.sees(_raise_org(store, found)):
        raise ApiError(404, f"no raise {raise_id!r}")
    return found


async def list_raises(request: web.Request, caller: Caller) -> web.StreamResponse:
    store = request.app[STORE]
    now_us = to_micros(datetime.now(UTC))
    shown = [
        raise_json(r, now_us)
        for r in sorted(store.raises().values(), key=lambda r: (r.starts_at_us, r.raise_id))
        if caller.sees(_raise_org(store, r))
    ]
    return web.json_response({"raises": shown})


async def get_raise(request: web.Request, caller: Caller) -> web.StreamResponse:
    store = request.app[STORE]
    found = _visible_raise(store, caller, request.match_info["raise_id"])
    return web.json_response(raise_json(found, to_micros(datetime.now(UTC))))


async def create_raise(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    raw = await raw_body(request)

    async def answer() -> tuple[int, dict[str, Any]]:
        body = model_of(RaiseBody, json_object(raw))
        now = datetime.now(UTC)
        async with store.writing():
            budget = store.budgets().get(body.budget_id)
            if budget is None or not caller.sees(budget_org(budget)):
                raise ApiError(422, f"field 'budget_id': no budget {body.budget_id!r}", "budget_id")
            try:
                granted = grant_raise(
                    budget,
                    scope_text=body.scope,
                    by_usd=None if body.by_usd is None else str(body.by_usd),
                    to_usd=None if body.to_usd is None else str(body.to_usd),
                    tokens=body.tokens,
                    requests=body.requests,
                    until_text=body.until,
                    reason=body.reason,
                    created_by=f"admin-token:{caller.token_id}",
                    now=now,
                )
            except (ConfigError, ContractError) as exc:
                raise ApiError(422, str(exc)) from None
            if caller.org_id is not None and granted.scope_values[:1] not in ((), (caller.org_id,)):
                raise ApiError(403, f"field 'scope': your token is fenced in org {caller.org_id!r}")
            shown = raise_json(granted, to_micros(now))
            await store.write(
                caller,
                topic=store.config.topics.budget_raises,
                records=[(granted.raise_id.encode(), BUDGET_RAISE.encode(granted.to_record()))],
                action="raises.create",
                resource="raises",
                resource_id=granted.raise_id,
                org_id=budget_org(budget),
                before=None,
                after=shown,
            )
        return 201, shown

    return await _answered(store, caller, request, raw, answer)


async def revoke_raise(request: web.Request, caller: Caller) -> web.StreamResponse:
    caller.may_write()
    store = request.app[STORE]
    now_us = to_micros(datetime.now(UTC))
    async with store.writing():
        before = _visible_raise(store, caller, request.match_info["raise_id"])
        if before.revoked_at_us is not None and before.revoked_at_us <= now_us:
            return web.json_response(raise_json(before, now_us))  # revoked already: converged
        after = replace(before, revoked_at_us=now_us)
        await store.write(
            caller,
            topic=store.config.topics.budget_raises,
            records=[(after.raise_id.encode(), BUDGET_RAISE.encode(after.to_record()))],
            action="raises.revoke",
            resource="raises",
            resource_id=after.raise_id,
            org_id=_raise_org(store, after),
            before=raise_json(before, now_us),
            after=raise_json(after, now_us),
        )
    return web.json_response(raise_json(after, now_us))


# --- a virtual key as the caller ----------------------------------------------------------
def key_caller(store: AdminStore, key: str, remote: str) -> Caller | None:
    """The caller a live virtual key is, looked up as the gateways look it up: by its
    keyed digest (or a legacy record's plain SHA-256); None for no live key."""
    keys = store.keys()
    for record_key in (KEYED_PREFIX + key_hmac(store.config.key_secret, key), key_digest(key)):
        record = keys.get(record_key)
        if record is not None:
            return Caller.of_key(record_key, record["org_id"], remote)
    return None


def _key_counters(store: AdminStore, caller: Caller, budgets: dict[str, Budget]) -> dict[str, str]:
    """The counter keys (-> budget id) a key caller's requests count in: its principal's, as the
    gateway's ``GET /v1/spend`` reports them (no model: a request names that)."""
    assert caller.key_record is not None
    record = store.keys().get(caller.key_record)
    if record is None:  # revoked since it was verified
        raise ApiError(401, "unknown or revoked admin token or virtual key")
    attrs = {
        "org_id": record["org_id"],
        "secret_id": record["secret_id"],
        "project_id": record["project_id"],
        "grant_id": record["grant_id"],
        "user_id": record["user_id"],
        "groups": list(record["groups"]),
        "tags": dict(record["tags"]),
    }
    return {key: budget.budget_id for budget, key, _ in applicable(budgets.values(), attrs)}


# --- counters ---------------------------------------------------------------------------
def _remaining(limit: int | None, spent: int) -> int | None:
    return None if limit is None else max(limit - spent, 0)


def counter_json(
    row: dict[str, Any], budget: Budget, granted: BudgetRaise | None
) -> dict[str, Any]:
    """A counter with the limits the enforcers check (the live budget's, raised while
    ``granted`` is in force), what is left under them, and its forecast (``exhausts_at``
    only when it falls before the period resets)."""
    limits = (budget.limit_nanos, budget.limit_tokens, budget.limit_requests)
    if granted is not None:
        limits = granted.limits(*limits)
    exhausts, reset = row["exhausts_at"], row["reset_at"]
    if exhausts is not None and reset is not None and exhausts >= reset:
        exhausts = None  # it resets first
    return {
        "budget_id": row["budget_id"],
        "scope": row["scope"],
        "scope_values": row["scope_values"],
        "period": row["period"],
        "state": row["state"],
        "action": row["action"],
        "spent_nanos": row["spent_nanos"],
        "spent_tokens": row["spent_tokens"],
        "spent_requests": row["spent_requests"],
        "limit_nanos": limits[0],
        "limit_tokens": limits[1],
        "limit_requests": limits[2],
        "remaining_nanos": _remaining(limits[0], row["spent_nanos"]),
        "remaining_tokens": _remaining(limits[1], row["spent_tokens"]),
        "remaining_requests": _remaining(limits[2], row["spent_requests"]),
        "raise": row["raise"],
        "reset_at": reset,
        "forecast": {"burn_per_hour": row["burn_per_hour"], "exhausts_at": exhausts},
        "as_of": row["as_of"],
    }


async def list_counters(request: web.Request, caller: Caller) -> web.StreamResponse:
    store = request.app[STORE]
    budgets = store.budgets()
    wanted = request.query.get("budget_id")
    # a virtual key sees the counters its requests count in, whoever's budget they are of
    own = None if caller.key_record is None else _key_counters(store, caller, budgets)
    if wanted is not None and (
        wanted not in budgets
        or (own is None and not caller.sees(budget_org(budgets[wanted])))
        or (own is not None and wanted not in own.values())
    ):
        raise ApiError(404, f"no budget {wanted!r}")
    book, now = store.raise_book(), datetime.now(UTC)
    rows = []
    for verdict in await store.verdicts():
        budget = budgets.get(verdict["budget_id"])
        values = verdict["scope_values"]
        if budget is None:
            continue  # a deleted budget's counters
        if own is not None:
            if verdict["counter_key"] not in own:
                continue
        elif not caller.sees(budget_org(budget)):
            continue  # one the caller may not see
        elif caller.org_id is not None and values[:1] != [caller.org_id]:
            continue
        if wanted is not None and verdict["budget_id"] != wanted:
            continue
        row = counter_row(verdict, book, budget.alert_at, now)
        if row is not None:
            granted = book.active(budget.budget_id, tuple(values), to_micros(now))
            rows.append(counter_json(row, budget, granted))
    rows.sort(key=lambda r: (r["budget_id"], r["scope_values"]))
    return web.json_response({"counters": rows})


# --- reports ----------------------------------------------------------------------------
async def spend(request: web.Request, caller: Caller) -> web.StreamResponse:
    report = await spend_report(request.app[SPEND_QUERY], request.query, caller)
    return web.json_response(report)


# --- alerts -----------------------------------------------------------------------------
async def list_alerts(request: web.Request, caller: Caller) -> web.StreamResponse:
    store = request.app[STORE]
    query = request.query
    kind = query.get("kind")
    if kind is not None and kind not in ALERT_KINDS:
        raise ApiError(422, f"query 'kind': one of {', '.join(ALERT_KINDS)}", "kind")
    since = None if "since" not in query else parse_since(query["since"], datetime.now(UTC))
    budgets = store.budgets()
    wanted = query.get("budget_id")
    if (
        wanted is not None
        and caller.org_id is not None
        and (wanted not in budgets or not caller.sees(budget_org(budgets[wanted])))
    ):
        raise ApiError(404, f"no budget {wanted!r}")
    log = store.alert_log
    shown = []
    for alert in list(log.alerts.values()):
        if caller.org_id is not None:  # its org's budgets' counters of its org only
            budget = budgets.get(alert["budget_id"])
            if budget is None or not caller.sees(budget_org(budget)):
                continue
            if alert_scope_values(alert)[:1] != [caller.org_id]:
                continue
        if wanted is not None and alert["budget_id"] != wanted:
            continue
        if kind is not None and alert["kind"] != kind:
            continue
        if since is not None and alert["as_of"] < since:
            continue
        shown.append(alert_json(alert, log.deliveries.get(alert["alert_id"], {})))
    shown.sort(key=lambda a: (a["as_of"] or "", a["alert_id"]))
    return web.json_response({"alerts": shown})


# --- dead letters ----------------------------------------------------------------------
async def dead_letters(request: web.Request, caller: Caller) -> web.StreamResponse:
    tally = await request.app[DEAD_LETTERS].tally()
    reasons = tally.shown(caller.org_id)
    return web.json_response(
        {
            "total": sum(r["count"] for r in reasons),
            "includes_unattributed": caller.org_id is None,
            "reasons": reasons,
        }
    )


# --- audit ------------------------------------------------------------------------------
async def list_audit(request: web.Request, caller: Caller) -> web.StreamResponse:
    entries = request.app[STORE].audit()
    resource = request.query.get("resource")
    shown = [
        e
        for e in entries
        if (
            caller.role == PLATFORM_ADMIN
            or (caller.org_id is not None and e["org_id"] == caller.org_id)
        )
        and (resource is None or e["resource"] == resource)
    ]
    return web.json_response({"entries": shown})


async def _answered(
    store: AdminStore,
    caller: Caller,
    request: web.Request,
    raw: bytes,
    answer: Callable[[], Awaitable[tuple[int, dict[str, Any]]]],
) -> web.StreamResponse:
    status, body = await store.once(
        caller, request.headers.get("Idempotency-Key"), request.path, raw, answer
    )
    return web.json_response(body, status=status)

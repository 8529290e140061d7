"""The console's pages and forms. Every datum comes from the admin API's own handlers
(admin/api.py), called in process with the signed-in token's ``Caller``: the same role
checks, the same org fence (another org's budget is the API's 404, a viewer's write its
403), the same validation and audit trail. The console only turns forms into the API's
JSON and its answers into HTML."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Final, cast

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from admin import api
from admin.access import Caller
from admin.console.history import budget_history
from admin.console.html import (
    OVERSHOOT_NOTE,
    bar,
    csrf_field,
    daily_chart,
    e,
    message,
    page,
    raise_rows,
    table,
    usd,
    when,
)
from admin.console.refusals import (
    CounterId,
    Refusal,
    counter_refusals,
    refusal_reason,
    refused_today_by_key,
    refusing_now,
)
from admin.console.sessions import COOKIE, Session, SessionBook, csrf_matches
from admin.errors import ApiError
from admin.reports import MAX_LIMIT
from admin.routes import PREFIX
from admin.tokens import ORG_VIEWER
from schemas.jobs import job_key, job_key_secret

SESSIONS: Final = web.AppKey("console_sessions", SessionBook)
#: a form's request as it came, before its body was read (request storage)
_UNREAD: Final = web.RequestKey("console_unread", web.Request)
#: how many rows each "top" list shows
TOP: Final = 5
_CSS: Final = resources.files("admin.console").joinpath("static/console.css").read_bytes()


# --- sessions ---------------------------------------------------------------------------
def _signed_in(request: web.Request) -> tuple[Session, Caller] | None:
    found = request.app[SESSIONS].find(request.cookies.get(COOKIE))
    if found is None:
        return None
    session, record = found
    return session, Caller.of(record, request.remote or "")


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _html(text: str, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, content_type="text/html")
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response


def _who(caller: Caller) -> str:
    return caller.role + ("" if caller.org_id is None else f" · {caller.org_id}")


async def login_form(request: web.Request) -> web.StreamResponse:
    return _html(_login_page())


def _login_page(error: str = "") -> str:
    return page(
        "Sign in",
        (message(error) if error else "")
        + '<form method="post" action="/login"><label>Admin token '
        '<input type="password" name="token" id="token" autocomplete="off" size="60" '
        'required></label> <button type="submit" id="sign-in">Sign in</button></form>'
        "<p>A token comes from <code>spendbus admin tokens new --role ROLE [--org ORG]</code>."
        "</p>",
    )


def _cross_site(request: web.Request) -> web.Response | None:
    """A 403 for a form posted from another site (its Origin is not this server's): the
    SameSite cookie and the CSRF token stop it already, this stops a forced sign-in too."""
    origin = request.headers.get("Origin")
    if origin is None or origin == f"{request.scheme}://{request.host}":
        return None
    return _html(page("Refused", message(f"A form from {origin} is not taken here.")), 403)


async def login(request: web.Request) -> web.StreamResponse:
    refused = _cross_site(request)
    if refused is not None:
        return refused
    form = await request.post()
    token = form.get("token")
    session = request.app[SESSIONS].login(token.strip()) if isinstance(token, str) else None
    if session is None:
        return _html(_login_page("Unknown or revoked admin token."), 401)
    response = _see_other("/")
    response.set_cookie(
        COOKIE,
        session.session_id,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        path="/",
        max_age=int(request.app[SESSIONS].ttl_s),
    )
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    signed = await _form_signed_in(request)
    if isinstance(signed, web.Response):
        return signed
    request.app[SESSIONS].logout(signed[0].session_id)
    response = _see_other("/login")
    response.del_cookie(COOKIE, path="/")
    return response


async def _form_signed_in(
    request: web.Request,
) -> tuple[Session, Caller, Mapping[str, Any]] | web.Response:
    """A POST's session, caller and form, or the answer refusing it: no session, or no
    matching CSRF token (403, nothing done)."""
    refused = _cross_site(request)
    if refused is not None:
        return refused
    signed = _signed_in(request)
    if signed is None:
        return _see_other("/login")
    # the API's request is cloned from this one, which aiohttp allows before a read only
    request[_UNREAD] = request.clone()
    form = await request.post()
    csrf = form.get("csrf")
    if not csrf_matches(signed[0], csrf if isinstance(csrf, str) else None):
        return _html(page("Refused", message("Missing or wrong CSRF token: nothing done.")), 403)
    return signed[0], signed[1], form


async def stylesheet(request: web.Request) -> web.StreamResponse:
    return web.Response(body=_CSS, content_type="text/css")


# --- the API, in process ----------------------------------------------------------------
async def _api(
    request: web.Request,
    caller: Caller,
    handler: api.Handler,
    method: str,
    path: str,
    query: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
) -> tuple[int, Any]:
    """What the API answers ``caller`` for ``method path``: (status, JSON). The console's
    route names its ids as the API's does (budget_id, key_id), so the request's match
    carries them to the handler."""
    raw = b"" if body is None else json.dumps(body).encode()
    headers = CIMultiDict({"Content-Type": "application/json", "Content-Length": str(len(raw))})
    url = URL(PREFIX + path).with_query(dict(query or {}))
    unread = request.get(_UNREAD, request)
    inner = unread.clone(method=method, rel_url=url, headers=headers)
    # the form's own body was read: the API's JSON goes in the request's storage instead
    inner[api.GIVEN_BODY] = raw
    try:
        response = cast(web.Response, await handler(inner, caller))
    except ApiError as exc:
        return exc.status, {"error": exc.message}
    assert response.body is not None and isinstance(response.body, bytes)
    return response.status, json.loads(response.body)


async def _read(
    request: web.Request, caller: Caller, handler: api.Handler, path: str, **query: str
) -> Any:
    status, body = await _api(request, caller, handler, "GET", path, query)
    if status != 200:
        raise ApiError(status, body["error"])
    return body


# --- pages ------------------------------------------------------------------------------
def _month_start() -> str:
    return datetime.now(UTC).date().replace(day=1).isoformat()


async def _spend(
    request: web.Request, caller: Caller, group: str, by: str = "day"
) -> dict[str, Any] | str:
    """This month's spend by ``by`` (day or month) × ``group``, every page; the reason
    instead when there is none. A month's totals per key ask ``by="month"``: one row a
    key, where by day a month of a busy org's users is tens of thousands of rows."""
    query = {"by": by, "group": group, "from": _month_start(), "limit": str(MAX_LIMIT)}
    rows: list[dict[str, Any]] = []
    while True:
        status, body = await _api(request, caller, api.spend, "GET", "/reports/spend", query)
        if status != 200:
            return str(body["error"])
        rows += body["rows"]
        if body["next_cursor"] is None:
            return {**body, "rows": rows}
        query["cursor"] = body["next_cursor"]


def _totals(rows: list[dict[str, Any]], field: str) -> list[tuple[str, int]]:
    sums: dict[str, int] = defaultdict(int)
    for row in rows:
        sums[row[field]] += row["cost_nanos"]
    return sorted(sums.items(), key=lambda kv: -kv[1])


def _counter_label(request: web.Request, counter: dict[str, Any]) -> str:
    """A counter as people see it: its scope values, but a job's (a session budget's
    counter: org, identity, session) only by its opaque key (schemas/jobs.py)."""
    values = counter["scope_values"]
    if counter["scope"] == "session" and len(values) == 3:
        return job_key(job_key_secret(request.app[api.STORE].config.key_secret), *values)
    return "/".join(values) or "all"


def _counter_rows(
    request: web.Request,
    counters: list[dict[str, Any]],
    link: bool,
    refusals: Mapping[CounterId, Refusal],
) -> list[list[str]]:
    rows = []
    budgets = request.app[api.STORE].budgets()
    now = datetime.now(UTC)
    for c in counters:
        name = e(c["budget_id"])
        if link:
            name = f'<a href="/budgets/{e(c["budget_id"])}">{name}</a>'
        forecast = c["forecast"]["exhausts_at"]
        refusal = refusals.get((c["budget_id"], tuple(c["scope_values"])))
        refusing = refusing_now(c, refusal, budgets.get(c["budget_id"]), now)
        rows.append(
            [
                name,
                e(_counter_label(request, c)),
                bar(c["spent_nanos"], c["limit_nanos"], c["state"]),
                f'<span class="state-{e(c["state"])}">{e(c["state"])}</span>'
                + (f" ({e(c['action'])})" if c["state"] == "exceeded" else ""),
                _refusals_cell(c, refusal, refusing),
                e(when(c["reset_at"]) or "never (a total)"),
                e(f"runs out {when(forecast)}" if forecast else "lasts the period"),
                e(usd(c["raise"]["raise_nanos"]) + " raise" if c["raise"] else ""),
            ]
        )
    return rows


def _refusals_cell(counter: dict[str, Any], refusal: Refusal | None, refusing: bool) -> str:
    """Whether the gateways refuse this counter's calls now and why, and its refused calls
    of the last day: the newest one's time, key and model."""
    parts = []
    if refusing:
        parts.append(
            '<strong class="refusing">refusing:</strong> ' + e(refusal_reason(counter, refusal))
        )
    if refusal is not None:
        calls = f"{refusal.calls:,} call{'s' if refusal.calls != 1 else ''}"
        parts.append(
            e(
                f"last refused {when(refusal.last_at.isoformat())} (key {refusal.secret_id}, "
                f"{refusal.model}); {calls} refused in 24 h"
            )
        )
    return '<span class="refusals">' + "<br>".join(parts) + "</span>" if parts else ""


async def _refusals(
    request: web.Request, caller: Caller, counters: list[dict[str, Any]]
) -> tuple[dict[CounterId, Refusal], str]:
    """The counters' refusals, and a note when they cannot be read."""
    found = await counter_refusals(
        request.app[api.SPEND_QUERY],
        request.app[api.STORE].budgets(),
        counters,
        caller,
        datetime.now(UTC),
    )
    if isinstance(found, str):
        return {}, message(f"Refused calls: {found}", "note")
    return found, ""


COUNTER_HEADERS: Final = (
    "budget",
    "counter",
    "spent / limit",
    "state",
    "refusals",
    "resets",
    "forecast",
    "raise",
)


def _budget_form(csrf: str, caller: Caller) -> str:
    org_field = '<label>Org <input name="org_id" required></label>' if caller.org_id is None else ""
    prefix = "" if caller.org_id is None else f"{caller.org_id}."
    return (
        '<details id="new-budget"><summary>New budget</summary>'
        '<form method="post" action="/budgets"><fieldset>'
        f'{csrf_field(csrf)}<p class="note">{e(OVERSHOOT_NOTE)}</p>'
        f'<label>Id <input name="id" value="{e(prefix)}" required></label>{org_field}'
        '<label>Scope <select name="scope"><option>org</option><option>project</option>'
        "<option>secret</option><option>user</option></select></label>"
        '<label>Window <select name="window"><option>day</option><option>week</option>'
        "<option selected>month</option><option>total</option></select></label>"
        '<label>Limit USD <input name="limit_usd" inputmode="decimal" required></label>'
        '<label>Action <select name="action"><option>enforce</option><option>alert</option>'
        "</select></label>"
        '<button type="submit" id="create-budget">Create</button></fieldset></form></details>'
    )


def _raise_form(csrf: str, budget_id: str | None, budget_ids: list[str]) -> str:
    if budget_id is None:
        options = "".join(f"<option>{e(b)}</option>" for b in budget_ids)
        which = f'<label>Budget <select name="budget_id">{options}</select></label>'
    else:
        which = f'<input type="hidden" name="budget_id" value="{e(budget_id)}">'
    return (
        '<details id="raise"><summary>Raise a limit for a while</summary>'
        f'<form method="post" action="/raises"><fieldset>{csrf_field(csrf)}{which}'
        '<label>Counter (ORG or ORG/ID, empty: every one) <input name="scope"></label>'
        '<label>By USD <input name="by_usd" inputmode="decimal" required></label>'
        '<label>Until (2h, 2d or an ISO time) <input name="until" value="2h" required></label>'
        '<label>Reason <input name="reason" required></label>'
        '<button type="submit" id="create-raise">Raise</button></fieldset></form></details>'
    )


async def overview(request: web.Request) -> web.StreamResponse:
    signed = _signed_in(request)
    if signed is None:
        return _see_other("/login")
    session, caller = signed
    parts = [message(request.query["done"], "ok")] if "done" in request.query else []
    by_org = await _spend(request, caller, "org")
    if isinstance(by_org, str):
        parts.append(message(f"Spend reports: {by_org}", "note"))
    else:
        today = datetime.now(UTC).date().isoformat()
        today_rows = [r for r in by_org["rows"] if r["period"] == today]
        month = _totals(by_org["rows"], "org_id")
        day = dict(_totals(today_rows, "org_id"))
        parts.append(
            "<h2>Spend per org</h2>"
            + table(
                ("org", "today", "this month"),
                ([e(org), e(usd(day.get(org, 0))), e(usd(cost))] for org, cost in month),
                "spend",
            )
        )
        parts.append(
            "<h2>Spend per day, this month</h2>"
            + daily_chart(sorted(_totals(by_org["rows"], "period")))
        )
        tops = []
        for group, title in (("secret", "keys (secrets)"), ("model", "models"), ("user", "users")):
            found = await _spend(request, caller, group, by="month")
            top = [] if isinstance(found, str) else _totals(found["rows"], "key")[:TOP]
            tops.append(
                f'<div class="card"><h3>Top {e(title)}</h3>'
                + table((group, "this month"), ([e(k or "—"), e(usd(v))] for k, v in top))
                + "</div>"
            )
        parts.append('<div class="cards">' + "".join(tops) + "</div>")
    budgets = (await _read(request, caller, api.list_budgets, "/budgets"))["budgets"]
    counters = (await _read(request, caller, api.list_counters, "/counters"))["counters"]
    counted = {c["budget_id"] for c in counters}
    refusals, note = await _refusals(request, caller, counters)
    if note:
        parts.append(note)
    rows = _counter_rows(request, counters, link=True, refusals=refusals)
    for b in budgets:
        if b["id"] not in counted:
            rows.append(
                [
                    f'<a href="/budgets/{e(b["id"])}">{e(b["id"])}</a>',
                    "",
                    e(f"nothing spent this period (limit {b.get('limit_usd') or '—'} USD)"),
                    "ok",
                    "",
                    "",
                    "",
                    "",
                ]
            )
    parts.append("<h2>Budgets</h2>" + table(COUNTER_HEADERS, rows, "budgets"))
    raises = (await _read(request, caller, api.list_raises, "/raises"))["raises"]
    if raises:
        parts.append(
            "<h2>Raises</h2>"
            + table(("budget", "counter", "by", "until", "status", "reason"), raise_rows(raises))
        )
    if caller.role != ORG_VIEWER:
        parts.append(_budget_form(session.csrf, caller))
        if budgets:
            parts.append(_raise_form(session.csrf, None, [b["id"] for b in budgets]))
    return _html(page("Overview", "".join(parts), who=_who(caller), csrf=session.csrf))


async def budget_page(request: web.Request) -> web.StreamResponse:
    signed = _signed_in(request)
    if signed is None:
        return _see_other("/login")
    session, caller = signed
    budget_id = request.match_info["budget_id"]
    status, budget = await _api(request, caller, api.get_budget, "GET", f"/budgets/{budget_id}")
    if status != 200:  # another org's budget answers the same 404 as none
        return _html(
            page("Not found", message(budget["error"]), who=_who(caller), csrf=session.csrf), status
        )
    counters = (await _read(request, caller, api.list_counters, "/counters", budget_id=budget_id))[
        "counters"
    ]
    raises = [
        r
        for r in (await _read(request, caller, api.list_raises, "/raises"))["raises"]
        if r["budget_id"] == budget_id
    ]
    parts = [message(request.query["done"], "ok")] if "done" in request.query else []
    parts.append(
        table(
            ("field", "value"),
            (
                [e(k), e(json.dumps(v) if isinstance(v, dict | list) else v)]
                for k, v in budget.items()
                if v not in (None, [], {})
            ),
            "fields",
        )
    )
    refusals, note = await _refusals(request, caller, counters)
    if note:
        parts.append(note)
    parts.append(
        "<h2>Counters, this period</h2>"
        + (
            table(
                COUNTER_HEADERS,
                _counter_rows(request, counters, link=False, refusals=refusals),
                "budgets",
            )
            if counters
            else '<p class="empty">Nothing counted this period yet.</p>'
        )
    )
    history = await budget_history(request.app[api.SPEND_QUERY], budget_id, caller)
    if isinstance(history, str):
        parts.append("<h2>History</h2>" + message(f"History: {history}", "note"))
    else:
        parts.append(
            "<h2>History per period</h2>"
            + table(
                ("period", "counter", "spent / limit", "state", "events"),
                (
                    [
                        e(h["period"]),
                        e(h["counter"]),
                        bar(h["spent_nanos"], h["limit_nanos"], h["state"]),
                        e(h["state"]),
                        e(h["events"]),
                    ]
                    for h in history
                ),
                "history",
            )
            if history
            else '<p class="empty">No history recorded.</p>'
        )
    alerts = (await _read(request, caller, api.list_alerts, "/alerts", budget_id=budget_id))[
        "alerts"
    ]
    parts.append(_alerts(request, alerts, str(budget.get("scope"))))
    parts.append(
        "<h2>Raises</h2>"
        + (
            table(("budget", "counter", "by", "until", "status", "reason"), raise_rows(raises))
            if raises
            else '<p class="empty">No raise.</p>'
        )
    )
    if caller.role != ORG_VIEWER:
        parts.append(
            '<details id="edit-budget"><summary>Edit</summary>'
            f'<form method="post" action="/budgets/{e(budget_id)}/edit"><fieldset>'
            f'{csrf_field(session.csrf)}<p class="note">{e(OVERSHOOT_NOTE)}</p>'
            f'<label>Limit USD <input name="limit_usd" value="{e(budget.get("limit_usd"))}" '
            'required></label><label>Action <select name="action">'
            + "".join(
                f"<option{' selected' if budget.get('action') == a else ''}>{a}</option>"
                for a in ("enforce", "alert")
            )
            + '</select></label><button type="submit" id="save-budget">Save</button>'
            "</fieldset></form></details>"
        )
        parts.append(_raise_form(session.csrf, budget_id, []))
    return _html(page(f"Budget {budget_id}", "".join(parts), who=_who(caller), csrf=session.csrf))


def _alert_what(alert: dict[str, Any]) -> str:
    if alert["kind"] == "threshold":
        return f"{alert['threshold'] * 100:g} % of the limit reached"
    if alert["kind"] == "forecast":
        return f"forecast: runs out {when(alert['exhausts_at'])}"
    return f"no price for model {alert['model']}: its calls are charged $0 until priced"


def _delivery(d: dict[str, Any]) -> str:
    attempts = f"{d['attempts']} attempt{'s' if d['attempts'] != 1 else ''}"
    http = "" if d["http_status"] is None else f", HTTP {d['http_status']}"
    error = f": {d['error']}" if d["error"] and d["status"] != "delivered" else ""
    return (
        f'<span class="delivery-{e(d["status"])}">{e(d["webhook"])} {e(d["status"])}</span>'
        f" {e(f'({attempts}{http}){error}')} {e(when(d['finished_at']))}"
    )


def _alerts(request: web.Request, alerts: list[dict[str, Any]], scope: str) -> str:
    """A budget's alerts per counter and period, newest period first, each with what
    became of its webhook deliveries (``spendbus notify``)."""
    if not alerts:
        return '<h2>Alerts</h2><p class="empty">No alert sent for this budget.</p>'
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for alert in alerts:
        label = _counter_label(request, {"scope": scope, "scope_values": alert["scope_values"]})
        groups[(label, alert["period"])].append(alert)
    parts = ["<h2>Alerts and their deliveries</h2>"]
    for (label, period), found in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1])):
        parts.append(
            f'<h3 class="alert-group">{e(label)} · {e(period)}</h3>'
            + table(
                ("sent", "what", "spent then", "deliveries"),
                (
                    [
                        e(when(a["as_of"])),
                        e(_alert_what(a)),
                        bar(a["spent_nanos"], a["limit_nanos"], a["state"]),
                        "<br>".join(_delivery(d) for d in a["deliveries"])
                        or '<span class="empty">none finished yet</span>',
                    ]
                    for a in sorted(found, key=lambda a: a["as_of"] or "")
                ),
                "alerts",
            )
        )
    return "".join(parts)


async def keys_page(request: web.Request) -> web.StreamResponse:
    signed = _signed_in(request)
    if signed is None:
        return _see_other("/login")
    session, caller = signed
    keys = (await _read(request, caller, api.list_keys, "/keys"))["keys"]
    spend = await _spend(request, caller, "secret", by="month")
    spent = {} if isinstance(spend, str) else dict(_totals(spend["rows"], "key"))
    refused = await refused_today_by_key(request.app[api.SPEND_QUERY], caller, datetime.now(UTC))
    rows = []
    for k in keys:
        action = ""
        if caller.role != ORG_VIEWER:
            action = (
                f'<form method="post" action="/keys/{e(k["key_id"])}/revoke" class="inline">'
                f'{csrf_field(session.csrf)}<button type="submit" class="revoke" '
                f'id="revoke-{e(k["key_id"][:8])}">Revoke</button>'
                "</form>"
            )
        rows.append(
            [
                e(k["name"]),
                f"<code>{e(k['key_id'][:8])}…</code>",
                e(k["org_id"]),
                e(k["secret_id"]),
                e(k["project_id"] or ""),
                e(k["user_id"] or ""),
                e(usd(spent.get(k["secret_id"], 0))),
                ""
                if isinstance(refused, str)
                else _refused_today(refused.get((k["org_id"], k["secret_id"]), 0)),
                action,
            ]
        )
    parts = [message(request.query["done"], "ok")] if "done" in request.query else []
    if isinstance(spend, str):
        parts.append(message(f"Spend reports: {spend}", "note"))
    if isinstance(refused, str):
        parts.append(message(f"Refused calls: {refused}", "note"))
    parts.append(
        table(
            (
                "name",
                "key id",
                "org",
                "secret",
                "project",
                "user",
                "its secret's spend this month",
                "its secret's refused calls today (UTC)",
                "",
            ),
            rows,
            "keys",
        )
    )
    parts.append(
        _dead_letters(await _read(request, caller, api.dead_letters, "/dead-letters"), caller)
    )
    return _html(page("Keys", "".join(parts), who=_who(caller), csrf=session.csrf))


def _refused_today(calls: int) -> str:
    if not calls:
        return "0"
    return f'<strong class="refusing">{calls:,} refused</strong>'


def _dead_letters(found: dict[str, Any], caller: Caller) -> str:
    """The dead-letter count and its reasons: usage the pipeline could not read or price,
    so charged nowhere until fixed and requeued (``spendbus dlq``)."""
    scope = (
        "every letter"
        if found["includes_unattributed"]
        else f"the letters of org {caller.org_id}'s own events: a letter whose bytes do not "
        "read names no org and is shown to a platform admin only"
    )
    head = (
        f'<h2>Dead letters: <span id="dead-letter-count">{found["total"]:,}</span></h2>'
        f'<p class="note">Usage the pipeline could not read or price, so not charged to any '
        f"budget until fixed and requeued (<code>spendbus dlq list</code>, "
        f"<code>spendbus dlq requeue</code>). Shown: {e(scope)}.</p>"
    )
    if not found["reasons"]:
        return head + '<p class="empty">No dead letter.</p>'
    return head + table(
        ("reason", "letters", "stage", "newest", "its detail"),
        (
            [
                f"<code>{e(r['reason'])}</code>",
                e(f"{r['count']:,}"),
                e(", ".join(r["stages"])),
                e(when(r["last_failed_at"])),
                e(r["last_detail"]),
            ]
            for r in found["reasons"]
        ),
        "dead-letters",
    )


async def jobs_page(request: web.Request) -> web.StreamResponse:
    """Jobs (seed 001): session budgets' counters by their opaque key, as ``spendbus
    jobs`` lists them, with their count against the ceiling."""
    signed = _signed_in(request)
    if signed is None:
        return _see_other("/login")
    session, caller = signed
    counters = (await _read(request, caller, api.list_counters, "/counters"))["counters"]
    jobs = sorted(
        (
            (_counter_label(request, c), c)
            for c in counters
            if c["scope"] == "session" and len(c["scope_values"]) == 3
        ),
        key=lambda job: (job[1]["budget_id"], job[0]),
    )
    rows = [
        [
            f"<code>{e(key)}</code>",
            f'<a href="/budgets/{e(c["budget_id"])}">{e(c["budget_id"])}</a>',
            e(f"{c['spent_requests']:,} of {c['limit_requests']:,}")
            if c["limit_requests"]
            else e(f"{c['spent_requests']:,}"),
            bar(c["spent_nanos"], c["limit_nanos"], c["state"]),
            f'<span class="state-{e(c["state"])}">{e(c["state"])}</span>',
        ]
        for key, c in jobs
    ]
    body = (
        table(("job", "budget", "requests / ceiling", "spent / limit", "state"), rows, "jobs")
        if rows
        else '<p class="empty">No job counted this period.</p>'
    )
    return _html(page("Jobs", body, who=_who(caller), csrf=session.csrf))


# --- actions ----------------------------------------------------------------------------
def _field(form: Mapping[str, Any], name: str) -> str | None:
    value = form.get(name)
    return value.strip() or None if isinstance(value, str) else None


def _fields(form: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The form's non-blank ``names``, stripped: an API body (a blank field is left out)."""
    return {name: value for name in names if (value := _field(form, name)) is not None}


async def _acted(
    request: web.Request,
    caller: Caller,
    session: Session,
    status: int,
    answer: Any,
    done: str,
    location: str,
) -> web.StreamResponse:
    if status < 300:
        return _see_other(str(URL(location).with_query(done=done)))
    return _html(
        page(
            "Refused",
            message(f"{status}: {answer['error']}") + '<p><a href="/">Back to the overview</a></p>',
            who=_who(caller),
            csrf=session.csrf,
        ),
        status,
    )


async def create_budget(request: web.Request) -> web.StreamResponse:
    signed = await _form_signed_in(request)
    if isinstance(signed, web.Response):
        return signed
    session, caller, form = signed
    body = _fields(form, "id", "scope", "window", "limit_usd", "action")
    org = _field(form, "org_id")
    if org is not None:
        body["match"] = {"org_id": org}
    status, answer = await _api(request, caller, api.create_budget, "POST", "/budgets", body=body)
    return await _acted(
        request,
        caller,
        session,
        status,
        answer,
        f"budget {body.get('id')} created",
        f"/budgets/{body.get('id')}",
    )


async def edit_budget(request: web.Request) -> web.StreamResponse:
    signed = await _form_signed_in(request)
    if isinstance(signed, web.Response):
        return signed
    session, caller, form = signed
    budget_id = request.match_info["budget_id"]
    patch = _fields(form, "limit_usd", "action")
    status, answer = await _api(
        request, caller, api.patch_budget, "PATCH", f"/budgets/{budget_id}", body=patch
    )
    return await _acted(
        request,
        caller,
        session,
        status,
        answer,
        f"budget {budget_id} saved",
        f"/budgets/{budget_id}",
    )


async def create_raise(request: web.Request) -> web.StreamResponse:
    signed = await _form_signed_in(request)
    if isinstance(signed, web.Response):
        return signed
    session, caller, form = signed
    body = _fields(form, "budget_id", "scope", "by_usd", "until", "reason")
    status, answer = await _api(request, caller, api.create_raise, "POST", "/raises", body=body)
    return await _acted(
        request,
        caller,
        session,
        status,
        answer,
        f"raise {answer.get('raise_id')} granted",
        f"/budgets/{body.get('budget_id')}",
    )


async def revoke_key(request: web.Request) -> web.StreamResponse:
    signed = await _form_signed_in(request)
    if isinstance(signed, web.Response):
        return signed
    session, caller, _ = signed
    key_id = request.match_info["key_id"]
    status, answer = await _api(request, caller, api.revoke_key, "DELETE", f"/keys/{key_id}")
    return await _acted(
        request, caller, session, status, answer, f"key {key_id[:8]}… revoked", "/keys"
    )


def mount_console(app: web.Application) -> None:
    """The console's routes at ``/`` of the admin app (its token book signs sessions in)."""
    app[SESSIONS] = SessionBook(app[api.TOKENS])
    app.router.add_get("/", overview)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/keys", keys_page)
    app.router.add_get("/jobs", jobs_page)
    app.router.add_post("/keys/{key_id}/revoke", revoke_key)
    app.router.add_post("/budgets", create_budget)
    app.router.add_get("/budgets/{budget_id}", budget_page)
    app.router.add_post("/budgets/{budget_id}/edit", edit_budget)
    app.router.add_post("/raises", create_raise)
    app.router.add_get("/static/console.css", stylesheet)

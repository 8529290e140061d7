"""Who may do what through the admin API, on a real broker: every role × resource × verb,
across two orgs and a budget of none; seed 000's codes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from admin.routes import PREFIX, ROUTES
from schemas.budgets import parse_budget
from schemas.codec import ALERT, VERDICT
from schemas.ids import counter_key
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import AdminServer, admin_server, budget, dead_letter
from tests.gateway.kit import exhausted_verdict

pytestmark = pytest.mark.integration

ROLES = ("platform-admin", "org-admin", "org-viewer")
OWNERS = ("acme", "globex", None)  # the caller's org is acme; None: a budget of no org


async def seed(server: AdminServer, platform: str, tag: str) -> dict[str | None, dict[str, str]]:
    """For each owner: a budget, a key and a raise of it (made by the platform admin)."""
    made: dict[str | None, dict[str, str]] = {}
    for owner in OWNERS:
        budget_id = f"{owner or 'all'}.{tag}"
        status, _ = await server.call(
            "POST", "/v1/admin/budgets", platform, budget(budget_id, owner)
        )
        assert status == 201
        status, granted = await server.call(
            "POST",
            "/v1/admin/raises",
            platform,
            {"budget_id": budget_id, "by_usd": "5", "until": "1d", "reason": "launch"},
        )
        assert status == 201, granted
        ids = {"budget": budget_id, "raise": granted["raise_id"]}
        if owner is not None:
            status, key = await server.call(
                "POST",
                "/v1/admin/keys",
                platform,
                {"name": f"{owner}.{tag}", "org_id": owner, "secret_id": "sk-openai"},
            )
            assert status == 201, key
            ids["key"] = key["key_id"]
        made[owner] = ids
    await seed_alerts(server, platform, made)
    return made


async def seed_alerts(
    server: AdminServer, platform: str, made: dict[str | None, dict[str, str]]
) -> None:
    """An alert of each owner's budget (the one of no org counting acme), on the shared
    alert topic; returns once the server's view holds them."""
    records = []
    for owner, ids in made.items():
        key = counter_key(ids["budget"], [owner or "acme"])
        ids["alert"] = f"{key}|2026-12|0.8"
        value = {
            "alert_id": ids["alert"],
            "kind": "threshold",
            "counter_key": key,
            "budget_id": ids["budget"],
            "period": "2026-12",
            "threshold": 0.8,
            "state": "alert",
            "spent_nanos": 40 * 10**9,
            "spent_tokens": 0,
            "spent_requests": 1,
            "limit_nanos": 50 * 10**9,
            "limit_tokens": None,
            "limit_requests": None,
            "model": None,
            "as_of": datetime.now(UTC),
            "exhausts_at": None,
        }
        records.append((key.encode(), ALERT.encode(value)))
    await publish(server.store.config.bootstrap, server.store.config.topics.shared_alerts, records)
    wanted = {ids["alert"] for ids in made.values()}
    async with asyncio.timeout(30):
        while not wanted <= set(server.store.alert_log.alerts):
            await asyncio.sleep(0.05)


def expected(role: str, owner: str | None, writes: bool) -> str:
    """'ok', 'hidden' (404) or 'forbidden' (403)."""
    if role == "platform-admin":
        return "ok"
    if writes and role == "org-viewer":
        return "forbidden"
    return "ok" if owner == "acme" else "hidden"


async def test_every_role_resource_and_verb_is_fenced_by_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        platform = server.token("platform-admin")
        callers = {
            "platform-admin": platform,
            "org-admin": server.token("org-admin", "acme"),
            "org-viewer": server.token("org-viewer", "acme"),
        }
        wrong: list[str] = []
        # a dead letter of each owner's event (None: bytes that name no org), each its reason
        letter_reason = {"acme": "unknown_fingerprint", "globex": "wrong_key", None: "bad_magic"}
        await publish(
            kafka_bootstrap,
            topics.usage_dlq,
            [(b"k", dead_letter(topics, o, reason)) for o, reason in letter_reason.items()],
        )

        def check(role: str, owner: str | None, what: str, status: int, ok: set[int]) -> None:
            want = expected(role, owner, writes=what.split()[0] not in ("GET",))
            codes = {"ok": ok, "hidden": {404}, "forbidden": {403}}[want]
            if status not in codes:
                wrong.append(f"{role} on {owner or 'no-org'}: {what} -> {status}, want {want}")

        for role, token in callers.items():
            made = await seed(server, platform, role)
            # lists show exactly what the caller may see
            status, listed = await server.call("GET", "/v1/admin/budgets", token)
            shown = {b["id"] for b in listed["budgets"]}
            for owner, ids in made.items():
                if (ids["budget"] in shown) != (expected(role, owner, False) == "ok"):
                    wrong.append(
                        f"{role}: budget list shows {ids['budget']}: {ids['budget'] in shown}"
                    )
            status, listed = await server.call("GET", "/v1/admin/keys", token)
            shown = {k["key_id"] for k in listed["keys"]}
            for owner, ids in made.items():
                if "key" in ids and (ids["key"] in shown) != (expected(role, owner, False) == "ok"):
                    wrong.append(f"{role}: key list shows {owner}'s key: {ids['key'] in shown}")
            status, listed = await server.call("GET", "/v1/admin/raises", token)
            shown = {r["raise_id"] for r in listed["raises"]}
            for owner, ids in made.items():
                if (ids["raise"] in shown) != (expected(role, owner, False) == "ok"):
                    wrong.append(
                        f"{role}: raise list shows {owner}'s raise: {ids['raise'] in shown}"
                    )

            status, listed = await server.call("GET", "/v1/admin/alerts", token)
            shown = {a["alert_id"] for a in listed["alerts"]}
            for owner, ids in made.items():
                if (ids["alert"] in shown) != (expected(role, owner, False) == "ok"):
                    wrong.append(
                        f"{role}: alert list shows {owner}'s alert: {ids['alert'] in shown}"
                    )

            status, letters = await server.call("GET", "/v1/admin/dead-letters", token)
            shown = {r["reason"] for r in letters["reasons"]}
            for owner, reason in letter_reason.items():
                if (reason in shown) != (expected(role, owner, False) == "ok"):
                    wrong.append(f"{role}: dead letters show {owner}'s: {reason in shown}")
            if letters["total"] != len(shown):
                wrong.append(f"{role}: dead letters total {letters['total']} of {shown}")

            for owner, ids in made.items():
                b, r = ids["budget"], ids["raise"]
                calls: list[tuple[str, str, Any, set[int]]] = [
                    ("GET", f"/v1/admin/budgets/{b}", None, {200}),
                    ("PATCH", f"/v1/admin/budgets/{b}", {"limit_usd": "60"}, {200}),
                    ("PUT", f"/v1/admin/budgets/{b}", budget(b, owner, limit_usd="70"), {200}),
                    ("GET", f"/v1/admin/raises/{r}", None, {200}),
                    ("GET", f"/v1/admin/alerts?budget_id={b}", None, {200}),
                    ("GET", f"/v1/admin/counters?budget_id={b}", None, {200}),
                    ("POST", f"/v1/admin/raises/{r}/revoke", None, {200}),
                ]
                if "key" in ids:
                    k = ids["key"]
                    calls += [
                        ("GET", f"/v1/admin/keys/{k}", None, {200}),
                        ("POST", f"/v1/admin/keys/{k}/rotate", None, {201}),
                    ]
                for method, path, body, ok in calls:
                    status, answer = await server.call(method, path, token, body)
                    check(role, owner, f"{method} {path}", status, ok)
                    if status == 201 and path.endswith("/rotate"):
                        ids["key"] = answer["key_id"]  # the old one is revoked
                # the destructive verbs last
                if "key" in ids:
                    status, _ = await server.call("DELETE", f"/v1/admin/keys/{ids['key']}", token)
                    check(role, owner, "DELETE key", status, {200})
                status, _ = await server.call("DELETE", f"/v1/admin/budgets/{b}", token)
                check(role, owner, "DELETE budget", status, {200})

            # creating: in the caller's org, in another, in none
            for owner in OWNERS:
                name = f"{owner or 'all'}.new-{role}"
                status, _ = await server.call(
                    "POST", "/v1/admin/budgets", token, budget(name, owner)
                )
                want = {
                    "platform-admin": 201,
                    "org-viewer": 403,
                    # another org's: 403; of none: made its own org's, but named outside it
                    "org-admin": {"acme": 201, "globex": 403, None: 422}[owner],
                }[role]
                if status != want:
                    wrong.append(f"{role}: create budget of {owner}: {status}, want {want}")
                status, _ = await server.call(
                    "POST",
                    "/v1/admin/keys",
                    token,
                    {"name": name, "org_id": owner or "acme", "secret_id": "sk-openai"}
                    if owner
                    else {"name": name, "secret_id": "sk-openai"},
                )
                want = {
                    ("platform-admin", None): 422,  # a platform key must name its org
                    ("org-admin", "globex"): 403,
                    ("org-admin", None): 422,  # its own org, but named outside it
                }.get((role, owner), 201 if role != "org-viewer" else 403)
                if role == "org-viewer":
                    want = 403
                if status != want:
                    wrong.append(f"{role}: create key of {owner}: {status}, want {want}")
        assert not wrong, "\n".join(wrong)


async def test_seed_000_codes_and_no_token_no_answer(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        acme = server.token("org-admin", "acme")
        globex = server.token("org-admin", "globex")
        viewer = server.token("org-viewer", "acme")
        assert (await server.call("POST", "/v1/admin/budgets", acme, budget("acme.m")))[0] == 201
        status, body = await server.call("POST", "/v1/admin/budgets", acme, budget("acme.m"))
        assert (status, body["error"]) == (409, "budget 'acme.m' exists (PUT replaces it)")
        for cap in ("0", "-5", 0):
            status, body = await server.call(
                "POST", "/v1/admin/budgets", acme, budget("acme.zero", limit_usd=cap)
            )
            assert (status, body["field"]) == (422, "limit_usd"), body
        status, key = await server.call(
            "POST", "/v1/admin/keys", acme, {"name": "acme.ci", "secret_id": "sk-openai"}
        )
        assert status == 201 and key["org_id"] == "acme" and key["key"].startswith("sb-")
        # another org's key: 404, the same as one that does not exist
        assert (await server.call("GET", f"/v1/admin/keys/{key['key_id']}", globex))[0] == 404
        assert (await server.call("DELETE", f"/v1/admin/keys/{key['key_id']}", globex))[0] == 404
        assert (await server.call("GET", "/v1/admin/keys/" + "0" * 64, globex))[0] == 404
        # a role that may not: 403
        status, body = await server.call("POST", "/v1/admin/budgets", viewer, budget("acme.v"))
        assert (status, body["error"]) == (403, "role org-viewer is read only")
        # a budget of another org, or named outside the caller's
        status, body = await server.call(
            "POST", "/v1/admin/budgets", acme, budget("acme.x", "globex")
        )
        assert status == 403 and body["error"].startswith("field 'match.org_id'")
        status, body = await server.call("POST", "/v1/admin/budgets", acme, budget("globex.m"))
        assert (status, body["field"]) == (422, "id")
        # no token, a malformed one, a revoked one
        assert (await server.call("GET", "/v1/admin/budgets", None))[0] == 401
        assert (await server.call("GET", "/v1/admin/budgets", "sbadm_x_y"))[0] == 401
        revoked_id = next(r.token_id for r in server.tokens.records() if r.org_id == "globex")
        server.tokens.revoke(revoked_id)
        assert (await server.call("GET", "/v1/admin/budgets", globex))[0] == 401
        # a key's secret is in the mint's answer only
        status, listed = await server.call("GET", "/v1/admin/keys", acme)
        assert "key" not in listed["keys"][0] and key["key"] not in str(listed)


async def test_a_virtual_key_reads_its_own_counters_and_nothing_else(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        platform = server.token("platform-admin")
        made = {}
        for body in (
            budget("acme.org", "acme"),  # counts every acme request: the key's too
            budget("acme.per-secret", "acme", scope="secret"),  # the key's secret's counter
            budget("acme.per-project", "acme", scope="project"),  # the key names no project
            budget("globex.org", "globex"),
            budget("all.per-org"),  # a budget of no org: its acme counter is the key's
        ):
            status, made[body["id"]] = await server.call(
                "POST", "/v1/admin/budgets", platform, body
            )
            assert status == 201
        status, minted = await server.call(
            "POST",
            "/v1/admin/keys",
            platform,
            {"name": "acme.ci", "org_id": "acme", "secret_id": "sk-openai"},
        )
        assert status == 201
        key = minted["key"]
        counters = [
            ("acme.org", ("acme",)),
            ("acme.per-secret", ("acme", "sk-openai")),
            ("acme.per-secret", ("acme", "sk-other")),
            ("acme.per-project", ("acme", "p1")),
            ("globex.org", ("globex",)),
            ("all.per-org", ("acme",)),
            ("all.per-org", ("globex",)),
        ]
        verdicts = []
        for budget_id, values in counters:
            parsed, _ = parse_budget(made[budget_id])
            assert parsed is not None
            verdict = exhausted_verdict(parsed, values)
            verdicts.append((verdict["counter_key"].encode(), VERDICT.encode(verdict)))
        await publish(kafka_bootstrap, topics.budget_verdicts, verdicts)

        status, body = await server.call("GET", "/v1/admin/counters", key)
        assert status == 200, body
        assert sorted((c["budget_id"], tuple(c["scope_values"])) for c in body["counters"]) == [
            ("acme.org", ("acme",)),
            ("acme.per-secret", ("acme", "sk-openai")),
            ("all.per-org", ("acme",)),
        ]
        status, body = await server.call("GET", "/v1/admin/counters?budget_id=acme.org", key)
        assert (status, len(body["counters"])) == (200, 1)
        for other in ("globex.org", "acme.per-project", "nope"):
            status, _ = await server.call("GET", f"/v1/admin/counters?budget_id={other}", key)
            assert status == 404, other

        # every other route: 403, whatever its verb (nothing written)
        for route in ROUTES:
            if route.keys_may_call:
                continue
            path = PREFIX + route.path.format(
                budget_id="acme.org", key_id=minted["key_id"], raise_id="r-1"
            )
            status, body = await server.call(route.method, path, key, {} if route.body else None)
            assert (status, body["error"]) == (403, "a virtual key reads its own counters only"), (
                route.method,
                path,
            )
        status, listed = await server.call("GET", "/v1/admin/budgets", platform)
        assert len(listed["budgets"]) == 5

        # a revoked key, or one no one minted, is no caller
        assert (await server.call("DELETE", f"/v1/admin/keys/{minted['key_id']}", platform))[
            0
        ] == 200
        assert (await server.call("GET", "/v1/admin/counters", key))[0] == 401
        assert (await server.call("GET", "/v1/admin/counters", "sb-" + "x" * 43))[0] == 401

"""Counters over HTTP: every live counter of a budget the caller sees, with the limits the
enforcers check (a raise included), what remains, the period, reset and forecast, read
from the verdict topic (real broker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.budgets import parse_budget
from schemas.codec import VERDICT
from schemas.periods import parse_window, period_key
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import admin_server, budget
from tests.gateway.kit import exhausted_verdict

pytestmark = pytest.mark.integration


async def test_counters_show_spend_limits_remaining_and_stay_in_their_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        platform = server.token("platform-admin")
        acme = server.token("org-viewer", "acme")
        made = {}
        for org in ("acme", "globex"):
            body = budget(f"{org}.per-project", org, scope="project", limit_usd="10")
            status, made[org] = await server.call("POST", "/v1/admin/budgets", platform, body)
            assert status == 201
        verdicts = []
        for org, project, spent in (("acme", "p1", 4), ("acme", "p2", 10), ("globex", "p1", 1)):
            parsed, _ = parse_budget(made[org])
            assert parsed is not None
            verdict = exhausted_verdict(parsed, (org, project))
            verdict.update(state="ok" if spent < 10 else "exceeded", spent_nanos=spent * 10**9)
            verdicts.append((verdict["counter_key"].encode(), VERDICT.encode(verdict)))
        await publish(kafka_bootstrap, topics.budget_verdicts, verdicts)
        status, raised = await server.call(
            "POST",
            "/v1/admin/raises",
            platform,
            {
                "budget_id": "acme.per-project",
                "scope": "acme/p2",
                "by_usd": "5",
                "until": "2h",
                "reason": "demo day",
            },
        )
        assert status == 201

        status, body = await server.call("GET", "/v1/admin/counters", acme)
        assert status == 200
        rows = {tuple(c["scope_values"]): c for c in body["counters"]}
        assert set(rows) == {("acme", "p1"), ("acme", "p2")}  # never globex's
        p1, p2 = rows[("acme", "p1")], rows[("acme", "p2")]
        assert (p1["spent_nanos"], p1["limit_nanos"], p1["remaining_nanos"]) == (
            4 * 10**9,
            10 * 10**9,
            6 * 10**9,
        )
        assert p1["raise"] is None
        assert p1["period"] == period_key(parse_window("month"), datetime.now(UTC))
        # the raise lifts p2's limit: 15, 5 remaining
        assert (p2["limit_nanos"], p2["remaining_nanos"]) == (15 * 10**9, 5 * 10**9)
        assert p2["raise"]["raise_id"] == raised["raise_id"]
        assert p1["reset_at"] is not None and set(p1["forecast"]) == {
            "burn_per_hour",
            "exhausts_at",
        }
        status, one = await server.call(
            "GET", "/v1/admin/counters?budget_id=acme.per-project", acme
        )
        assert len(one["counters"]) == 2
        hidden = await server.call("GET", "/v1/admin/counters?budget_id=globex.per-project", acme)
        assert hidden[0] == 404
        status, every = await server.call("GET", "/v1/admin/counters", platform)
        assert len(every["counters"]) == 3

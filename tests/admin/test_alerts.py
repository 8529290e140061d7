"""Alerts over HTTP: the shared alert topic joined with the notifier's delivery records
(written in notify's own format), filtered and fenced by org, never showing a webhook's
URL (real broker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from notify.deliveries import Delivery, delivery_key, start_key, start_value
from schemas.codec import ALERT
from schemas.ids import counter_key
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import admin_server, budget

pytestmark = pytest.mark.integration

HOOK_URL = "https://user:pa55@hooks.example.com/T0/B0/s3cr3t-path"


def alert(budget_id: str, values: list[str], kind: str, threshold: float, at: datetime) -> Any:
    key = counter_key(budget_id, values)
    return {
        "alert_id": f"{key}|2026-12|{threshold}" if kind != "forecast" else f"forecast|{key}",
        "kind": kind,
        "counter_key": key,
        "budget_id": budget_id,
        "period": "2026-12",
        "threshold": threshold,
        "state": "alert",
        "spent_nanos": 40 * 10**9,
        "spent_tokens": 0,
        "spent_requests": 3,
        "limit_nanos": 50 * 10**9,
        "limit_tokens": None,
        "limit_requests": None,
        "model": None,
        "as_of": at,
        "exhausts_at": at + timedelta(days=2) if kind == "forecast" else None,
    }


def delivered(a: dict[str, Any], webhook: str, status: str, attempts: int, http: int) -> Any:
    record = Delivery(
        webhook=webhook,
        webhook_url="https://hooks.example.com/…",
        alert_id=a["alert_id"],
        kind=a["kind"],
        budget_id=a["budget_id"],
        status=status,
        attempts=attempts,
        http_status=http,
        error="" if status == "delivered" else f"HTTP {http}",
        finished_at=datetime.now(UTC),
        alert_offset=0,
    )
    return delivery_key(webhook, a["alert_id"]), record.encode()


async def test_alerts_carry_their_deliveries_filtered_and_fenced_by_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    acme_80 = alert("acme.spend", ["acme"], "threshold", 0.8, now - timedelta(hours=3))
    acme_fc = alert("acme.spend", ["acme"], "forecast", 0.0, now - timedelta(minutes=5))
    globex_80 = alert("globex.spend", ["globex"], "threshold", 0.8, now)
    # a budget of no org counting acme: a platform admin's, not acme's
    shared_80 = alert("all.spend", ["acme"], "threshold", 0.8, now)
    alerts = [acme_80, acme_fc, globex_80, shared_80]
    await publish(
        kafka_bootstrap,
        topics.shared_alerts,
        [(a["counter_key"].encode(), ALERT.encode(a)) for a in [*alerts, acme_80]],  # a repeat
    )
    await publish(
        kafka_bootstrap,
        topics.notify_deliveries,
        [
            (start_key("wh-slack"), start_value("wh-slack", "https://hooks.example.com/…", {})),
            delivered(acme_80, "wh-slack", "delivered", 1, 200),
            delivered(acme_80, "wh-pager", "failed", 5, 503),
            delivered(globex_80, "wh-slack", "delivered", 2, 200),
        ],
    )
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        platform = server.token("platform-admin")
        for org in ("acme", "globex", None):
            status, _ = await server.call(
                "POST", "/v1/admin/budgets", platform, budget(f"{org or 'all'}.spend", org)
            )
            assert status == 201
        acme = server.token("org-viewer", "acme")

        status, body = await server.call("GET", "/v1/admin/alerts", platform)
        assert status == 200
        assert sorted(a["alert_id"] for a in body["alerts"]) == sorted(
            a["alert_id"] for a in alerts
        )
        assert "hooks.example" not in str(body) and "pa55" not in str(body)

        status, body = await server.call("GET", "/v1/admin/alerts", acme)
        assert status == 200
        shown = {a["alert_id"]: a for a in body["alerts"]}
        assert set(shown) == {acme_80["alert_id"], acme_fc["alert_id"]}
        first = shown[acme_80["alert_id"]]
        assert first["scope_values"] == ["acme"] and first["kind"] == "threshold"
        assert [
            (d["webhook"], d["status"], d["attempts"], d["http_status"], d["error"])
            for d in first["deliveries"]
        ] == [("wh-pager", "failed", 5, 503, "HTTP 503"), ("wh-slack", "delivered", 1, 200, "")]
        assert shown[acme_fc["alert_id"]]["deliveries"] == []
        assert shown[acme_fc["alert_id"]]["exhausts_at"] is not None

        async def ids(query: str, token: str = acme) -> set[str]:
            status, body = await server.call("GET", "/v1/admin/alerts" + query, token)
            assert status == 200, body
            return {a["alert_id"] for a in body["alerts"]}

        assert await ids("?kind=forecast") == {acme_fc["alert_id"]}
        assert await ids("?since=1h") == {acme_fc["alert_id"]}
        since = (now - timedelta(hours=4)).isoformat()
        assert await ids(f"?since={since.replace('+00:00', 'Z')}") == set(shown)
        assert await ids("?budget_id=globex.spend", platform) == {globex_80["alert_id"]}
        # another org's budget, or one of no org: the 404 of one that does not exist
        for hidden in ("globex.spend", "all.spend", "nope"):
            status, _ = await server.call("GET", f"/v1/admin/alerts?budget_id={hidden}", acme)
            assert status == 404
        status, body = await server.call("GET", "/v1/admin/alerts?kind=loud", acme)
        assert (status, body["field"]) == (422, "kind")
        status, body = await server.call("GET", "/v1/admin/alerts?since=yesterday", acme)
        assert (status, body["field"]) == (422, "since")
        status, body = await server.call("GET", "/v1/admin/alerts?since=2026-12-07T10:00", acme)
        assert (status, body["field"]) == (422, "since")  # no zone

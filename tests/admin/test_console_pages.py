"""The console's pages over HTTP (no browser: what they show, not how it looks), on a real
broker: the keys page's dead letters counted per reason and fenced by org, followed live;
a budget's page its alerts per counter and period with their webhook deliveries."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from notify.deliveries import start_key, start_value
from schemas.codec import ALERT
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import AdminServer, admin_server, budget, dead_letter
from tests.admin.test_alerts import alert, delivered

pytestmark = pytest.mark.integration


async def page_of(server: AdminServer, token: str, path: str) -> str:
    """``path`` as a browser signed in with ``token`` gets it (the session's cookie)."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.post(server.url + "/login", data={"token": token}) as signed:
            assert signed.status == 200 and signed.url.path == "/", signed.status
        async with session.get(server.url + path) as answer:
            assert answer.status == 200, answer.status
            return await answer.text()


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


async def test_the_keys_page_counts_dead_letters_by_reason_fenced_by_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    letters = [
        dead_letter(topics, "acme", "unknown_fingerprint", "written by a newer producer"),
        # an event's org as a producer wrote it, not canonical: still acme's
        dead_letter(topics, " acme ", "unknown_fingerprint", "written by a newer producer"),
        dead_letter(topics, "globex", "wrong_key", "globex's event keyed otherwise"),
        dead_letter(topics, None, "bad_magic", "not a spendbus record"),
    ]
    await publish(kafka_bootstrap, topics.usage_dlq, [(b"k", v) for v in letters])
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        acme = server.token("org-viewer", "acme")
        shown = text_of(await page_of(server, acme, "/keys"))
        assert "Dead letters: 2" in shown, shown
        assert "unknown_fingerprint 2 aggregator" in shown and "newer producer" in shown
        assert "wrong_key" not in shown and "bad_magic" not in shown and "globex" not in shown
        assert "shown to a platform admin only" in shown

        platform = server.token("platform-admin")
        shown = text_of(await page_of(server, platform, "/keys"))
        assert "Dead letters: 4" in shown and "Shown: every letter" in shown
        for reason in ("unknown_fingerprint 2", "wrong_key 1", "bad_magic 1"):
            assert reason in shown, reason

        # followed live: a letter written now is counted on the next page
        await publish(
            kafka_bootstrap, topics.usage_dlq, [(b"acme", dead_letter(topics, "acme", "future"))]
        )
        async with asyncio.timeout(30):
            while "Dead letters: 3" not in (shown := text_of(await page_of(server, acme, "/keys"))):
                await asyncio.sleep(0.2)
        assert "future 1" in shown


async def test_a_budget_page_shows_its_alerts_per_counter_and_period_with_deliveries(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    acme_80 = alert("acme.spend", ["acme"], "threshold", 0.8, now - timedelta(hours=3))
    acme_fc = alert("acme.spend", ["acme"], "forecast", 0.0, now - timedelta(minutes=5))
    acme_may = {**alert("acme.spend", ["acme"], "threshold", 0.5, now), "period": "2026-05"}
    acme_may["alert_id"] += "|may"
    globex_80 = alert("globex.spend", ["globex"], "threshold", 0.8, now)
    alerts = [acme_80, acme_fc, acme_may, globex_80]
    await publish(
        kafka_bootstrap,
        topics.shared_alerts,
        [(a["counter_key"].encode(), ALERT.encode(a)) for a in alerts],
    )
    await publish(
        kafka_bootstrap,
        topics.notify_deliveries,
        [
            (start_key("wh-slack"), start_value("wh-slack", "https://hooks.example.com/…", {})),
            delivered(acme_80, "wh-slack", "delivered", 1, 200),
            delivered(acme_80, "wh-pager", "failed", 5, 503),
        ],
    )
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        platform = server.token("platform-admin")
        for org in ("acme", "globex"):
            status, _ = await server.call(
                "POST", "/v1/admin/budgets", platform, budget(f"{org}.spend", org)
            )
            assert status == 201
        async with asyncio.timeout(30):
            while len(server.store.alert_log.alerts) < len(alerts):
                await asyncio.sleep(0.05)
        html = await page_of(server, server.token("org-admin", "acme"), "/budgets/acme.spend")
        groups = [text_of(g) for g in re.findall(r'<h3 class="alert-group">(.*?)</h3>', html)]
        assert groups == ["acme · 2026-05", "acme · 2026-12"], groups
        shown = text_of(html)
        december = shown[shown.index("acme · 2026-12") :]
        assert "80 % of the limit reached" in december and "forecast: runs out" in december
        assert "wh-pager failed (5 attempts, HTTP 503): HTTP 503" in december
        assert "wh-slack delivered (1 attempt, HTTP 200)" in december
        assert "none finished yet" in december  # the forecast's
        may = shown[shown.index("acme · 2026-05") : shown.index("acme · 2026-12")]
        assert "50 % of the limit reached" in may
        assert "hooks.example" not in html and "globex" not in html

"""The console's pages over HTTP (no browser: what they show, not how it looks), on a real
broker: the keys page's dead letters counted per reason and fenced by org, followed live;
a budget's page its alerts per counter and period with their webhook deliveries; a counter
still under its limit that the gateways refuse, said so with why, from the refused usage
events in the real embedded ClickHouse, fenced by org."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest

from aggregator import apply_schema, open_client
from notify.deliveries import start_key, start_value
from schemas.budgets import parse_budget
from schemas.codec import ALERT, VERDICT
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import AdminServer, admin_server, budget, dead_letter
from tests.admin.test_alerts import alert, delivered
from tests.admin.test_reports import query_of
from tests.gateway.kit import exhausted_verdict

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
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


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


#: when acme's key was refused in the last day (the fixture writes them)
ACME_REFUSALS_AGO: Final = (timedelta(minutes=1), timedelta(minutes=2), timedelta(hours=3))


def refused(
    client: Any, offset: int, org: str, secret: str, budget_id: str, ago: timedelta
) -> datetime:
    """A refused call's usage event as the gateway publishes it and the aggregator writes
    it: no tokens, no cost, the refusing budget named; when it happened."""
    moment = datetime.now(UTC) - ago
    client.command(
        "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
        "org_id, tags, input_tokens, output_tokens, usage_source, outcome, decision, "
        "decision_budget_id, status_code, cost_nanos, source_partition, source_offset, "
        f"priced_at) VALUES ('r{offset}', '{moment:%Y-%m-%d %H:%M:%S.%f}', 'openai', "
        f"'openai-chat', 'gpt-4o', '{secret}', '{org}', map(), 0, 0, 'none', 'refused', "
        f"'budget_exceeded', '{budget_id}', 402, 0, 0, {offset}, now64())"
    )
    return moment


@pytest.fixture
def refusals_store(clickhouse_dsn: str) -> Iterator[tuple[Any, list[datetime]]]:
    """acme's key refused three times in the last hours, once two days ago (past the
    pages' look-back); globex's key refused once. The client, and when acme's recent
    refusals happened."""
    client = open_client(clickhouse_dsn)
    apply_schema(client)
    moments = [
        refused(client, offset, "acme", "sk-acme-web", "acme.spend", ago)
        for offset, ago in enumerate(ACME_REFUSALS_AGO)
    ]
    refused(client, 3, "acme", "sk-acme-web", "acme.spend", timedelta(days=2))
    refused(client, 4, "globex", "sk-globex-web", "globex.spend", timedelta(minutes=1))
    yield client, moments
    client.close()


async def test_a_counter_under_its_limit_that_refuses_says_so_and_why_fenced_by_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, refusals_store: tuple[Any, list[datetime]]
) -> None:
    store, acme_moments = refusals_store
    async with admin_server(
        kafka_bootstrap, topics, tmp_path, spend_query=query_of(store)
    ) as server:
        platform = server.token("platform-admin")
        verdicts = []
        for org in ("acme", "globex"):
            made = budget(f"{org}.spend", org)
            assert (await server.call("POST", "/v1/admin/budgets", platform, made))[0] == 201
            status, _ = await server.call(
                "POST",
                "/v1/admin/keys",
                platform,
                {"name": f"{org}.web", "org_id": org, "secret_id": f"sk-{org}-web"},
            )
            assert status == 201
            parsed, errors = parse_budget(made)
            assert parsed is not None, errors
            # 99 % of the $50 spent: the counter is "ok", yet a call's estimate no longer fits
            verdict = exhausted_verdict(parsed, (org,))
            verdict.update(spent_nanos=49_500_000_000, state="ok")
            verdicts.append((verdict["counter_key"].encode(), VERDICT.encode(verdict)))
        await publish(kafka_bootstrap, topics.budget_verdicts, verdicts)
        async with asyncio.timeout(30):
            while (
                len((await server.call("GET", "/v1/admin/counters", platform))[1]["counters"]) < 2
            ):
                await asyncio.sleep(0.05)

        acme = server.token("org-admin", "acme")
        for path in ("/", "/budgets/acme.spend"):
            html = await page_of(server, acme, path)
            (counters,) = re.findall(r'<table class="budgets">.*?</table>', html)
            (row,) = [text_of(r) for r in re.findall(r"<tbody>(.*?)</tbody>", counters)]
            assert "ok" in row and "(99 %)" in row, row
            assert "refusing: a call's worst-case estimate does not fit the $0.5000 left" in row, (
                row
            )
            # the older refusal is past the look-back: three calls, the newest one's key
            assert "(key sk-acme-web, gpt-4o); 3 calls refused in 24 h" in row, row
            assert "globex" not in html and "sk-globex-web" not in html, path

        # "today" is the UTC day the page was made in: a run just after midnight sees
        # only the refusals since then (asked again if the day turned during the request)
        while True:
            asked = datetime.now(UTC)
            shown = text_of(await page_of(server, acme, "/keys"))
            if datetime.now(UTC).date() == asked.date():
                break
        midnight = asked.replace(hour=0, minute=0, second=0, microsecond=0)
        today = sum(1 for moment in acme_moments if moment >= midnight)
        assert "acme.web" in shown, shown
        assert (f"{today} refused" in shown) if today else (" refused Revoke" not in shown), shown

        shown = text_of(await page_of(server, platform, "/"))
        assert "sk-globex-web, gpt-4o); 1 call refused in 24 h" in shown, shown
        assert shown.count("refusing:") == 2, shown

"""The console's pages over HTTP (no browser: what they show, not how it looks), on a real
broker: the keys page's dead letters counted per reason and fenced by org, followed live."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import AdminServer, admin_server, dead_letter

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
        dead_letter(topics, "acme", "unknown_fingerprint", "written by a newer producer"),
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

"""`spendbus demo` serves the spend console once its checks pass (until Ctrl-C on a
terminal, `--hold` seconds off one, else not), printing its address and a login; it ends
with the console's address, and with ``--keep`` (its stack left running) the command
serving it over that stack and a login made for it."""

from __future__ import annotations

import asyncio
import math
import re
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from schemas.budgets import parse_budget
from schemas.codec import BUDGET_POLICY, VERDICT
from schemas.topics import Topics
from spendbus.commands.admin_api import token_book
from spendbus.demo import console_login
from spendbus.demo_console import TERMINAL_HOLD_S, console_served, hold_seconds, served_lines
from spendbus.settings import Settings
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from tests.gateway.kit import exhausted_verdict


def test_the_demo_prints_the_console_and_with_keep_a_login_for_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "demo", topic_prefix="demo-ab12.", web_port=8123)
    stopped = console_login(settings, "127.0.0.1:9092", keep=False)
    assert len(stopped) == 1 and "http://127.0.0.1:6070/" in stopped[0]
    assert "sbadm_" not in stopped[0] and not (tmp_path / "demo").exists()

    kept = console_login(settings, "127.0.0.1:9092", keep=True)
    serve, login = kept[0], kept[1]
    for part in (
        f"SPENDBUS_HOME={tmp_path / 'demo'}",
        "KAFKA_BOOTSTRAP=127.0.0.1:9092",
        "SPENDBUS_TOPIC_PREFIX=demo-ab12.",
        "SPENDBUS_WEB_PORT=8123",
        "spendbus admin serve",
    ):
        assert part in serve
    token = login.rsplit(" ", 1)[1]
    record = token_book(settings).verify(token)
    assert record is not None and record.role == "platform-admin" and record.token_id in login


def test_the_console_is_held_until_ctrl_c_on_a_terminal_and_not_off_one() -> None:
    assert hold_seconds(None, on_terminal=True) == TERMINAL_HOLD_S < math.inf  # never hangs
    assert hold_seconds(None, on_terminal=False) is None  # CI, a pipe: the demo ends
    assert hold_seconds(30.0, on_terminal=False) == 30.0
    assert hold_seconds(0.0, on_terminal=True) == 0.0


@pytest.mark.integration
async def test_the_login_the_demo_prints_opens_its_console_on_the_refused_key(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The served console over the demo's topics: the printed login signs in, and the
    overview names the exhausted counter, that it is enforced, that it refuses and why, and
    when it resets."""
    budget, errors = parse_budget(
        {"id": "acme.per-secret", "scope": "secret", "window": "day", "limit_usd": "2"}
    )
    assert budget is not None, errors
    spent = exhausted_verdict(budget, ("acme", "sk-acme-batch"))
    now = datetime.now(UTC)
    await publish(
        kafka_bootstrap,
        topics.budget_policies,
        [(budget.budget_id.encode(), BUDGET_POLICY.encode(budget.to_record(now)))],
    )
    await publish(
        kafka_bootstrap,
        topics.budget_verdicts,
        [(spent["counter_key"].encode(), VERDICT.encode(spent))],
    )
    settings = Settings(home=tmp_path / "demo", topic_prefix=topics.prefix, admin_port=free_port())
    async with console_served(settings, kafka_bootstrap) as served:
        printed = served_lines(served, math.inf)
        assert printed[0].startswith(f"spend console: {served.url}") and "Ctrl-C" in printed[0]
        token = printed[1].rsplit(" ", 1)[1]
        assert token_book(settings).verify(token) is not None
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            async with session.post(served.url + "login", data={"token": token}) as signed:
                assert signed.status == 200 and signed.url.path == "/"
            async with asyncio.timeout(30):  # the store follows the verdicts topic
                while "exceeded" not in (page := await (await session.get(served.url)).text()):
                    await asyncio.sleep(0.2)
    shown = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "acme.per-secret acme/sk-acme-batch $2.00 of $2.00 (100 %) exceeded (enforce)" in shown
    assert "refusing: exhausted: $2.00 of $2.00 spent" in shown, shown
    assert f"{spent['reset_at']:%a %H:%M} UTC" in shown

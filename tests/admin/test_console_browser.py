"""The spend console in a real browser (Debian's Chromium, headless, through Selenium and
the system chromedriver: nothing downloaded), served by the admin app on a real broker
with spend from the real embedded ClickHouse: sign in, create a budget from the dialog
and watch its bar fill; an org admin sees nothing of another org, a viewer no button, and
a POST without the session's CSRF token is refused; a budget made in the dialog fills and
exhausts under real traffic (a running gateway and aggregator worker), and the console
says it is enforced, that the gateways refuse it and why, by which key, and when it
resets.

``SPENDBUS_CONSOLE_SCREENSHOTS=DIR`` also saves the main pages there (docs/console-*.png
are taken so; make test leaves them be)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from aggregator import apply_schema, open_client
from ingest.gateway import KeysTopicFollower
from schemas.budgets import parse_budget
from schemas.codec import VERDICT
from schemas.ids import counter_key
from schemas.jobs import job_key, job_key_secret
from schemas.periods import parse_window, period_end, period_key
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.admin.kit import AdminServer, admin_server, budget
from tests.admin.test_reports import query_of
from tests.gateway.kit import KEY_SECRET, exhausted_verdict, gateway_stack
from tests.pipeline_kit import Pipeline
from tests.reconcile.kit import with_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="no Chromium: apt-get install chromium chromium-driver (.ci/run does)",
    ),
]

#: a guard against a hang while a page catches up (never a measured threshold)
GUARD_S = 30.0
SHOTS = os.environ.get("SPENDBUS_CONSOLE_SCREENSHOTS")
#: the fake provider's answer, in output tokens, to the traffic that exhausts a budget
ANSWER_TOKENS = "400"
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1100"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield browser
    finally:
        browser.quit()


class Browser:
    """The driver's blocking calls off the event loop that serves the console."""

    def __init__(self, driver: Any, server: AdminServer) -> None:
        self.driver = driver
        self.server = server

    async def run(self, call: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(call, *args)

    async def open(self, path: str) -> str:
        await self.run(self.driver.get, self.server.url + path)
        return str(await self.run(lambda: self.driver.page_source))

    async def sign_in(self, token: str) -> None:
        await self.run(self.driver.delete_all_cookies)
        await self.open("/login")

        def submit() -> None:
            from selenium.webdriver.common.by import By

            self.driver.find_element(By.ID, "token").send_keys(token)
            self.click_and_wait("sign-in")

        await self.run(submit)

    async def fill(self, fields: dict[str, str], submit_id: str, open_id: str) -> None:
        def act() -> None:
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support.ui import Select

            self.driver.find_element(By.CSS_SELECTOR, f"#{open_id} summary").click()
            for name, value in fields.items():
                element = self.driver.find_element(By.CSS_SELECTOR, f"#{open_id} [name={name}]")
                if element.tag_name == "select":
                    Select(element).select_by_visible_text(value)
                else:
                    element.clear()
                    element.send_keys(value)
            self.click_and_wait(submit_id)

        await self.run(act)

    def click_and_wait(self, button_id: str) -> None:
        """Submit a form and wait for the page it leads to (blocking: call in a thread)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        # the page clicked on carries a mark its successor does not
        self.driver.execute_script("window.consoleTestOldPage = true")
        self.driver.find_element(By.ID, button_id).click()
        WebDriverWait(self.driver, GUARD_S).until(
            lambda d: d.execute_script(
                "return document.readyState === 'complete' && !window.consoleTestOldPage"
            )
        )

    async def texts(self, css: str) -> list[str]:
        from selenium.webdriver.common.by import By

        elements = await self.run(self.driver.find_elements, By.CSS_SELECTOR, css)
        return [str(await self.run(lambda el=el: el.text)) for el in elements]

    async def bar_of(self, counter: str) -> str | None:
        """The usage bar's percent on the overview row of ``counter`` (ORG or ORG/ID)."""

        def find() -> str | None:
            from selenium.webdriver.common.by import By

            self.driver.get(self.server.url + "/")
            for row in self.driver.find_elements(By.CSS_SELECTOR, "table.budgets tbody tr"):
                cells = row.find_elements(By.TAG_NAME, "td")
                if len(cells) > 2 and cells[1].text == counter:
                    bars = cells[2].find_elements(By.CSS_SELECTOR, ".bar")
                    return str(bars[0].get_attribute("data-percent")) if bars else None
            return None

        return await self.run(find)

    async def shoot(self, name: str) -> None:
        if SHOTS:
            await self.run(self.driver.save_screenshot, str(Path(SHOTS) / f"console-{name}.png"))


@pytest.fixture
def spend_store(clickhouse_dsn: str) -> Iterator[Any]:
    """This month's spend in the real engine: two orgs, several models, keys and users."""
    client = open_client(clickhouse_dsn)
    apply_schema(client)
    today = datetime.now(UTC).date()
    rows: list[str] = []
    for n in range(min(today.day, 12)):
        day = today - timedelta(days=n)
        for org, secret, model, user, cost in (
            ("acme", "sk-acme-web", "gpt-4o", "ana", 1_500_000_000 + n * 90_000_000),
            ("acme", "sk-acme-batch", "claude-sonnet-4-5", "bo", 700_000_000),
            ("globex", "sk-globex", "gpt-4o-mini", "cy", 300_000_000),
        ):
            rows.append(
                f"('e{n}{secret}', '{day} 12:00:00', 'openai', 'openai-chat', '{model}', "
                f"'{secret}', '{org}', NULL, '{user}', map(), 1000, 500, 'ok', {cost}, 0, "
                f"{len(rows)}, now64())"
            )
    client.command(
        "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
        "org_id, project_id, user_id, tags, input_tokens, output_tokens, outcome, cost_nanos, "
        "source_partition, source_offset, priced_at) VALUES " + ", ".join(rows)
    )
    # the counter of the budget the test creates, as the aggregator's priced events carry
    # it: last month $12 of its $10 (exceeded), this month $3
    key = counter_key("acme.monthly", ["acme"])
    month = parse_window("month")
    last_month = datetime.now(UTC).replace(day=1) - timedelta(days=1)
    for n, (moment, cost) in enumerate(((last_month, 12 * 10**9), (datetime.now(UTC), 3 * 10**9))):
        period = period_key(month, moment)
        client.command(
            "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
            "org_id, tags, input_tokens, output_tokens, outcome, cost_nanos, source_partition, "
            f"source_offset, priced_at, counts) VALUES ('h{n}', "
            f"'{moment:%Y-%m-%d} 12:00:00', 'openai', 'openai-chat', 'gpt-4o', 'sk-acme-web', "
            f"'acme', map(), 10, 5, 'ok', {cost}, 1, {n}, now64(), "
            f"[('{key}', 'acme.monthly', ['acme'], 'month', '{period}', 0, 1, 10000000000, "
            "NULL, NULL, [])])"
        )
    yield client
    client.close()


async def counted(topics: Topics, bootstrap: str, made: dict[str, Any], spent_usd: int) -> None:
    """The aggregator's verdict for the budget's ``acme`` counter at ``spent_usd``."""
    parsed, errors = parse_budget(made)
    assert parsed is not None, errors
    verdict = exhausted_verdict(parsed, ("acme",))
    limit = parsed.limit_nanos or 0
    verdict.update(
        spent_nanos=spent_usd * 10**9,
        state="exceeded" if spent_usd * 10**9 >= limit else "ok",
        seq=spent_usd,
    )
    await publish(
        bootstrap,
        topics.budget_verdicts,
        [(verdict["counter_key"].encode(), VERDICT.encode(verdict))],
    )


async def as_browser(
    cookie: str,
    method: str,
    url: str,
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """A request with the session's cookie, made outside the browser (a forged form)."""
    async with (
        aiohttp.ClientSession(cookies={"spendbus_console": cookie}) as session,
        session.request(method, url, data=form, headers=headers, allow_redirects=False) as answer,
    ):
        return answer.status, await answer.text()


async def until(check: Callable[[], Any], wanted: Any) -> None:
    async with asyncio.timeout(GUARD_S):
        while (got := await check()) != wanted:
            await asyncio.sleep(0.2)
    assert got == wanted


async def test_sign_in_watch_a_bar_fill_and_create_a_budget_from_the_dialog(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, driver: Any, spend_store: Any
) -> None:
    async with admin_server(
        kafka_bootstrap, topics, tmp_path, spend_query=query_of(spend_store)
    ) as server:
        browser = Browser(driver, server)
        platform = server.token("platform-admin")
        await browser.sign_in(platform)
        cookie = await browser.run(driver.get_cookie, "spendbus_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert platform not in cookie["value"]
        # the overview: spend per org today and this month, tops, the daily chart
        spend = await browser.texts("table.spend tbody tr")
        assert spend[0].startswith("acme") and spend[1].startswith("globex")
        assert "sk-acme-web" in (await browser.texts(".cards"))[0]
        assert len(await browser.texts("svg.chart rect")) == min(datetime.now(UTC).day, 12)

        # create a budget from the dialog: it is on the topic, as the API reads it back
        await browser.fill(
            {"id": "acme.monthly", "org_id": "acme", "limit_usd": "10", "window": "month"},
            "create-budget",
            "new-budget",
        )
        page = str(await browser.run(lambda: driver.page_source))
        assert "budget acme.monthly created" in page
        status, made = await server.call("GET", "/v1/admin/budgets/acme.monthly", platform)
        assert status == 200 and made["limit_usd"] == "10" and made["match"] == {"org_id": "acme"}
        # the budget page and the overview follow its counter as it is counted
        await counted(topics, kafka_bootstrap, made, 4)
        await until(lambda: browser.bar_of("acme"), "40.0")
        await browser.shoot("overview")
        await counted(topics, kafka_bootstrap, made, 10)
        await until(lambda: browser.bar_of("acme"), "100.0")
        await browser.open("/budgets/acme.monthly")
        assert "exceeded" in " ".join(await browser.texts("table.budgets"))
        # its history per period, from ClickHouse's budget_history_of
        history = [" ".join(row.split()) for row in await browser.texts("table.history tbody tr")]
        this_month, last = (
            period_key(parse_window("month"), datetime.now(UTC)),
            period_key(parse_window("month"), datetime.now(UTC).replace(day=1) - timedelta(days=1)),
        )
        assert history[0].startswith(f"{this_month} acme $3.00 of $10.00"), history
        assert history[1].startswith(f"{last} acme $12.00 of $10.00"), history
        assert history[1].endswith("exceeded 1") and history[0].endswith("ok 1"), history
        await browser.fill(
            {"by_usd": "5", "until": "2h", "reason": "launch"}, "create-raise", "raise"
        )
        assert "launch" in " ".join(await browser.texts("table"))
        await browser.shoot("budget")
        await until(lambda: browser.bar_of("acme"), "66.7")  # $10 of the raised $15
        # a revoked token's session ends
        token_id = platform.split("_")[1]
        server.tokens.revoke(token_id)
        await browser.open("/")
        assert (await browser.run(lambda: driver.current_url)).endswith("/login")


async def test_an_org_admin_sees_nothing_of_another_org_and_a_viewer_no_button(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, driver: Any
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        browser = Browser(driver, server)
        platform = server.token("platform-admin")
        for org in ("initech", "globex"):
            status, _ = await server.call(
                "POST", "/v1/admin/budgets", platform, budget(f"{org}.cap", org)
            )
            assert status == 201
        # a job (seed 001) in each org: initech's shown by its opaque key only
        verdicts = []
        for org in ("initech", "globex"):
            status, jobs = await server.call(
                "POST",
                "/v1/admin/budgets",
                platform,
                {"id": f"{org}.jobs", "job_budget": True, "match": {"org_id": org}},
            )
            assert status == 201, jobs
            parsed, errors = parse_budget(jobs)
            assert parsed is not None, errors
            verdict = exhausted_verdict(parsed, (org, "alice", "sess-7"))
            verdict.update(state="ok", spent_requests=42)
            verdicts.append((verdict["counter_key"].encode(), VERDICT.encode(verdict)))
        await publish(kafka_bootstrap, topics.budget_verdicts, verdicts)
        await browser.sign_in(platform)
        job = {
            org: job_key(job_key_secret(KEY_SECRET), org, "alice", "sess-7")
            for org in ("initech", "globex")
        }

        async def jobs_listed() -> list[str]:
            await browser.open("/jobs")
            return await browser.texts("table.jobs tbody tr td:first-child")

        await until(jobs_listed, [job["globex"], job["initech"]])  # by budget id
        assert "42 of 500" in " ".join(await browser.texts("table.jobs"))
        assert "sess-7" not in await browser.open("/jobs")
        assert "sess-7" not in await browser.open("/")

        await browser.sign_in(server.token("org-admin", "initech"))
        overview = await browser.open("/")
        assert "initech.cap" in overview and "globex" not in overview
        assert await browser.texts("#create-budget") != []  # an admin has the dialog
        assert await jobs_listed() == [job["initech"]]  # never globex's job
        page = await browser.open("/budgets/globex.cap")
        assert (
            "no budget 'globex.cap'" in page and "globex.cap" not in (await browser.texts("h1"))[0]
        )
        cookie = (await browser.run(driver.get_cookie, "spendbus_console"))["value"]
        assert (await as_browser(cookie, "GET", server.url + "/budgets/globex.cap"))[0] == 404

        # its keys, masked, and one revoked from the page
        status, key = await server.call(
            "POST",
            "/v1/admin/keys",
            platform,
            {"name": "initech.c42", "org_id": "initech", "secret_id": "sk-openai"},
        )
        assert status == 201
        page = await browser.open("/keys")
        assert key["key"] not in page  # the key never; its id (a keyed digest) shown masked
        shown = " ".join(await browser.texts("table.keys"))
        assert key["key_id"][:8] + "…" in shown and key["key_id"] not in shown
        await browser.run(browser.click_and_wait, "revoke-" + key["key_id"][:8])
        assert "revoked" in " ".join(await browser.texts("p.ok"))
        assert (await server.call("GET", f"/v1/admin/keys/{key['key_id']}", platform))[0] == 404

        await browser.sign_in(server.token("org-viewer", "initech"))
        await browser.open("/")
        await browser.shoot("viewer")
        buttons = await browser.texts("main button")
        assert buttons == []  # nothing but the nav's log out
        await browser.open("/budgets/initech.cap")
        assert await browser.texts("main button, main form") == []
        await browser.shoot("viewer-budget")
        # the server refuses a viewer's POST anyway, and any POST without the CSRF token
        cookie = (await browser.run(driver.get_cookie, "spendbus_console"))["value"]
        page = str(await browser.run(lambda: driver.page_source))
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        form = {"id": "initech.more", "scope": "org", "limit_usd": "5"}
        status, text = await as_browser(
            cookie, "POST", server.url + "/budgets", {**form, "csrf": found.group(1)}
        )
        assert status == 403 and "read only" in text
        await browser.sign_in(server.token("org-admin", "initech"))
        cookie = (await browser.run(driver.get_cookie, "spendbus_console"))["value"]
        status, text = await as_browser(cookie, "POST", server.url + "/budgets", form)
        assert status == 403 and "CSRF" in text
        # the right CSRF token, posted from another site: refused on its Origin
        page = await browser.open("/")
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        status, text = await as_browser(
            cookie,
            "POST",
            server.url + "/budgets",
            {**form, "csrf": found.group(1)},
            {"Origin": "https://evil.example"},
        )
        assert status == 403 and "https://evil.example" in text
        assert (await server.call("GET", "/v1/admin/budgets/initech.more", platform))[0] == 404


def test_watch_a_budget_made_in_the_dialog_exhaust_under_gateway_traffic(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, driver: Any, clickhouse_dsn: str
) -> None:
    """An org admin creates a 1-cent budget in the dialog; calls go through a running
    gateway (real broker, enforcer and publisher; a fake provider) and a running
    aggregator worker prices and counts them: the console's bar fills with the first
    call's cost, then the counter is exhausted, the gateway refuses the key, and the
    console says so, enforced, refusing and why, the refused call's key, and when it
    resets."""

    async def story(bootstrap: str, topics: Topics, home: Path, pipeline: Pipeline) -> None:
        await exhausted_by_traffic(bootstrap, topics, home, driver, pipeline)

    with_worker(kafka_bootstrap, topics, tmp_path, clickhouse_dsn, story)


async def short_chat(url: str, key: str) -> int:
    """A call the check holds next to nothing for (a few input tokens, one output token)
    that the provider answers with :data:`ANSWER_TOKENS` anyway (the fake's
    ``x-fake-output-tokens``: a bill over the estimate, what lets real traffic pass a
    limit): each call costs about 4/10 of a cent, so the third passes the cent. (With
    honest estimates the check refuses a call once it no longer fits, short of the limit.)"""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "gpt-4o",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"Authorization": f"Bearer {key}", "x-fake-output-tokens": ANSWER_TOKENS},
        ) as resp,
    ):
        await resp.read()
        return resp.status


async def exhausted_by_traffic(
    bootstrap: str, topics: Topics, home: Path, driver: Any, pipeline: Pipeline
) -> None:
    async with (
        # the worker owns the embedded store: the console queries it through its /sql
        admin_server(bootstrap, topics, home / "admin", spend_query=pipeline.sql) as server,
        gateway_stack(bootstrap, topics, home / "gw", budgets=()) as stack,
    ):
        browser = Browser(driver, server)
        initech = server.token("org-admin", "initech")
        status, key = await server.call(
            "POST",
            "/v1/admin/keys",
            initech,
            {"name": "initech.customer-42", "secret_id": "sk-openai", "project_id": "c42"},
        )
        assert status == 201
        await browser.sign_in(initech)
        await browser.fill(
            {"id": "initech.c42", "scope": "project", "limit_usd": "0.01"},
            "create-budget",
            "new-budget",
        )
        assert "budget initech.c42 created" in " ".join(await browser.texts("p.ok"))
        status, made = await server.call("GET", "/v1/admin/budgets/initech.c42", initech)
        assert status == 200 and made["match"] == {"org_id": "initech"}
        async with KeysTopicFollower(
            bootstrap, topics.gateway_keys, stack.gateway.keys, stack.gateway.config
        ) as follower:
            await follower.wait_ready(GUARD_S)
            # the first call, counted: the bar shows its cost, short of the cent
            assert await short_chat(stack.url, key["key"]) == 200

            async def first_counted() -> bool:
                return await browser.bar_of("initech/c42") is not None

            await until(first_counted, True)
            first = float(await browser.bar_of("initech/c42") or "nan")
            assert 39 < first < 42, first  # 400 output tokens of gpt-4o, and "hi"
            # traffic until the gateway refuses the key (the worker's verdict reached it)
            async with asyncio.timeout(GUARD_S):
                while await short_chat(stack.url, key["key"]) != 402:
                    await asyncio.sleep(0.1)
        await until(lambda: browser.bar_of("initech/c42"), "100.0")
        row = " ".join(" ".join(t.split()) for t in await browser.texts("table.budgets tbody tr"))
        assert "exceeded (enforce)" in row and "of $0.01" in row, row
        parsed, errors = parse_budget(made)
        assert parsed is not None, errors
        reset = period_end(parsed.window, datetime.now(UTC))  # its period's end, as shown
        assert f"{reset:%a} " in row and f"{reset:%H:%M} UTC" in row, row
        # why, in plain words, and the refused call itself once the worker wrote it
        assert "refusing: exhausted: $0.01" in row and "of $0.0100 spent" in row, row

        async def refusals_shown() -> bool:
            await browser.open("/")
            return any("last refused" in t for t in await browser.texts("table.budgets tbody tr"))

        await until(refusals_shown, True)
        row = " ".join(" ".join(t.split()) for t in await browser.texts("table.budgets tbody tr"))
        assert "(key sk-openai, gpt-4o)" in row and "refused in 24 h" in row, row
        await browser.shoot("exceeded")

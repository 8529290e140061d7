"""The fake providers' admin usage reports: the calls billed, bucketed by UTC day, paged,
behind the admin key; `fetch_pages` follows every page and refuses what it must."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from pydantic import SecretStr, ValidationError

from reconcile import ReportError, fetch_pages, read_report
from spendbus.fake_upstream import FakeUpstream, FakeUpstreamConfig
from spendbus.fake_upstream.billing import api_key_id

ADMIN_KEY = "fake-admin-key-0123456789"
CONFIG = FakeUpstreamConfig(port=0, seed=3, admin_key=SecretStr(ADMIN_KEY))


async def call(url: str, path: str, body: dict[str, object], headers: dict[str, str]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        await resp.read()


async def test_every_page_is_followed_and_each_call_is_billed_once() -> None:
    async with FakeUpstream(CONFIG) as upstream:
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "hi"}],
        }
        for _ in range(3):
            await call(upstream.url, "/v1/messages", body, {"x-api-key": "sk-ant-one"})
        since = datetime.now(UTC).date() - timedelta(days=40)
        pages = await asyncio.to_thread(fetch_pages, "anthropic", ADMIN_KEY, since, upstream.url)
    # 41 days at 31 buckets a page: two pages, the first announcing the second
    assert [page["has_more"] for page in pages] == [True, False]
    report = read_report("anthropic", pages, "fetched")
    assert len(report.days) == 41
    (row,) = report.rows
    assert row.api_key_id == api_key_id("anthropic", "sk-ant-one")
    tally = upstream.billing.tally
    assert sum(tally.values()) == 3
    assert row.tokens["input"] == sum(c.usage.input_tokens * n for c, n in tally.items())
    assert row.tokens["output"] == sum(c.usage.output_tokens * n for c, n in tally.items())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_wrong_admin_key_is_refused_and_never_shown(provider: str) -> None:
    async with FakeUpstream(CONFIG) as upstream:
        since = datetime.now(UTC).date()
        with pytest.raises(ReportError, match="answered 401") as caught:
            await asyncio.to_thread(fetch_pages, provider, "not-the-key", since, upstream.url)
        assert "not-the-key" not in str(caught.value)
        # the credential a call came with is no admin key either
        with pytest.raises(ReportError, match="answered 401"):
            await asyncio.to_thread(fetch_pages, provider, "", since, upstream.url)


async def test_without_an_admin_key_the_reports_refuse_everyone() -> None:
    async with FakeUpstream(FakeUpstreamConfig(port=0)) as upstream:
        with pytest.raises(ReportError, match="answered 401"):
            await asyncio.to_thread(
                fetch_pages, "openai", ADMIN_KEY, datetime.now(UTC).date(), upstream.url
            )


async def test_a_bad_query_is_a_400_naming_the_parameter() -> None:
    async with FakeUpstream(CONFIG) as upstream, aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for query, named in (
            ("", "start_time is required"),
            ("start_time=abc", "start_time 'abc'"),
            ("start_time=0&limit=99", "limit must be"),
            ("start_time=0&page=zz", "page 'zz'"),
        ):
            async with session.get(
                f"{upstream.url}/v1/organization/usage/completions?{query}", headers=headers
            ) as resp:
                assert resp.status == 400
                assert named in (await resp.json())["error"]["message"]


def test_a_price_list_that_cannot_be_read_is_refused_when_configured(tmp_path: Path) -> None:
    broken = tmp_path / "prices.yaml"
    broken.write_text("versions: [{version: x}]\n")
    with pytest.raises(ValidationError, match="price_file"):
        FakeUpstreamConfig(price_file=broken)
    with pytest.raises(ValidationError, match="price_file"):
        FakeUpstreamConfig(price_file=tmp_path / "absent.yaml")

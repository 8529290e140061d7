"""Spend reports over HTTP from ClickHouse (the real embedded engine, the shipped DDL):
by period × group, fenced by org, totals equal to the ledger's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from admin.access import Caller
from admin.reports import GROUPS, PERIODS, resolve, spend_sql
from aggregator import apply_schema, open_client, run_query
from schemas.topics import Topics
from tests.admin.kit import admin_server

pytestmark = pytest.mark.integration

#: (day, org, project, model, team tag, cost in nanos)
EVENTS = [
    ("2026-11-02", "acme", "p1", "gpt-4o", "ml", 1_000),
    ("2026-11-02", "acme", "p2", "gpt-4o", "web", 2_000),
    ("2026-11-03", "acme", "p1", "claude-sonnet-4-5", "ml", 4_000),
    ("2026-11-30", "acme", None, "gpt-4o", None, 8_000),
    ("2026-12-01", "acme", "p1", "gpt-4o", "ml", 16_000),
    ("2026-11-02", "globex", "p1", "gpt-4o", "ml", 32_000),
]


@pytest.fixture
def store(clickhouse_dsn: str) -> Iterator[Any]:
    client = open_client(clickhouse_dsn)
    apply_schema(client)
    for offset, (day, org, project, model, team, cost) in enumerate(EVENTS):
        tags = "map()" if team is None else f"map('team', '{team}')"
        client.command(
            "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
            "org_id, project_id, tags, input_tokens, output_tokens, outcome, cost_nanos, "
            "source_partition, source_offset, priced_at) VALUES "
            f"('e{offset}', '{day} 12:00:00', 'openai', 'openai-chat', '{model}', 'sk-1', "
            f"'{org}', {'NULL' if project is None else repr(project)}, {tags}, 10, 5, 'ok', "
            f"{cost}, 0, {offset}, now64())"
        )
    yield client
    client.close()


def query_of(client: Any) -> Any:
    def run(sql: str) -> Sequence[Sequence[Any]]:
        return run_query(client, sql)[1]

    return run


async def test_spend_by_period_and_group_stays_in_its_org(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, store: Any
) -> None:
    async with admin_server(
        kafka_bootstrap, topics, tmp_path, spend_query=query_of(store)
    ) as server:
        platform = server.token("platform-admin")
        acme = server.token("org-viewer", "acme")
        span = "from=2026-11-01&to=2026-12-31"

        async def report(token: str, query: str) -> dict[str, Any]:
            status, body = await server.call("GET", f"/v1/admin/reports/spend?{query}", token)
            assert status == 200 and isinstance(body, dict), body
            return body

        by_month = await report(platform, f"by=month&group=org&{span}")
        assert [(r["period"], r["org_id"], r["cost_nanos"]) for r in by_month["rows"]] == [
            ("2026-11-01", "acme", 15_000),
            ("2026-11-01", "globex", 32_000),
            ("2026-12-01", "acme", 16_000),
        ]
        # totals equal the ledger's
        (ledger,) = run_query(store, "SELECT sum(cost_nanos), count() FROM usage_events")[1]
        assert (by_month["total_cost_nanos"], by_month["total_events"]) == tuple(ledger)
        # an org's viewer: its own org only, whatever it asks
        mine = await report(acme, f"by=month&group=project&{span}")
        assert {r["org_id"] for r in mine["rows"]} == {"acme"}
        assert mine["total_cost_nanos"] == 31_000
        refused = await server.call("GET", f"/v1/admin/reports/spend?org_id=globex&{span}", acme)
        assert refused[0] == 403
        by_week = await report(acme, f"by=week&group=model&{span}")
        assert ("2026-11-02", "claude-sonnet-4-5", 4_000) in [
            (r["period"], r["key"], r["cost_nanos"]) for r in by_week["rows"]
        ]
        by_tag = await report(platform, "by=day&group=tag:team&from=2026-11-02&to=2026-11-02")
        assert sorted((r["org_id"], r["key"], r["cost_nanos"]) for r in by_tag["rows"]) == [
            ("acme", "ml", 1_000),
            ("acme", "web", 2_000),
            ("globex", "ml", 32_000),
        ]
        # a quote in a value stays a value
        odd = await report(platform, "org_id=acme'%20OR%20'1'='1&" + span)
        assert odd["rows"] == []
        for bad, field in (
            ("by=year", "by"),
            ("group=colour", "group"),
            ("group=tag:bad%20name", "group"),
            ("from=yesterday", "from"),
            ("from=2026-12-02&to=2026-12-01", "to"),
            ("from=2020-01-01&to=2026-12-01", "to"),
            ("colour=red", "colour"),
            ("limit=0", "limit"),
            ("limit=10001", "limit"),
            ("limit=ten", "limit"),
            ("cursor=not-a-cursor", "cursor"),
        ):
            status, body = await server.call("GET", f"/v1/admin/reports/spend?{bad}", platform)
            assert (status, body["field"]) == (422, field), (bad, body)


async def test_without_a_store_a_report_is_a_503_naming_it(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    async with admin_server(kafka_bootstrap, topics, tmp_path) as server:
        status, body = await server.call(
            "GET", "/v1/admin/reports/spend", server.token("platform-admin")
        )
        assert status == 503 and "ClickHouse" in body["error"]


def add_users(client: Any) -> None:
    """600 more events over 40 days, 3 orgs, 9 users (one absent), 4 projects, 3 models."""
    client.command(
        "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
        "org_id, project_id, user_id, input_tokens, cache_read_tokens, output_tokens, outcome, "
        "cost_nanos, source_partition, source_offset, priced_at) "
        "SELECT concat('u', toString(number)), "
        "toDateTime64('2026-11-01 00:00:00', 6, 'UTC') + number * 5760, 'openai', 'openai-chat', "
        "['gpt-4o', 'o3', 'claude'][number % 3 + 1], concat('sk-', toString(number % 5)), "
        "['acme', 'globex', 'initech'][number % 3 + 1], "
        "if(number % 4 = 0, NULL, concat('p', toString(number % 4))), "
        "if(number % 9 = 0, NULL, concat('user-', toString(number % 9))), "
        "number % 50, number % 7, number % 11, 'ok', 1000003 * (number % 13) + number, "
        "1, number, now64() FROM numbers(600)"
    )


def test_each_report_from_the_rollup_equals_the_events_to_the_nano(store: Any) -> None:
    add_users(store)
    platform = Caller("t", "platform-admin", None, "127.0.0.1")
    today = date(2026, 12, 31)
    for by in PERIODS:
        for group in GROUPS:
            query = {"by": by, "group": group, "from": "2026-11-01", "to": "2026-12-31"}
            report = resolve(query, platform, today)
            rolled = run_query(store, spend_sql(report, 10_000))[1]
            events = run_query(store, spend_sql(report, 10_000, source="usage_events"))[1]
            assert rolled == events and len(rolled) > 1, (by, group)
            assert "spend_daily_by_dimension" in spend_sql(report, 1)


async def test_pages_walk_the_report_once_in_order(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, store: Any
) -> None:
    add_users(store)
    async with admin_server(
        kafka_bootstrap, topics, tmp_path, spend_query=query_of(store)
    ) as server:
        platform = server.token("platform-admin")
        report = "/v1/admin/reports/spend?by=day&group=user&from=2026-11-01&to=2026-12-31"
        status, whole = await server.call("GET", f"{report}&limit=10000", platform)
        assert status == 200 and whole["next_cursor"] is None
        pages, cursor = [], ""
        while True:
            status, page = await server.call("GET", f"{report}&limit=7{cursor}", platform)
            assert status == 200 and len(page["rows"]) <= 7, page
            pages.append(page)
            if page["next_cursor"] is None:
                break
            cursor = f"&cursor={page['next_cursor']}"
        walked = [row for page in pages for row in page["rows"]]
        assert walked == whole["rows"] and len(pages) == -(-len(walked) // 7) > 2
        (ledger,) = run_query(store, "SELECT sum(cost_nanos), count() FROM usage_events")[1]
        assert sum(p["total_cost_nanos"] for p in pages) == ledger[0]
        assert sum(p["total_events"] for p in pages) == ledger[1]
        # a cursor is its report's own: another group's, or another org's view, is refused
        other = await server.call(
            "GET", report.replace("group=user", "group=model") + cursor, platform
        )
        fenced = await server.call("GET", report + cursor, server.token("org-viewer", "acme"))
        for status, body in (other, fenced):
            assert (status, body["field"]) == (422, "cursor"), body

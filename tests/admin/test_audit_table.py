"""The audit trail in ClickHouse (the real embedded engine): the admin_audit table
follows the admin.audit topic, catches up with what was written while no server kept
it, and holds each entry once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from admin import AuditSink
from aggregator import open_client, run_query
from schemas.topics import Topics
from tests.admin.kit import admin_server, budget

pytestmark = pytest.mark.integration

#: a guard against a table that never fills (never a measured threshold)
GUARD_S = 30.0


@pytest.fixture
def store(clickhouse_dsn: str) -> Iterator[Any]:
    client = open_client(clickhouse_dsn)
    yield client
    client.close()


def sink_of(client: Any) -> AuditSink:
    def execute(sql: str) -> None:
        client.command(sql)

    return AuditSink(execute=execute, select=lambda sql: run_query(client, sql)[1])


async def stored(client: Any, count: int) -> list[tuple[Any, ...]]:
    """The table's rows (FINAL: each audit id once), once it holds ``count``."""
    async with asyncio.timeout(GUARD_S):
        while True:
            try:
                rows = run_query(
                    client,
                    "SELECT audit_id, token_id, role, remote, action, resource_id, org_id, "
                    "before, after FROM admin_audit FINAL ORDER BY at",
                )[1]
            except Exception:  # the table is made by the server's first catch-up
                rows = []
            if len(rows) >= count:
                return [tuple(r) for r in rows]
            await asyncio.sleep(0.1)


async def test_the_table_follows_the_topic_and_catches_up(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, store: Any
) -> None:
    # written while no server keeps the table
    async with admin_server(kafka_bootstrap, topics, tmp_path / "a") as server:
        token = server.token("org-admin", "acme")
        assert (await server.call("POST", "/v1/admin/budgets", token, budget("acme.a")))[0] == 201
    async with admin_server(
        kafka_bootstrap, topics, tmp_path / "b", audit_sink=sink_of(store)
    ) as server:
        token = server.token("org-admin", "acme")
        patch = {"limit_usd": "75"}
        assert (await server.call("PATCH", "/v1/admin/budgets/acme.a", token, patch))[0] == 200
        rows = await stored(store, 2)
        token_id = next(r.token_id for r in server.tokens.records())
        created, patched = rows
        assert created[4] == "budgets.create" and json.loads(created[8])["limit_usd"] == "50"
        assert patched[1:7] == (
            token_id,
            "org-admin",
            "127.0.0.1",
            "budgets.patch",
            "acme.a",
            "acme",
        )
        assert json.loads(patched[7])["limit_usd"] == "50"
        assert json.loads(patched[8])["limit_usd"] == "75"
    # a restart inserts nothing twice
    async with admin_server(
        kafka_bootstrap, topics, tmp_path / "c", audit_sink=sink_of(store)
    ) as server:
        token = server.token("platform-admin")
        assert (await server.call("DELETE", "/v1/admin/budgets/acme.a", token))[0] == 200
        rows = await stored(store, 3)
        assert [r[4] for r in rows] == ["budgets.create", "budgets.patch", "budgets.delete"]
        (total,) = run_query(store, "SELECT count() FROM admin_audit")[1]
        assert total[0] == 3

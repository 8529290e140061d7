"""The admin API's audit trail in ClickHouse on the embedded store (issue 39): the running
worker follows admin.audit into admin_audit, catches up after a restart with what was
written while it was down, holds each entry once, and skips a record that is no entry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runtime.compacted import publish
from schemas.topics import Topics
from tests.admin.kit import admin_server, budget
from tests.pipeline_kit import Pipeline

pytestmark = pytest.mark.integration

ROWS = (
    "SELECT audit_id, token_id, role, remote, action, resource_id, org_id, before, after "
    "FROM admin_audit FINAL ORDER BY at"
)


async def changes(
    pipeline: Pipeline, home: Path, *calls: tuple[str, str, Any]
) -> tuple[str, list[int]]:
    """The org-admin's token id and the status of each call, on a fresh admin server."""
    async with admin_server(pipeline.bootstrap, pipeline.topics, home) as server:
        token = server.token("org-admin", "acme")
        statuses = [(await server.call(m, p, token, b))[0] for m, p, b in calls]
        return server.tokens.records()[-1].token_id, statuses


def test_the_worker_copies_the_audit_topic_into_clickhouse(
    pipeline: Pipeline, topics: Topics, tmp_path: Path
) -> None:
    token_id, statuses = asyncio.run(
        changes(
            pipeline,
            tmp_path / "a",
            ("POST", "/v1/admin/budgets", budget("acme.a", "acme")),
            ("PATCH", "/v1/admin/budgets/acme.a", {"limit_usd": "75"}),
        )
    )
    assert statuses == [201, 200]
    rows = pipeline.sql_until(ROWS, lambda r: len(r) == 2)
    created, patched = rows
    assert created[4] == "budgets.create" and json.loads(created[8])["limit_usd"] == "50"
    assert patched[1:7] == [token_id, "org-admin", "127.0.0.1", "budgets.patch", "acme.a", "acme"]
    assert json.loads(patched[7])["limit_usd"] == "50"
    assert json.loads(patched[8])["limit_usd"] == "75"

    # written while no worker runs, and a record that is no entry: the restart catches up
    pipeline.worker.stop()
    asyncio.run(publish(pipeline.bootstrap, topics.admin_audit, [(b"junk", b"{not json")]))
    _, statuses = asyncio.run(
        changes(pipeline, tmp_path / "b", ("DELETE", "/v1/admin/budgets/acme.a", None))
    )
    assert statuses == [200]
    pipeline.worker.start(timeout=180)
    rows = pipeline.sql_until(ROWS, lambda r: len(r) == 3)
    assert [r[4] for r in rows] == ["budgets.create", "budgets.patch", "budgets.delete"]
    assert rows[2][8] is None  # a deletion has no after
    # each entry inserted once: the restart inserted only what the table lacked
    (total,) = pipeline.sql("SELECT count() FROM admin_audit")
    assert total[0] == 3

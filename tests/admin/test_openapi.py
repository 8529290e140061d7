"""The admin API against its own OpenAPI document, by schemathesis: requests generated
from the document (bounded: a few examples per operation, derandomized), each answer
checked to be no 5xx, a documented status, JSON, and valid against the document's
schema (real broker; the server on a loopback port in a thread of its own)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.core.result import Ok

from admin import openapi_document
from admin.models import BudgetBody
from admin.routes import ROUTES
from aggregator import apply_schema, open_client, run_query
from schemas.topics import Topics
from tests.admin.kit import AdminServer, admin_server

pytestmark = pytest.mark.integration

#: generated cases per operation: enough to reach each refusal path, bounded for make test
EXAMPLES = 12
#: a guard against a server that never starts (never a measured threshold)
GUARD_S = 60.0


class ServerThread:
    """``admin_server`` on an event loop of its own thread, for a synchronous client."""

    def __init__(self, bootstrap: str, topics: Topics, home: Path, **options: Any) -> None:
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.server: AdminServer | None = None
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self._run(bootstrap, topics, home),)
        )

    async def _run(self, bootstrap: str, topics: Topics, home: Path) -> None:
        self.stop = asyncio.Event()
        async with admin_server(bootstrap, topics, home, **self.options) as server:
            self.server = server
            self.ready.set()
            await self.stop.wait()

    def __enter__(self) -> AdminServer:
        self.thread.start()
        assert self.ready.wait(GUARD_S), "the admin server did not start"
        assert self.server is not None
        return self.server

    def __exit__(self, *exc: object) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(GUARD_S)
        self.loop.close()


@pytest.fixture
def served(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> Iterator[AdminServer]:
    store = open_client(clickhouse_dsn)
    apply_schema(store)
    try:
        with ServerThread(
            kafka_bootstrap, topics, tmp_path, spend_query=lambda sql: run_query(store, sql)[1]
        ) as server:
            yield server
    finally:
        store.close()


def test_the_document_is_openapi_3_1_and_describes_every_body() -> None:
    document = openapi_document()
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    # the budget body is the YAML form's fields, unknown fields refused
    assert set(schemas["BudgetBody"]["properties"]) >= {"id", "scope", "window", "limit_usd"}
    assert schemas["BudgetBody"]["additionalProperties"] is False
    assert set(BudgetBody.model_fields) == set(schemas["BudgetBody"]["properties"])
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert len(operations) == len(ROUTES)
    assert all(set(op["responses"]) >= {"401", "422", "503"} for op in operations)


def test_every_operation_answers_as_its_document_says(served: AdminServer) -> None:
    platform = served.token("platform-admin")
    schema = schemathesis.openapi.from_dict(openapi_document())
    wanted = [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
    ]
    failures: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), "the document has an operation schemathesis cannot read"
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            case.call_and_validate(
                base_url=served.url, headers={"Authorization": f"Bearer {platform}"}, checks=wanted
            )

        try:
            run()
        except Exception as exc:  # every operation's failure is listed, not only the first
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)

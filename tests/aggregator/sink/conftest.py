"""The ClickHouse sink tests' fixtures: one chdb engine per module, a fresh database per
test, each test on both insert paths (kit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aggregator.sink import open_client
from tests.aggregator.sink.kit import WritePath, fresh_database


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's chdb data path (DSN), open for the whole module, closed after it."""
    dsn = f"chdb://{tmp_path_factory.mktemp('chdb')}/data"
    admin = open_client(dsn)
    yield dsn
    admin.close()


@pytest.fixture
def client(engine: str) -> Iterator[Any]:
    """A client on a fresh database holding the shipped DDL (aggregator/sink/ddl)."""
    ch = fresh_database(engine)
    yield ch
    ch.close()


@pytest.fixture(params=[False, True], ids=["rows", "avro"])
def path(request: pytest.FixtureRequest) -> WritePath:
    """Each flush-order and exactness test runs on both insert paths."""
    return WritePath(avro=request.param)

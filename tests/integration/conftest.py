"""Fixtures for whole-pipeline tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_kit import Pipeline

from schemas.topics import Topics


@pytest.fixture
def pipeline(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, clickhouse_dsn: str
) -> Iterator[Pipeline]:
    p = Pipeline(kafka_bootstrap, topics, tmp_path, clickhouse_dsn)
    p.apply_reference()
    p.worker.start(timeout=180)
    try:
        yield p
    finally:
        p.worker.stop()

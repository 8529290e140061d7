"""The reconcile tests' shared harness."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from schemas.codec import PRICE_TABLE
from schemas.pricing import default_price_file, load_price_file
from schemas.topics import Topics
from spendbus.stack.compacted import publish
from tests.pipeline_kit import Pipeline

Scenario = Callable[[str, Topics, Path, Pipeline], Coroutine[Any, Any, None]]


def with_worker(
    bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    dsn: str,
    scenario: Scenario,
    price_file: Path | None = None,
) -> None:
    """``scenario(bootstrap, topics, tmp_path, pipeline)`` beside a running aggregator worker
    that prices by ``price_file`` (default: the shipped one; published first), stopped
    after."""
    tables = load_price_file(price_file or default_price_file())
    asyncio.run(
        publish(
            bootstrap,
            topics.pricing,
            [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
        )
    )
    pipeline = Pipeline(bootstrap, topics, tmp_path / "worker", dsn)
    pipeline.worker.start(timeout=180)
    try:
        asyncio.run(scenario(bootstrap, topics, tmp_path, pipeline))
    finally:
        pipeline.worker.stop()

"""What several benchmarks share: a synthetic ledger, reference data, a worker process.

Imported as ``bench.benchkit`` (each bench puts the project root on ``sys.path``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.budgets import Budget, budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE, USAGE_EVENT
from schemas.pricing import default_price_file, load_price_file
from schemas.topics import Topics
from schemas.usage import new_usage_event
from spendbus.stack.broker_probe import free_port
from spendbus.stack.compacted import publish
from spendbus.stack.worker import WorkerProcess

#: three counters an event: secret/month, org/day, user/rolling 1h (limits never reached)
BUDGETS: list[dict[str, Any]] = [
    {"id": "per-secret", "scope": "secret", "window": "month", "limit_usd": "1000000"},
    {"id": "per-org", "scope": "org", "window": "day", "limit_tokens": 10**15},
    {"id": "per-user", "scope": "user", "window": "rolling:1h", "limit_usd": "1000000"},
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def events(n: int, orgs: int = 50) -> list[tuple[bytes, bytes]]:
    """``n`` encoded UsageEvents (key = org) over ``orgs`` orgs, 4 secrets and 10 users each."""
    out = []
    for i in range(n):
        org = f"org-{i % orgs}"
        e = new_usage_event(
            provider="anthropic",
            api="anthropic-messages",
            model="claude-sonnet-4-5",
            secret_id=f"sk-{i % (orgs * 4)}",
            org_id=org,
            user_id=f"user-{i % 500}@{org}.com",
            gateway_id="bench",
            input_tokens=1000 + i % 5000,
            output_tokens=100 + i % 900,
        )
        out.append((org.encode(), USAGE_EVENT.encode(e)))
    return out


async def apply_reference(
    bootstrap: str,
    topics: Topics,
    budgets: Iterable[Budget] | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """The shipped prices and ``budgets`` (default: :data:`BUDGETS`) on their topics."""
    now = datetime.now(UTC)
    tables = load_price_file(default_price_file())
    await publish(
        bootstrap,
        topics.pricing,
        [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables],
        security=security,
    )
    chosen = budgets_from_yaml(BUDGETS) if budgets is None else budgets
    await publish(
        bootstrap,
        topics.budget_policies,
        [(b.budget_id.encode(), BUDGET_POLICY.encode(b.to_record(now))) for b in chosen],
        security=security,
    )


def worker(
    bootstrap: str,
    topics: Topics,
    home: Path,
    *,
    clickhouse_dsn: str | None = None,
    code_root: str | None = None,
) -> WorkerProcess:
    """An aggregator worker (not started): without ``clickhouse_dsn`` it has no ClickHouse
    sink (pricing, counters and verdicts alone, which is what the enforcers follow); with
    one it also sinks into that store. Its Kafka security settings come from the
    environment it inherits (KAFKA_*), never its arguments.

    ``code_root``: another checkout whose code (and compiled extensions) the worker runs,
    as ``SPENDBUS_BENCH_ROOT`` gives it (bench/compare.py): that root first on its
    ``PYTHONPATH``, and ``PYTHONSAFEPATH`` so that ``python -m`` does not put the current
    directory (this checkout, when run from it) before it."""
    port = free_port()
    env = {
        "KAFKA_BOOTSTRAP": bootstrap,
        "SPENDBUS_TOPIC_PREFIX": topics.prefix,
        "SPENDBUS_HOME": str(home),
        "SPENDBUS_PARTITIONS": "4",
        "SPENDBUS_WEB_PORT": str(port),
    }
    if clickhouse_dsn is not None:
        env["CLICKHOUSE_DSN"] = clickhouse_dsn
    if code_root is not None:
        inherited = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([code_root, *([inherited] if inherited else [])])
        env["PYTHONSAFEPATH"] = "1"
    return WorkerProcess(
        run_dir=home / "run",
        env=env,
        web_port=port,
        args=() if clickhouse_dsn is not None else ("--no-sink",),
    )

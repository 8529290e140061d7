"""Admin API benchmark: p50/p99 of a counters read and of a spend report.

An admin server (admin/: its app on a loopback port, in this process) over a fresh set of
topics holding --budgets project budgets of one org with --counters-per-budget verdicts
each (what the aggregator writes), and an embedded ClickHouse (the shipped DDL) holding
--events usage events over 60 days, 20 orgs × 50 projects × 5 models (their
``spend_daily`` rollup filled by its materialized view as they are inserted). Then
--requests of each, alternated, one at a time over one keep-alive connection:

- ``GET /v1/admin/counters?budget_id=<a random budget>`` (the verdicts followed in memory);
- ``GET /v1/admin/reports/spend?by=day&group=project&org_id=<a random org>`` over the 60
  days (the rollup through the query function `spendbus admin serve` hands in).

The issue's figure is with 10M events (target p99 < 1 s): ``--events 10000000``. Prints
one JSON object. Uses KAFKA_BOOTSTRAP, else starts a LocalKafka for the run.

    .venv/bin/python bench/bench_admin.py [--events 1000000] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web

from admin import SERVER_OPTIONS, AdminConfig, AdminStore, TokenBook, build_app
from aggregator import apply_schema, open_client, run_query
from bench.benchkit import pct
from schemas.budgets import parse_budget
from schemas.codec import BUDGET_POLICY, VERDICT
from schemas.ids import counter_key
from schemas.periods import period_end, period_key
from schemas.topics import Topics
from spendbus.stack.broker_jars import ensure_broker_jars
from spendbus.stack.compacted import publish
from spendbus.stack.kafka import LocalKafka
from spendbus.stack.topics import ensure_topics

ORGS = 20
DAYS = 60


def fill_store(client: Any, events: int) -> None:
    """``events`` usage events over the last DAYS days, inserted by ClickHouse itself."""
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start -= timedelta(days=DAYS - 1)
    client.command(
        "INSERT INTO usage_events (event_id, occurred_at, provider, api, model, secret_id, "
        "org_id, project_id, tags, input_tokens, output_tokens, outcome, cost_nanos, "
        "source_partition, source_offset, priced_at) "
        f"SELECT toString(number), toDateTime64('{start:%Y-%m-%d %H:%M:%S}', 6, 'UTC') + "
        f"toIntervalSecond(number % ({DAYS} * 86400)), 'openai', 'openai-chat', "
        "concat('model-', toString(number % 5)), concat('sk-', toString(number % 7)), "
        f"concat('org-', toString(number % {ORGS})), concat('p', toString(intDiv(number, {ORGS}) % 50)), "
        "map('team', concat('t', toString(number % 3))), 1000, 200, 'ok', "
        "1000000 + number % 1000, 0, number, now64() "
        f"FROM numbers({events})"
    )


async def seed_topics(bootstrap: str, topics: Topics, budgets: int, per_budget: int) -> list[str]:
    """Project budgets of org-0 and their verdicts (as the aggregator writes them)."""
    now = datetime.now(UTC)
    ids, policies, verdicts = [], [], []
    for b in range(budgets):
        parsed, _ = parse_budget(
            {
                "id": f"org-0.b{b}",
                "scope": "project",
                "window": "month",
                "limit_usd": "100",
                "match": {"org_id": "org-0"},
            }
        )
        assert parsed is not None
        ids.append(parsed.budget_id)
        policies.append((parsed.budget_id.encode(), BUDGET_POLICY.encode(parsed.to_record(now))))
        for c in range(per_budget):
            values = ("org-0", f"p{c}")
            key = counter_key(parsed.budget_id, values)
            verdict = {
                "counter_key": key,
                "budget_id": parsed.budget_id,
                "scope": "project",
                "scope_values": list(values),
                "period": period_key(parsed.window, now),
                "state": "ok",
                "spent_nanos": random.randrange(10**11),
                "spent_tokens": 0,
                "spent_requests": 0,
                "limit_nanos": parsed.limit_nanos,
                "limit_tokens": None,
                "limit_requests": None,
                "action": "enforce",
                "refusal": parsed.refusal,
                "reset_at": period_end(parsed.window, now),
                "as_of": now,
                "seq": 1,
                "emitted_at": now,
            }
            verdicts.append((key.encode(), VERDICT.encode(verdict)))
    await publish(bootstrap, topics.budget_policies, policies)
    await publish(bootstrap, topics.budget_verdicts, verdicts)
    return ids


async def measure(
    bootstrap: str, home: Path, store: Any, args: argparse.Namespace
) -> dict[str, Any]:
    topics = Topics(prefix=f"bench{uuid.uuid4().hex[:8]}.")
    await ensure_topics(bootstrap, topics, partitions=4)
    budget_ids = await seed_topics(bootstrap, topics, args.budgets, args.counters_per_budget)
    tokens = TokenBook(home / "admin.tokens", b"bench-admin-secret-0123456789abcdef")
    token = tokens.mint("platform-admin", None)[0]
    app = build_app(
        AdminStore(AdminConfig(bootstrap, topics, b"bench-key-secret-0123456789")),
        tokens,
        spend_query=lambda sql: run_query(store, sql)[1],
    )
    runner = web.AppRunner(app, access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    timings: dict[str, list[float]] = {"counters": [], "spend_report": []}
    rows: dict[str, int] = {"counters": 0, "spend_report": 0}
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        url = f"http://127.0.0.1:{port}/v1/admin"
        headers = {"Authorization": f"Bearer {token}"}
        first = (datetime.now(UTC).date() - timedelta(days=DAYS - 1)).isoformat()
        async with aiohttp.ClientSession(headers=headers) as session:

            async def timed(kind: str, path: str, field: str) -> None:
                started = time.perf_counter()
                async with session.get(url + path) as response:
                    body = await response.json()
                    assert response.status == 200, body
                timings[kind].append((time.perf_counter() - started) * 1000)
                rows[kind] = len(body[field])

            await timed("counters", f"/counters?budget_id={budget_ids[0]}", "counters")  # warm
            timings["counters"].clear()
            for _ in range(args.requests):
                budget = random.choice(budget_ids)
                await timed("counters", f"/counters?budget_id={budget}", "counters")
                org = f"org-{random.randrange(ORGS)}"
                await timed(
                    "spend_report",
                    f"/reports/spend?by=day&group=project&org_id={org}&from={first}",
                    "rows",
                )
    finally:
        await runner.cleanup()
    return {
        kind: {
            "p50_ms": round(pct(values, 0.5), 2),
            "p99_ms": round(pct(values, 0.99), 2),
            "rows_per_answer": rows[kind],
        }
        for kind, values in timings.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--budgets", type=int, default=50)
    parser.add_argument("--counters-per-budget", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    random.seed(7)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker: LocalKafka | None = None
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
        if not bootstrap:
            ensure_broker_jars()
            broker = LocalKafka(data_dir=home / "kafka").start()
            bootstrap = broker.bootstrap
        store = open_client(f"chdb://{home / 'clickhouse'}")
        try:
            apply_schema(store)
            started = time.perf_counter()
            fill_store(store, args.events)
            filled_s = time.perf_counter() - started
            (stored,) = run_query(store, "SELECT count() FROM usage_events")[1]
            result = asyncio.run(measure(bootstrap, home, store, args))
        finally:
            store.close()
            if broker is not None:
                broker.stop()
    print(
        json.dumps(
            {
                "bench": "admin",
                "events": int(stored[0]),
                "fill_s": round(filled_s, 2),
                "budgets": args.budgets,
                "counter_count": args.budgets * args.counters_per_budget,
                "requests": args.requests,
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()

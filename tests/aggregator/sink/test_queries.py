"""What analysts read: budget_state's latest verdict, the example queries, the README's copy."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from aggregator.sink import (
    EXAMPLE_QUERIES,
    ROLLUP_DRIFT,
    ClickHouseSink,
    run_query,
)
from aggregator.sink.query import LATEST_BUDGET_STATE
from tests.aggregator.sink.kit import (
    NOW,
    REPO,
    batch,
    priced,
    scalar,
    verdict,
)

# -- budget_state -------------------------------------------------------------------


def test_latest_budget_state_takes_argmax_by_seq_without_merges(client: Any) -> None:
    client.command("SYSTEM STOP MERGES budget_state")  # the worst case: merges never run
    sink = ClickHouseSink(client)
    # out of order, across batches (so across parts), with a duplicate and a new period
    sink.write_verdicts([verdict("a,", 3, spent=300), verdict("b,", 1, spent=10)])
    sink.write_verdicts([verdict("a,", 5, spent=500), verdict("a,", 4, spent=400)])
    sink.write_verdicts([verdict("a,", 5, spent=500), verdict("b,", 2, "m:2026-12", spent=1_000)])
    sink.write_verdicts([verdict("a,", 1, spent=100)])
    # 7 verdicts, 3 keys: only the two of one insert collapsed (optimize_on_insert)
    assert scalar(client, "SELECT count() FROM budget_state") == 6
    names, rows = run_query(client, LATEST_BUDGET_STATE)
    latest = [dict(zip(names, row, strict=True)) for row in rows]
    assert [(r["counter_key"], r["last_seq"], r["spent_nanos"], r["period"]) for r in latest] == [
        ("a,", 5, 500, "m:2026-11"),
        ("b,", 2, 1_000, "m:2026-12"),
    ]
    assert latest[1]["state"] == "exceeded"
    assert latest[0]["limit_tokens"] is None
    client.command("SYSTEM START MERGES budget_state")
    client.command("OPTIMIZE TABLE budget_state FINAL")
    assert scalar(client, "SELECT count() FROM budget_state") == 3  # (counter, period) keys
    assert run_query(client, LATEST_BUDGET_STATE)[1] == rows


# -- analyst queries ----------------------------------------------------------------


def test_every_example_query_runs_and_answers_from_the_data(client: Any) -> None:
    sink = ClickHouseSink(client)
    records = batch(range(0, 300), partitions=2, cache_read_tokens=40)
    unpriced = priced(300, model="mystery-1")
    unpriced["unpriced"], unpriced["cost_nanos"] = True, 0
    refused = [
        priced(301 + i, outcome="refused", decision=d, decision_budget_id="b1", status_code=429)
        for i, d in enumerate(["budget_exceeded", "budget_exceeded", "throttled"])
    ]
    failed_open = priced(304, outcome="failed_open", decision="failed_open")
    everything = [*records, unpriced, *refused, failed_open]
    sink.write(everything)
    sink.write_verdicts([verdict("a,", 1), verdict("a,", 2, spent=2_000)])

    results = {}
    for name, sql in EXAMPLE_QUERIES.items():
        names, rows = run_query(client, sql)
        assert rows, name
        results[name] = [dict(zip(names, row, strict=True)) for row in rows]

    # every event is within the last 30 days (T0 - 10 hours)
    assert sum(r["cost_nanos"] for r in results["spend_by_org_per_day"]) == sum(
        r["cost_nanos"] for r in everything
    )
    assert all(r["cost_usd"] * 10**9 == r["cost_nanos"] for r in results["spend_by_org_per_day"])
    assert results["unpriced_usage"] == [
        {
            "org_id": unpriced["event"]["org_id"],
            "provider": "anthropic",
            "model": "mystery-1",
            "events": 1,
            "billed_tokens": 100 + 300 % 97 + 10 + 300 % 13,
            "first_seen": unpriced["event"]["occurred_at"],
            "last_seen": unpriced["event"]["occurred_at"],
        }
    ]
    refusals = {(r["decision"], r["refusals"]) for r in results["refusals_by_decision"]}
    assert refusals == {("budget_exceeded", 2), ("throttled", 1)}
    assert results["latest_budget_state"][0]["last_seq"] == 2
    month_start = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    this_month = [r for r in everything if r["event"]["occurred_at"] >= month_start]
    by_secret: defaultdict[tuple[str, str], int] = defaultdict(int)
    for r in this_month:
        by_secret[(r["event"]["org_id"], r["event"]["secret_id"])] += r["cost_nanos"]
    top = results["top_secrets_this_month"]
    assert {(r["org_id"], r["secret_id"]): r["cost_nanos"] for r in top} == dict(by_secret)
    assert [r["cost_nanos"] for r in top] == sorted(by_secret.values(), reverse=True)
    cache = results["cache_savings_this_month"]
    assert sum(r["cached_tokens"] for r in cache) == 40 * len(
        [r for r in this_month if r["event"]["cache_read_tokens"]]
    )


def test_an_empty_result_still_names_its_columns(client: Any) -> None:
    names, rows = run_query(client, EXAMPLE_QUERIES["unpriced_usage"])
    assert rows == []
    assert names[:3] == ["org_id", "provider", "model"]


def test_readme_shows_every_example_query_verbatim() -> None:
    readme = (REPO / "infra" / "clickhouse" / "README.md").read_text()
    for name, sql in {**EXAMPLE_QUERIES, "rollup_drift": ROLLUP_DRIFT}.items():
        assert sql in readme, f"{name} is not in infra/clickhouse/README.md as in query.py"


# -- connecting ---------------------------------------------------------------------

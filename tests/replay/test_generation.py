"""spendbus replay on a real broker, real workers and the real ClickHouse engine.

* a replay after a crash-ridden run (kill -9 mid-stream) equals the clean run;
* a replay after a price correction reports exactly the expected spend changes,
  and after the cutover the shared alert topic still holds each alert once (each
  generation's alert publisher sends what its store records and the topic lacks).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from aggregator.replay.generations import alert_ids, group_progress, read_switch
from aggregator.replay.snapshots import ledger_ends
from schemas.budgets import budgets_from_yaml
from schemas.codec import BUDGET_POLICY, PRICE_TABLE
from schemas.ids import counter_key
from schemas.pricing import PriceBook, price_table_from_yaml
from spendbus.stack.compacted import publish
from tests.pipeline_kit import PRICES_YAML, Pipeline, price_book
from tests.replay.kit import make_events, publish_events, replay_beside

pytestmark = pytest.mark.integration


def _wait_live_caught_up(pipeline: Pipeline, timeout: float = 180.0) -> None:
    ends = asyncio.run(ledger_ends(pipeline.bootstrap, pipeline.topics))
    deadline = time.monotonic() + timeout
    while not asyncio.run(group_progress(pipeline.bootstrap, pipeline.topics)).past(ends):
        assert time.monotonic() < deadline, "the live generation did not catch up"
        time.sleep(0.5)
    time.sleep(1.0)  # the last batch's verdicts


def _recorded_alerts(pipeline: Pipeline, events: int) -> set[str]:
    """The alert ids of the serving store's ``alerts`` view, once it holds ``events``."""
    pipeline.sql_until(
        "SELECT count() FROM usage_events", lambda rows: int(rows[0][0]) >= events, timeout=120
    )
    return {row[0] for row in pipeline.sql("SELECT alert_id FROM alerts")}


def _sent_alerts(pipeline: Pipeline, wanted: set[str], timeout: float = 60.0) -> list[str]:
    """The shared alert topic's ids once they include ``wanted`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        shared = asyncio.run(alert_ids(pipeline.bootstrap, pipeline.topics.shared_alerts))
        if set(shared) >= wanted or time.monotonic() > deadline:
            time.sleep(1.0)  # a repeat would come with the next polls
            return asyncio.run(alert_ids(pipeline.bootstrap, pipeline.topics.shared_alerts))
        time.sleep(0.5)


def test_a_replay_after_a_crash_ridden_run_equals_the_clean_run(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    events = make_events(900, seed=21)
    for round_ in range(3):
        publish_events(pipeline, events[round_ * 300 : (round_ + 1) * 300] + events[:5])
        time.sleep(1.5)  # part-way through the round
        pipeline.worker.kill()  # kill -9: no clean shutdown, no final commit
        pipeline.worker.start(timeout=180)
    _wait_live_caught_up(pipeline)

    run = replay_beside(pipeline, tmp_path, "g2")
    run.start()
    try:
        progress: list[tuple[int, int, int]] = []
        run.wait_caught_up(lambda done, total, lag: progress.append((done, total, lag)))
        report = run.report()
    finally:
        run.stop()
    assert progress and progress[-1][0] == progress[-1][1] == 915 and progress[-1][2] == 0
    assert report.records == 915 and report.charged == 900 and report.duplicates == 15
    assert report.vs_ledger == [] and report.vs_clickhouse == []
    assert report.vs_previous == []  # the crash-ridden generation equals the clean rebuild
    assert report.org_changes == []
    assert report.counters == 12  # 9 secrets (month) + 3 orgs (total)
    assert report.consistent


def _corrected_prices() -> tuple[PriceBook, list[tuple[bytes, bytes]]]:
    """The same price version with gpt-4o-mini's output price fixed (0.60 -> 2.40 / MTok)."""
    corrected = PRICES_YAML.replace('output_per_mtok: "0.60"', 'output_per_mtok: "2.40"')
    assert corrected != PRICES_YAML
    table = price_table_from_yaml(yaml.safe_load(corrected), source="corrected")
    tables = table if isinstance(table, list) else [table]
    records = [(t.version.encode(), PRICE_TABLE.encode(t.to_record())) for t in tables]
    return PriceBook(tables), records


def test_a_price_correction_replay_reports_exactly_the_changed_spend_and_alerts_stay_once(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    events = make_events(600, seed=33)
    publish_events(pipeline, events)
    _wait_live_caught_up(pipeline)
    recorded = _recorded_alerts(pipeline, len(events))
    alerts_before = _sent_alerts(pipeline, recorded)
    assert alerts_before and len(alerts_before) == len(set(alerts_before))
    assert set(alerts_before) == recorded  # what ClickHouse records is what went out

    corrected_book, records = _corrected_prices()
    asyncio.run(publish(pipeline.bootstrap, pipeline.topics.pricing, records))
    # a budget added after the events: only a replay counts history in it, so only g2
    # crosses its threshold, and the relay must forward exactly those alerts
    late_budget = budgets_from_yaml(
        yaml.safe_load(
            '- {id: org-usd, scope: org, window: month, limit_usd: "1", alert_at: [0.5]}'
        )
    )[0]
    asyncio.run(
        publish(
            pipeline.bootstrap,
            pipeline.topics.budget_policies,
            [(b"org-usd", BUDGET_POLICY.encode(late_budget.to_record()))],
        )
    )
    old_book = price_book()
    expected: dict[str, int] = defaultdict(int)
    for e in events:
        delta = corrected_book.price_event(e).cost_nanos - old_book.price_event(e).cost_nanos
        expected[e["org_id"]] += delta
    assert all(delta > 0 for delta in expected.values())  # every org used gpt-4o-mini

    run = replay_beside(pipeline, tmp_path, "g2")
    run.start()
    try:
        run.wait_caught_up()
        report = run.report(settle_seconds=15)
        assert report.consistent, (report.vs_ledger[:5], (report.vs_clickhouse or [])[:5])
        assert {c.org_id: c.delta_nanos for c in report.org_changes} == dict(expected)
        before: defaultdict[str, int] = defaultdict(int)
        for e in events:
            before[e["org_id"]] += old_book.price_event(e).cost_nanos
        assert {c.org_id: c.before_nanos for c in report.org_changes} == dict(before)
        # only USD spend changed: tokens and requests are the same counters
        new_counters = {counter_key("org-usd", (org,)) for org in expected}
        assert {d.counter_key for d in report.vs_previous if d.field == "counter"} == new_counters
        changed = [d for d in report.vs_previous if d.field != "counter"]
        assert changed and {d.field for d in changed} == {"spent_nanos"}
        # exactly the counters that gpt-4o-mini events count in (the org-total budget limits
        # tokens, but its counter carries the USD spend too)
        gpt = [e for e in events if e["model"] == "gpt-4o-mini"]
        assert {d.counter_key for d in changed} == {
            counter_key("per-secret", (e["org_id"], e["secret_id"])) for e in gpt
        } | {counter_key("org-total", (e["org_id"],)) for e in gpt}

        run.cutover(pipeline.worker)
    finally:
        run.stop()
    switch = asyncio.run(read_switch(pipeline.bootstrap, pipeline.topics))
    assert switch is not None and (switch.generation, switch.previous) == ("g2", "")
    assert switch.previous_retired
    # the serving slot now runs g2: new events reach g2's verdicts
    more = make_events(30, seed=34, start=600)
    publish_events(pipeline, more)
    g2 = pipeline.topics.of_generation("g2")
    ends = asyncio.run(ledger_ends(pipeline.bootstrap, pipeline.topics))
    deadline = time.monotonic() + 120
    while not asyncio.run(group_progress(pipeline.bootstrap, g2)).past(ends):
        assert time.monotonic() < deadline, pipeline.worker.log_tail()
        time.sleep(0.5)
    # alerts: g2's store records every threshold history crossed (the serving worker's
    # store is g2's now); its publisher sent only those the shared topic lacked
    staged = _recorded_alerts(pipeline, len(events) + len(more))
    assert set(alerts_before) <= staged
    shared = _sent_alerts(pipeline, staged)
    assert staged <= set(shared)
    assert len(shared) == len(set(shared)), "an alert was sent twice"
    forwarded = set(shared) - set(alerts_before)
    assert forwarded == {f"{key}|m:2026-11|0.5" for key in new_counters}

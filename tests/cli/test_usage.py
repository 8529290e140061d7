"""`spendbus usage` without a request context (issue 35): every live counter, an org's or
a budget's, paged, as a table that wraps instead of cutting, JSON or CSV; the raise
shown; a forecast only when it falls within the period."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from schemas.budgets import Budget
from schemas.codec import BUDGET_POLICY, VERDICT
from schemas.periods import parse_window
from schemas.topics import Topics
from spendbus.cli import cli
from spendbus.commands.usage_view import burn_usd, live_counters
from spendbus.settings import load_settings
from spendbus.stack.compacted import publish
from tests.gateway.kit import exhausted_verdict

pytestmark = pytest.mark.integration

LONG = "acme-research-platform-monthly-spend"


def _verdict(budget_id: str, org: str, spent: int) -> dict[str, Any]:
    budget = Budget(
        budget_id=budget_id,
        scope="org",
        window=parse_window("month"),
        match={},
        limit_nanos=500_000_000_000,
    )
    v = exhausted_verdict(budget, [org])
    now = datetime.now(UTC)
    return v | {
        "state": "ok",
        "spent_nanos": spent,
        # an hour's burn of $0.0004: at it, $500 runs out decades from now
        "burn_nanos": 400_000,
        "burn_tokens": 10,
        "burn_requests": 1,
        "burn_span_us": 3_600_000_000,
        "exhausts_at": now + timedelta(days=365 * 37),
    }


def _run(env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(cli, ["usage", *args], env=env, catch_exceptions=False)


def test_usage_lists_counters_by_org_and_budget_paged_in_every_format(
    kafka_bootstrap: str, topics: Topics
) -> None:
    verdicts = [
        _verdict(LONG, "acme", 1_000_000_000),
        _verdict("other-monthly", "acme", 2_000_000_000),
        _verdict(LONG, "globex", 3_000_000_000),
    ]
    records: list[tuple[bytes, bytes | None]] = [
        (v["counter_key"].encode(), VERDICT.encode(v)) for v in verdicts
    ]
    asyncio.run(publish(kafka_bootstrap, topics.budget_verdicts, records))
    env = {"KAFKA_BOOTSTRAP": kafka_bootstrap, "SPENDBUS_TOPIC_PREFIX": topics.prefix}

    everything = json.loads(_run(env, "--json").stdout)
    assert len(everything) == 3
    # a month budget that would run out in decades does not run out this period
    assert all(r["exhausts_at"] is None for r in everything)
    acme = json.loads(_run(env, "--org-id", "acme", "--json").stdout)
    assert sorted(r["budget_id"] for r in acme) == sorted([LONG, "other-monthly"])
    by_budget = json.loads(_run(env, "--budget", LONG, "--json").stdout)
    assert sorted(r["scope_values"][0] for r in by_budget) == ["acme", "globex"]

    page = _run(env, "--json", "--limit", "2")
    assert len(json.loads(page.stdout)) == 2 and "--offset 2" in page.stderr
    rest = _run(env, "--json", "--limit", "2", "--offset", "2")
    assert len(json.loads(rest.stdout)) == 1

    rows = list(csv.DictReader(io.StringIO(_run(env, "--csv").stdout)))
    assert len(rows) == 3 and {"budget_id", "raise", "exhausts_at"} <= set(rows[0])

    table = _run({**env, "COLUMNS": "80"}, "--org-id", "acme").stdout
    assert "…" not in table and "raise" in table and "acme" in table
    assert "$0.0004" in table and "$0.00 " not in table  # the burn, told from zero
    assert "2063" not in table and str(datetime.now(UTC).year + 37) not in table


def test_burn_is_shown_at_the_precision_that_tells_it_from_zero() -> None:
    assert burn_usd(400_000) == "$0.0004"
    assert burn_usd(12_340_000_000) == "$12.34"
    assert burn_usd(0) == "$0"


def test_a_rolling_counter_shows_only_the_spend_still_in_its_window(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """No verdict follows a rolling counter's last event: `spendbus usage` drops the
    buckets that left the window by its own clock, tells the state again (the budget's
    thresholds) and, while exhausted, when the counter drops under its limit."""
    budget = Budget(
        budget_id="two-minutes",
        scope="org",
        window=parse_window("rolling:2m"),
        match={},
        limit_nanos=1_000_000_000,
        alert_at=(0.5,),
    )
    as_of = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)  # on a 2.5 s bucket boundary
    verdict = exhausted_verdict(budget, ["acme"]) | {
        "period": "r:2m",
        "reset_at": None,
        "as_of": as_of,
        "emitted_at": as_of,
        "spent_nanos": 1_100_000_000,
        # $0.30 forty buckets before as_of's, $0.80 in it
        "bucket_ages": [40, 0],
        "bucket_nanos": [300_000_000, 800_000_000],
        "bucket_tokens": [0, 0],
        "bucket_requests": [0, 0],
    }
    asyncio.run(
        publish(
            kafka_bootstrap,
            topics.budget_verdicts,
            [(verdict["counter_key"].encode(), VERDICT.encode(verdict))],
        )
    )
    asyncio.run(
        publish(
            kafka_bootstrap,
            topics.budget_policies,
            [(b"two-minutes", BUDGET_POLICY.encode(budget.to_record(as_of)))],
        )
    )
    settings = load_settings(
        {"KAFKA_BOOTSTRAP": kafka_bootstrap, "SPENDBUS_TOPIC_PREFIX": topics.prefix}
    )

    def row_at(now: datetime) -> dict[str, Any]:
        (row,) = live_counters(settings, kafka_bootstrap, org_id="acme", budget_ids=(), now=now)
        return row

    exhausted = row_at(as_of + timedelta(seconds=1))
    assert exhausted["spent_nanos"] == 1_100_000_000 and exhausted["state"] == "exceeded"
    # the $0.30 bucket leaves 48 - 40 buckets of 2.5 s after as_of's bucket began
    assert exhausted["reset_at"] == "2026-12-07T10:00:20Z"
    alerting = row_at(as_of + timedelta(seconds=20))
    assert alerting["spent_nanos"] == 800_000_000 and alerting["state"] == "alert"
    assert alerting["reset_at"] is None
    quiet = row_at(as_of + timedelta(minutes=2))
    assert quiet["spent_nanos"] == 0 and quiet["state"] == "ok"

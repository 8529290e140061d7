"""Budgets' ``rate:`` and seed 001's ``job_budget`` shorthand: parsed from YAML, refused with
errors naming the field, carried on the BudgetPolicy record (v2) and read from v1 records."""

from __future__ import annotations

from datetime import UTC, datetime
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas.avro_schemas import fingerprint, history_versions
from schemas.budgets import DEFAULT_REQUESTS_PER_JOB, Budget, RateLimit, budget_from_yaml
from schemas.codec import BUDGET_POLICY, MAGIC
from schemas.errors import ConfigError

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def parse(**item: object) -> Budget:
    return budget_from_yaml({"id": "b", "scope": "secret", **item}, source="budgets.yaml")


def test_rate_limits_parse_and_list_their_windows() -> None:
    b = parse(rate={"requests_per_minute": 600, "tokens_per_second": 2000})
    assert b.rate == RateLimit(requests_per_minute=600, tokens_per_second=2000)
    assert b.rate.limits() == [("requests", 600, 60), ("tokens", 2000, 1)]
    assert b.window.spec == "total"  # a budget with only a rate needs no window
    assert (b.limit_nanos, b.limit_tokens, b.limit_requests) == (None, None, None)
    both = parse(window="day", limit_usd="5", rate={"requests_per_second": 3})
    assert both.limit_nanos == 5 * 10**9 and both.rate is not None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"rate": {}}, r"field 'rate': needs at least one of requests_per_second"),
        ({"rate": {"requests_per_minute": 0}}, r"field 'rate.requests_per_minute'"),
        ({"rate": {"requests_per_hour": 5}}, r"field 'rate.requests_per_hour'"),
        (
            {"window": "day"},
            r"field '<budget>': needs at least one of limit_usd, limit_tokens, limit_requests, rate",
        ),
    ],
)
def test_bad_rates_name_the_field(item: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"budgets.yaml: budget 'b': " + message):
        parse(**item)


def test_job_budget_shorthand_defaults_to_500_requests_per_job() -> None:
    b = budget_from_yaml({"id": "jobs", "job_budget": True})
    assert (b.scope, b.window.spec, b.limit_requests) == ("session", "total", 500)
    assert DEFAULT_REQUESTS_PER_JOB == 500 and b.action == "enforce"
    assert b.refusal == "job_budget_exceeded"
    n = budget_from_yaml({"id": "jobs", "job_budget": {"requests_per_job": 40}, "limit_usd": "2"})
    assert (n.limit_requests, n.limit_nanos) == (40, 2 * 10**9)
    off = budget_from_yaml({"id": "jobs", "job_budget": False})
    assert off.action == "warn" and off.limit_requests == 500  # the flag off: counted, not refused


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"job_budget": True, "scope": "org"}, r"field 'job_budget': job_budget sets scope"),
        ({"job_budget": {"requests_per_job": 0}}, r"field 'job_budget.requests_per_job'"),
        ({"job_budget": {"per_job": 3}}, r"field 'job_budget.per_job'"),
    ],
)
def test_bad_job_budgets_name_the_field(item: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"budget 'jobs': " + message):
        budget_from_yaml({"id": "jobs", **item})


def test_the_rate_travels_on_the_policy_record() -> None:
    b = parse(rate={"requests_per_second": 5, "tokens_per_minute": 90_000}, limit_requests=10)
    decoded = BUDGET_POLICY.decode(BUDGET_POLICY.encode(b.to_record(NOW)))
    assert Budget.from_record(decoded) == b
    none = parse(limit_requests=10)
    assert (
        Budget.from_record(BUDGET_POLICY.decode(BUDGET_POLICY.encode(none.to_record(NOW)))) == none
    )


def test_a_v1_policy_record_reads_as_a_budget_without_a_rate() -> None:
    v1 = history_versions("BudgetPolicy")[0]
    assert "rate" not in {f["name"] for f in v1["fields"]}
    record = parse(limit_requests=10).to_record(NOW)
    del record["rate"]
    buf = BytesIO()
    buf.write(MAGIC + fingerprint(v1))
    schemaless_writer(buf, parse_schema(v1), record)
    decoded = BUDGET_POLICY.decode(buf.getvalue())
    assert decoded["rate"] is None
    assert Budget.from_record(decoded).rate is None


def test_the_readme_budget_example_parses() -> None:
    """The budgets YAML in README.md ("Using it") is a valid budgets file."""
    from pathlib import Path

    import yaml

    from schemas.budgets import budgets_from_yaml

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("```yaml", text.index("Budgets (YAML")) + len("```yaml")
    budgets = budgets_from_yaml(yaml.safe_load(text[start : text.index("```", start)]))
    assert [(b.budget_id, b.scope) for b in budgets] == [
        ("acme-monthly", "org"),
        ("acme-cycle", "org"),
        ("per-job", "session"),
    ]
    assert budgets[0].rate == RateLimit(requests_per_minute=600, tokens_per_minute=100_000)
    assert budgets[1].window.calendar == {"timezone": "America/New_York", "month_start_day": 15}
    assert budgets[2].limit_requests == DEFAULT_REQUESTS_PER_JOB

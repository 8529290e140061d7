"""Analyst queries: a small runner and the example queries of infra/clickhouse/README.md.

Every example is exact without merges: rollups and usage_events are read with
sum() + GROUP BY (never FINAL), budget_state with argMax(..., seq). Money is
kept in integer nano-dollars; ``cost_usd`` is the same amount as Decimal(38, 9).
A test checks that README.md shows each query verbatim and runs them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from aggregator.sink.errors import translate


def run_query(
    client: Client, sql: str, parameters: Mapping[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql``; returns (column names, rows). ``parameters`` bind ``{name:Type}`` placeholders."""
    params = dict(parameters) if parameters else None
    try:
        result = client.query(sql, parameters=params)
        names = list(result.column_names)
        rows = [tuple(row) for row in result.result_rows]
        if not names:
            # chdb returns no Native block at all for an empty result, so no
            # column names either: ask for them without running the query
            described = client.query(f"DESCRIBE ({sql})", parameters=params)
            names = [row[0] for row in described.result_rows]
    except Exception as exc:
        raise translate(exc, "running an analyst query") from exc
    return names, rows


SPEND_BY_ORG_PER_DAY: Final = """\
SELECT
    day,
    org_id,
    sum(events) AS events,
    sum(billed_tokens) AS billed_tokens,
    sum(cost_nanos) AS cost_nanos,
    toDecimal128(cost_nanos, 9) / 1000000000 AS cost_usd
FROM spend_daily
WHERE day >= toDate(now('UTC')) - 30
GROUP BY day, org_id
ORDER BY day, org_id"""

TOP_SECRETS_THIS_MONTH: Final = """\
SELECT
    org_id,
    secret_id,
    sum(events) AS events,
    sum(billed_tokens) AS billed_tokens,
    sum(cost_nanos) AS cost_nanos,
    toDecimal128(cost_nanos, 9) / 1000000000 AS cost_usd
FROM spend_daily
WHERE day >= toStartOfMonth(toDate(now('UTC')))
GROUP BY org_id, secret_id
ORDER BY cost_nanos DESC, org_id, secret_id
LIMIT 20"""

CACHE_SAVINGS_THIS_MONTH: Final = """\
SELECT
    org_id,
    provider,
    model,
    sum(input_tokens + cache_read_tokens + cache_write_tokens) AS prompt_tokens,
    sum(cache_read_tokens) AS cached_tokens,
    sum(cache_write_tokens) AS cache_writes,
    round(cached_tokens / prompt_tokens, 4) AS cache_hit_ratio,
    sum(cost_nanos) AS cost_nanos
FROM spend_daily
WHERE day >= toStartOfMonth(toDate(now('UTC')))
GROUP BY org_id, provider, model
HAVING cached_tokens > 0
ORDER BY cached_tokens DESC, org_id, provider, model"""

UNPRICED_USAGE: Final = """\
SELECT
    org_id,
    provider,
    model,
    count() AS events,
    sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens) AS billed_tokens,
    min(occurred_at) AS first_seen,
    max(occurred_at) AS last_seen
FROM usage_events
WHERE unpriced
GROUP BY org_id, provider, model
ORDER BY events DESC, org_id, provider, model"""

REFUSALS_BY_DECISION: Final = """\
SELECT
    decision,
    outcome,
    count() AS refusals,
    uniqExact(org_id) AS orgs,
    groupUniqArray(10)(decision_budget_id) AS budgets,
    groupUniqArray(status_code) AS status_codes
FROM decisions
WHERE refused AND occurred_at >= now64(6, 'UTC') - INTERVAL 30 DAY
GROUP BY decision, outcome
ORDER BY refusals DESC, decision, outcome"""

LATEST_BUDGET_STATE: Final = """\
SELECT
    counter_key,
    argMax(budget_id, seq) AS budget_id,
    argMax(scope_values, seq) AS scope_values,
    argMax(period, seq) AS period,
    argMax(state, seq) AS state,
    argMax(spent_nanos, seq) AS spent_nanos,
    argMax(limit_nanos, seq) AS limit_nanos,
    argMax(spent_tokens, seq) AS spent_tokens,
    argMax(limit_tokens, seq) AS limit_tokens,
    argMax(as_of, seq) AS as_of,
    max(seq) AS last_seq
FROM budget_state
GROUP BY counter_key
ORDER BY counter_key"""

#: days on which spend_daily disagrees with usage_events: empty unless a rollup
#: missed an insert (see infra/clickhouse/README.md, "Checking and rebuilding a rollup")
ROLLUP_DRIFT: Final = """\
SELECT
    day,
    e.events AS table_events,
    r.events AS rollup_events,
    e.cost_nanos AS table_cost_nanos,
    r.cost_nanos AS rollup_cost_nanos,
    'spend_daily' AS rollup
FROM
(
    SELECT toDate(occurred_at, 'UTC') AS day, count() AS events, sum(cost_nanos) AS cost_nanos
    FROM usage_events
    GROUP BY day
) AS e
FULL OUTER JOIN
(
    SELECT day, sum(events) AS events, sum(cost_nanos) AS cost_nanos
    FROM spend_daily
    GROUP BY day
) AS r USING (day)
WHERE e.events != r.events OR e.cost_nanos != r.cost_nanos
UNION ALL
SELECT
    day,
    e.events AS table_events,
    r.events AS rollup_events,
    e.cost_nanos AS table_cost_nanos,
    r.cost_nanos AS rollup_cost_nanos,
    concat('spend_daily_by_dimension:', dimension) AS rollup
FROM
(
    SELECT toDate(occurred_at, 'UTC') AS day, count() AS events, sum(cost_nanos) AS cost_nanos
    FROM usage_events
    GROUP BY day
) AS e
ARRAY JOIN ['project', 'secret', 'user', 'model'] AS dimension
FULL OUTER JOIN
(
    SELECT day, dimension, sum(events) AS events, sum(cost_nanos) AS cost_nanos
    FROM spend_daily_by_dimension
    GROUP BY day, dimension
) AS r USING (day, dimension)
WHERE e.events != r.events OR e.cost_nanos != r.cost_nanos
ORDER BY day, rollup"""

#: name -> SQL of every example query (infra/clickhouse/README.md shows each verbatim)
EXAMPLE_QUERIES: Final = {
    "spend_by_org_per_day": SPEND_BY_ORG_PER_DAY,
    "top_secrets_this_month": TOP_SECRETS_THIS_MONTH,
    "cache_savings_this_month": CACHE_SAVINGS_THIS_MONTH,
    "unpriced_usage": UNPRICED_USAGE,
    "refusals_by_decision": REFUSALS_BY_DECISION,
    "latest_budget_state": LATEST_BUDGET_STATE,
}

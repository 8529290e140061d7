-- spend_daily_by_dimension: spend per (org, UTC day, dimension, value), one row set per
-- dimension (project, secret, user, model), fed by a materialized view from usage_events.
--
-- spend_daily's key holds every dimension at once, so a report by one of them (a day ×
-- user report of a large org) reads nearly one row per event. Here each dimension has
-- its own rows: a by-user report reads (org, days, users) rows. Every event counts once
-- under each dimension (an absent project or user is ''), so any one dimension's rows sum
-- to the org's exact total: a by-org report reads the `model` rows, the fewest.
--
-- SummingMergeTree as spend_daily: queries sum() and GROUP BY, exact merged or not.
--
-- The view is created by apply_schema (aggregator/sink/backfill.py), which fills the table
-- from the usage_events parts the view cannot have seen, exactly once, on a store that
-- already holds events (infra/clickhouse/README.md, "A new rollup on a store with history").
CREATE TABLE IF NOT EXISTS spend_daily_by_dimension
(
    day           Date,
    org_id        String,
    dimension     LowCardinality(String),
    value         String,
    events        UInt64,
    billed_tokens Int64,
    cost_nanos    Int64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (dimension, org_id, day, value)
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS spend_daily_by_dimension_mv TO spend_daily_by_dimension AS
SELECT
    toDate(occurred_at, 'UTC') AS day,
    org_id,
    pair.1 AS dimension,
    pair.2 AS value,
    count() AS events,
    sum(input_tokens + cache_read_tokens + cache_write_tokens + output_tokens) AS billed_tokens,
    sum(cost_nanos) AS cost_nanos
FROM usage_events
ARRAY JOIN
    [
        ('project', ifNull(project_id, '')),
        ('secret', secret_id),
        ('user', ifNull(user_id, '')),
        ('model', toString(model))
    ] AS pair
GROUP BY day, org_id, dimension, value;

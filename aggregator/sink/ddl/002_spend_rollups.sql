-- spend_hourly / spend_daily: spend per (org, secret, project, grant, user, provider,
-- model) and per hour or per UTC day, fed by materialized views from usage_events.
--
-- SummingMergeTree adds up rows with the same key when it merges parts, which may
-- be never: a key can have several partial rows at any moment. Every query must
-- therefore still sum() and GROUP BY; that is exact whether or not merges ran.
--
-- Ids are canonical (as stored in usage_events); an absent optional id is '' here
-- (budgets count '' as absent too), so the key has no Nullable column.
--
-- non_replicated_deduplication_window lets a retried insert into usage_events
-- (same insert_deduplication_token) reach these tables once: ClickHouse derives
-- the view's block id from the source token and drops the repeat.
--
-- Created without POPULATE: a view only sees inserts made after it exists. To
-- (re)build a rollup from usage_events, see infra/clickhouse/README.md.
CREATE TABLE IF NOT EXISTS spend_hourly
(
    hour                  DateTime('UTC'),
    org_id                String,
    secret_id             String,
    project_id            String,
    grant_id              String,
    user_id               String,
    provider              LowCardinality(String),
    model                 LowCardinality(String),
    events                UInt64,
    refused_events        UInt64,
    estimated_events      UInt64,
    unpriced_events       UInt64,
    input_tokens          Int64,
    cache_read_tokens     Int64,
    cache_write_tokens    Int64,
    cache_write_1h_tokens Int64,
    output_tokens         Int64,
    reasoning_tokens      Int64,
    billed_tokens         Int64,
    cost_nanos            Int64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (org_id, hour, secret_id, project_id, grant_id, user_id, provider, model)
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS spend_hourly_mv TO spend_hourly AS
SELECT
    toStartOfHour(toDateTime(occurred_at, 'UTC')) AS hour,
    org_id,
    secret_id,
    ifNull(project_id, '') AS project_id,
    ifNull(grant_id, '') AS grant_id,
    ifNull(user_id, '') AS user_id,
    provider,
    model,
    count() AS events,
    countIf(outcome IN ('refused', 'failed_closed')) AS refused_events,
    countIf(usage_source = 'estimated') AS estimated_events,
    countIf(unpriced) AS unpriced_events,
    sum(input_tokens) AS input_tokens,
    sum(cache_read_tokens) AS cache_read_tokens,
    sum(cache_write_tokens) AS cache_write_tokens,
    sum(cache_write_1h_tokens) AS cache_write_1h_tokens,
    sum(output_tokens) AS output_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    -- the sums above (an alias shadows its column here), so no sum() around them
    input_tokens + cache_read_tokens + cache_write_tokens + output_tokens AS billed_tokens,
    sum(cost_nanos) AS cost_nanos
FROM usage_events
GROUP BY hour, org_id, secret_id, project_id, grant_id, user_id, provider, model;

CREATE TABLE IF NOT EXISTS spend_daily
(
    day                   Date,
    org_id                String,
    secret_id             String,
    project_id            String,
    grant_id              String,
    user_id               String,
    provider              LowCardinality(String),
    model                 LowCardinality(String),
    events                UInt64,
    refused_events        UInt64,
    estimated_events      UInt64,
    unpriced_events       UInt64,
    input_tokens          Int64,
    cache_read_tokens     Int64,
    cache_write_tokens    Int64,
    cache_write_1h_tokens Int64,
    output_tokens         Int64,
    reasoning_tokens      Int64,
    billed_tokens         Int64,
    cost_nanos            Int64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (org_id, day, secret_id, project_id, grant_id, user_id, provider, model)
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS spend_daily_mv TO spend_daily AS
SELECT
    toDate(occurred_at, 'UTC') AS day,
    org_id,
    secret_id,
    ifNull(project_id, '') AS project_id,
    ifNull(grant_id, '') AS grant_id,
    ifNull(user_id, '') AS user_id,
    provider,
    model,
    count() AS events,
    countIf(outcome IN ('refused', 'failed_closed')) AS refused_events,
    countIf(usage_source = 'estimated') AS estimated_events,
    countIf(unpriced) AS unpriced_events,
    sum(input_tokens) AS input_tokens,
    sum(cache_read_tokens) AS cache_read_tokens,
    sum(cache_write_tokens) AS cache_write_tokens,
    sum(cache_write_1h_tokens) AS cache_write_1h_tokens,
    sum(output_tokens) AS output_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    -- the sums above (an alias shadows its column here), so no sum() around them
    input_tokens + cache_read_tokens + cache_write_tokens + output_tokens AS billed_tokens,
    sum(cost_nanos) AS cost_nanos
FROM usage_events
GROUP BY day, org_id, secret_id, project_id, grant_id, user_id, provider, model;

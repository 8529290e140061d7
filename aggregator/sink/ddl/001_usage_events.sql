-- usage_events: one row per priced UsageEvent (topic usage.priced), the analysts' ledger.
--
-- Dedup key: (source_partition, source_offset), the usage.raw position of the event.
-- The sink (aggregator/sink) never inserts a position twice, so a plain MergeTree
-- holds each event once and sum() is exact with no FINAL and no merge.
--
-- Scope ids (org, secret, project, grant, user, session, groups) are stored in
-- their canonical form (schemas.ids.canonical_id: blanks trimmed, user ids
-- lower-cased), the form the budget counters use; an optional id that is empty
-- once canonical is NULL.
--
-- The `fences` projection keeps max(source_offset) per (source_partition, month):
-- the sink's idempotency fences, read without scanning the table. A projection is
-- written inside each part, so it is exactly as durable as the rows it describes.
--
-- non_replicated_deduplication_window: the sink tags each insert with an
-- insert_deduplication_token, so retrying an insert whose outcome is unknown
-- (it failed after committing) is dropped by ClickHouse instead of doubling.
CREATE TABLE IF NOT EXISTS usage_events
(
    event_id              String,
    occurred_at           DateTime64(6, 'UTC'),
    provider              LowCardinality(String),
    api                   LowCardinality(String),
    model                 LowCardinality(String),
    secret_id             String,
    org_id                String,
    project_id            Nullable(String),
    grant_id              Nullable(String),
    permission_id         Nullable(String),
    user_id               Nullable(String),
    groups                Array(String),
    session_id            Nullable(String),
    tags                  Map(String, String),
    input_tokens          Int64,
    cache_read_tokens     Int64,
    cache_write_tokens    Int64,
    cache_write_1h_tokens Int64,
    output_tokens         Int64,
    reasoning_tokens      Int64,
    usage_source          LowCardinality(String),
    estimate_reason       Nullable(String),
    outcome               LowCardinality(String),
    decision              LowCardinality(String),
    decision_budget_id    Nullable(String),
    status_code           UInt16,
    stream                Bool,
    gateway_id            LowCardinality(String),
    request_id            Nullable(String),
    latency_ms            Nullable(Int32),
    cost_nanos            Int64,
    price_version         LowCardinality(Nullable(String)),
    price_match           LowCardinality(Nullable(String)),
    unpriced              Bool,
    source_partition      Int32,
    source_offset         Int64,
    priced_at             DateTime64(6, 'UTC'),
    inserted_at           DateTime64(3, 'UTC') DEFAULT now64(3),
    PROJECTION fences
    (
        SELECT source_partition, toYYYYMM(occurred_at), max(source_offset)
        GROUP BY source_partition, toYYYYMM(occurred_at)
    )
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (org_id, occurred_at, event_id)
SETTINGS non_replicated_deduplication_window = 1000;

-- budget_state: the verdicts of topic budget.verdicts (one Verdict per counter update).
--
-- Dedup key: (counter_key, period), version seq. ReplacingMergeTree(seq) keeps the
-- row with the highest seq per key once parts merge, which may be never, so
-- storage can hold several rows per key at any moment. Queries never rely on it
-- (no FINAL): they take argMax(<column>, seq) GROUP BY counter_key (the live
-- verdict of each counter) or GROUP BY counter_key, period (its last verdict in
-- each period). A verdict written twice has the same seq and the same values,
-- so argMax is unaffected by duplicates.
CREATE TABLE IF NOT EXISTS budget_state
(
    counter_key     String,
    budget_id       LowCardinality(String),
    scope           LowCardinality(String),
    scope_values    Array(String),
    period          LowCardinality(String),
    state           LowCardinality(String),
    spent_nanos     Int64,
    spent_tokens    Int64,
    spent_requests  Int64,
    limit_nanos     Nullable(Int64),
    limit_tokens    Nullable(Int64),
    limit_requests  Nullable(Int64),
    action          LowCardinality(String),
    refusal         LowCardinality(String),
    reset_at        Nullable(DateTime64(6, 'UTC')),
    as_of           DateTime64(6, 'UTC'),
    seq             Int64,
    emitted_at      DateTime64(6, 'UTC'),
    inserted_at     DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(seq)
ORDER BY (counter_key, period);

-- budget_raises: every temporary raise (`spendbus budgets raise`), the audit trail in SQL.
--
-- A copy of the compacted topic budget.raises (the truth; key raise_id): each worker that
-- owns a store writes a raise's row when it first reads it and again when it is revoked
-- (aggregator/alerts/raise_audit.py). ReplacingMergeTree keeps the newest row per raise once parts
-- merge; read it with FINAL or `LIMIT 1 BY raise_id` after `ORDER BY recorded_at DESC`.
-- scope_values empty: every counter of the budget. mode by: added to the base limit;
-- to: the limit while the raise lasts. It applies from starts_at until until (or
-- revoked_at, when earlier).
CREATE TABLE IF NOT EXISTS budget_raises
(
    raise_id        String,
    budget_id       LowCardinality(String),
    scope_values    Array(String),
    mode            LowCardinality(String),
    raise_nanos     Nullable(Int64),
    raise_tokens    Nullable(Int64),
    raise_requests  Nullable(Int64),
    starts_at       DateTime64(6, 'UTC'),
    until           DateTime64(6, 'UTC'),
    revoked_at      Nullable(DateTime64(6, 'UTC')),
    reason          String,
    created_by      String,
    recorded_at     DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(recorded_at)
ORDER BY raise_id;

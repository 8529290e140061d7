-- admin_audit: every change the admin API made (`spendbus admin serve`), the audit trail in SQL.
--
-- A copy of the topic admin.audit (the truth: append-only, kept forever, key audit_id;
-- the entry's shape is schemas/admin_audit.py): each worker that owns a store follows it
-- from its start and inserts the entries the table lacks (aggregator/sink/admin_audit.py).
-- An entry inserted twice (a crash after the insert, two workers on one server) is one
-- after a merge: read with FINAL or `LIMIT 1 BY audit_id`. before and after are JSON text.
CREATE TABLE IF NOT EXISTS admin_audit
(
    audit_id     String,
    at           DateTime64(6, 'UTC'),
    token_id     String,
    role         LowCardinality(String),
    remote       String,
    action       LowCardinality(String),
    resource     LowCardinality(String),
    resource_id  String,
    org_id       Nullable(String),
    before       Nullable(String),
    after        Nullable(String)
)
ENGINE = ReplacingMergeTree
ORDER BY audit_id;

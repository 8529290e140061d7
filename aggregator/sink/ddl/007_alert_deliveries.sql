-- alert_deliveries: what `spendbus notify run` did with each (alert, webhook): delivered
-- after a 2xx, or failed (a 4xx other than 408/429, or its attempts spent).
--
-- A copy of the notifier's compacted topic notify.deliveries (the truth, read back at each
-- start): the notifier writes a row after the record is acknowledged and, at start, the
-- rows of records the table lacks, so a crash between the two loses no row. A row may be
-- written twice (a crash after the insert, before the notifier learnt it went in):
-- ReplacingMergeTree keeps one per (webhook, alert_id) once parts merge, and queries
-- that must count each once take `LIMIT 1 BY webhook, alert_id` (no FINAL needed).
-- webhook is the webhook's id; webhook_url only scheme://host/… (a URL may carry a token).
CREATE TABLE IF NOT EXISTS alert_deliveries
(
    alert_id      String,
    webhook       LowCardinality(String),
    webhook_url   String,
    kind          LowCardinality(String),
    budget_id     LowCardinality(String),
    status        LowCardinality(String),
    attempts      UInt32,
    http_status   Nullable(UInt16),
    error         String,
    delivered_at  DateTime64(6, 'UTC'),
    alert_offset  Int64,
    inserted_at   DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(inserted_at)
ORDER BY (webhook, alert_id);

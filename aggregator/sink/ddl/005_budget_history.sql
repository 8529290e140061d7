-- budget_history and alerts: the exact history of every budget counter, and each alert once.
--
-- Every PricedUsage record carries the counters its event counts in (`counts`: counter
-- key, budget, scope values, window, period, rolling bucket, whether it counts as a
-- request, and the budget's limits and alert thresholds when the event was priced). The
-- sink stores each priced event once (offset fences + insert tokens), so the history is
-- a plain view over usage_events: no table of its own, no merge, no FINAL, exact however
-- the events arrived (out of order, late beyond what the aggregator keeps in memory,
-- replayed, after a crash). Rows written before this file have an empty `counts`.
--
-- Rolling windows (`r:<dur>` periods) are summed per bucket (width = duration / 48, the
-- aggregator's ROLLING_BUCKETS): a row's spend is its newest 48 buckets (what the
-- counter holds), and a threshold counts as crossed when any 48 consecutive buckets
-- reached it. Calendar windows have one bucket (0) per period.
ALTER TABLE usage_events ADD COLUMN IF NOT EXISTS counts Array(Tuple(
    counter_key String,
    budget_id String,
    scope_values Array(String),
    window String,
    period String,
    bucket Int64,
    requests UInt8,
    limit_nanos Nullable(Int64),
    limit_tokens Nullable(Int64),
    limit_requests Nullable(Int64),
    alert_at Array(Float64)
)) AFTER priced_at;

-- budget_counts: one row per (stored event, counter it counts in)
CREATE VIEW IF NOT EXISTS budget_counts AS
SELECT
    c.counter_key AS counter_key,
    c.budget_id AS budget_id,
    c.scope_values AS scope_values,
    c.window AS window,
    c.period AS period,
    c.bucket AS bucket,
    event_id,
    occurred_at,
    cost_nanos,
    input_tokens + cache_read_tokens + cache_write_tokens + output_tokens AS billed_tokens,
    c.requests AS requests,
    c.limit_nanos AS limit_nanos,
    c.limit_tokens AS limit_tokens,
    c.limit_requests AS limit_requests,
    c.alert_at AS alert_at,
    source_partition,
    source_offset
FROM usage_events
ARRAY JOIN counts AS c;

-- budget_history: one row per (counter, period): spend, the policy of its newest event,
-- its state and the thresholds crossed
CREATE VIEW IF NOT EXISTS budget_history AS
SELECT
    counter_key,
    budget_id,
    scope_values,
    window,
    period,
    spent_nanos,
    spent_tokens,
    spent_requests,
    events,
    as_of,
    policy.1 AS limit_nanos,
    policy.2 AS limit_tokens,
    policy.3 AS limit_requests,
    policy.4 AS alert_at,
    multiIf(
        ratio >= 1, 'exceeded',
        length(alert_at) > 0 AND ratio >= arrayMin(alert_at), 'alert',
        'ok'
    ) AS state,
    arrayFilter(t -> peak_ratio >= t, alert_at) AS thresholds_crossed
FROM
(
    -- per (counter, period): the newest window's spend (a calendar period's only one)
    SELECT
        counter_key,
        any(budget_id) AS budget_id,
        any(scope_values) AS scope_values,
        any(window) AS window,
        period,
        argMax(w_nanos, bucket) AS spent_nanos,
        argMax(w_tokens, bucket) AS spent_tokens,
        argMax(w_requests, bucket) AS spent_requests,
        sum(b_events) AS events,
        max(b_as_of) AS as_of,
        any(w_policy) AS policy,
        argMax(w_ratio, bucket) AS ratio,
        max(w_ratio) AS peak_ratio
    FROM
    (
        SELECT
            *,
            greatest(
                if(w_policy.1 > 0, w_nanos / w_policy.1, 0),
                if(w_policy.2 > 0, w_tokens / w_policy.2, 0),
                if(w_policy.3 > 0, w_requests / w_policy.3, 0)
            ) AS w_ratio
        FROM
        (
            -- per bucket: the sums of the 48 buckets up to it (rolling windows) and the
            -- policy of the period's newest event
            SELECT
                counter_key,
                budget_id,
                scope_values,
                window,
                period,
                bucket,
                b_events,
                b_as_of,
                sum(b_nanos) OVER w AS w_nanos,
                sum(b_tokens) OVER w AS w_tokens,
                sum(b_requests) OVER w AS w_requests,
                argMax(b_policy, b_last) OVER whole AS w_policy
            FROM
            (
                SELECT
                    counter_key,
                    any(budget_id) AS budget_id,
                    any(scope_values) AS scope_values,
                    any(window) AS window,
                    period,
                    bucket,
                    sum(cost_nanos) AS b_nanos,
                    sum(billed_tokens) AS b_tokens,
                    sum(requests) AS b_requests,
                    count() AS b_events,
                    max(occurred_at) AS b_as_of,
                    argMax(
                        (limit_nanos, limit_tokens, limit_requests, alert_at),
                        (occurred_at, source_partition, source_offset)
                    ) AS b_policy,
                    max((occurred_at, source_partition, source_offset)) AS b_last
                FROM budget_counts
                GROUP BY counter_key, period, bucket
            )
            WINDOW
                w AS (PARTITION BY counter_key, period ORDER BY bucket RANGE BETWEEN 47 PRECEDING AND CURRENT ROW),
                whole AS (PARTITION BY counter_key, period)
        )
    )
    GROUP BY counter_key, period
);

-- alerts: each alert once, by construction: a threshold crossed in a (counter, period),
-- and a model used without a price (its first event). alert_id is the aggregator's
-- (counter_key|period|threshold, unpriced|model), so the budget.alerts topic joins on it.
CREATE VIEW IF NOT EXISTS alerts AS
SELECT
    concat(
        counter_key, '|', period, '|',
        if(threshold = floor(threshold), concat(toString(threshold), '.0'), toString(threshold))
    ) AS alert_id,
    'threshold' AS kind,
    counter_key,
    budget_id,
    scope_values,
    period,
    threshold,
    CAST(NULL, 'Nullable(String)') AS model,
    spent_nanos,
    spent_tokens,
    spent_requests,
    as_of
FROM budget_history
ARRAY JOIN thresholds_crossed AS threshold
UNION ALL
SELECT
    concat('unpriced|', model) AS alert_id,
    'unpriced_model' AS kind,
    '' AS counter_key,
    '' AS budget_id,
    CAST([], 'Array(String)') AS scope_values,
    '' AS period,
    0. AS threshold,
    CAST(model, 'Nullable(String)') AS model,
    toInt64(0) AS spent_nanos,
    toInt64(0) AS spent_tokens,
    toInt64(0) AS spent_requests,
    min(occurred_at) AS as_of
FROM usage_events
WHERE unpriced
GROUP BY model;

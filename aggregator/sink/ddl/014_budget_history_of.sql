-- budget_history_of(budget_id = ...): one budget's budget_history, reading only its events.
--
-- budget_history (ddl/011) aggregates every counter of every event and filters on
-- budget_id after (the filter cannot pass its aggregation and window steps), so a query
-- for one budget read the whole of usage_events. This parameterized view is the same
-- query with the budget's filter applied first: on the events whose `counts` name the
-- budget (a PREWHERE on the `counts.budget_id` subcolumn, so the other columns are read
-- only for them), then on their counts, and on the budget's raises. Every later step
-- works per (counter, period), and a counter belongs to one budget, so the rows are
-- budget_history's rows of that budget, exactly.
--
-- An empty budget_id selects every budget: budget_history becomes this view with '',
-- one definition, so the two cannot drift. Query it as
-- `SELECT ... FROM budget_history_of(budget_id = 'org-1.monthly')`.
CREATE OR REPLACE VIEW budget_history_of AS
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
    limit_nanos,
    limit_tokens,
    limit_requests,
    alert_at,
    base_limit_nanos,
    base_limit_tokens,
    base_limit_requests,
    granted.4 AS raise_id,
    granted.5 AS raise_mode,
    granted.6 AS raise_nanos,
    granted.7 AS raise_tokens,
    granted.8 AS raise_requests,
    multiIf(
        ratio >= 1, 'exceeded',
        length(alert_at) > 0 AND ratio >= arrayMin(alert_at), 'alert',
        'ok'
    ) AS state,
    arrayFilter(t -> peak_ratio >= t, alert_at) AS thresholds_crossed
FROM
(
    SELECT
        *,
        multiIf(
            base_limit_nanos IS NULL OR granted.6 IS NULL, base_limit_nanos,
            granted.5 = 'by', base_limit_nanos + granted.6,
            granted.6
        ) AS limit_nanos,
        multiIf(
            base_limit_tokens IS NULL OR granted.7 IS NULL, base_limit_tokens,
            granted.5 = 'by', base_limit_tokens + granted.7,
            granted.7
        ) AS limit_tokens,
        multiIf(
            base_limit_requests IS NULL OR granted.8 IS NULL, base_limit_requests,
            granted.5 = 'by', base_limit_requests + granted.8,
            granted.8
        ) AS limit_requests,
        greatest(
            if(limit_nanos > 0, spent_nanos / limit_nanos, 0),
            if(limit_tokens > 0, spent_tokens / limit_tokens, 0),
            if(limit_requests > 0, spent_requests / limit_requests, 0)
        ) AS ratio,
        greatest(
            if(limit_nanos > 0, peak_nanos / limit_nanos, 0),
            if(limit_tokens > 0, peak_tokens / limit_tokens, 0),
            if(limit_requests > 0, peak_requests / limit_requests, 0)
        ) AS peak_ratio
    FROM
    (
        SELECT
            *,
            -- the raise in force at as_of: the counter's own first, then the newest
            arrayReverseSort(
                x -> (notEmpty(x.1), x.2, x.4),
                arrayFilter(
                    x -> (x.1 = scope_values OR empty(x.1)) AND x.2 <= as_of AND as_of < x.3,
                    raises
                )
            )[1] AS granted
        FROM
        (
            -- per (counter, period): the newest window's spend (a calendar period's only
            -- one), each limit's peak window, the policy of its newest event
            SELECT
                counter_key,
                any(budget_id) AS budget_id,
                any(scope_values) AS scope_values,
                any(window) AS window,
                period,
                argMax(w_nanos, bucket) AS spent_nanos,
                argMax(w_tokens, bucket) AS spent_tokens,
                argMax(w_requests, bucket) AS spent_requests,
                max(w_nanos) AS peak_nanos,
                max(w_tokens) AS peak_tokens,
                max(w_requests) AS peak_requests,
                sum(b_events) AS events,
                max(b_as_of) AS as_of,
                any(w_policy).1 AS base_limit_nanos,
                any(w_policy).2 AS base_limit_tokens,
                any(w_policy).3 AS base_limit_requests,
                any(w_policy).4 AS alert_at
            FROM
            (
                -- per bucket: the sums of the 48 buckets up to it (rolling windows) and
                -- the policy of the period's newest event
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
                    FROM
                    (
                        -- budget_counts (ddl/005) of the budget's events only: the
                        -- has() reads one subcolumn of every event (PREWHERE), the rest
                        -- only of the events that count in the budget
                        SELECT
                            c.counter_key AS counter_key,
                            c.budget_id AS budget_id,
                            c.scope_values AS scope_values,
                            c.window AS window,
                            c.period AS period,
                            c.bucket AS bucket,
                            occurred_at,
                            cost_nanos,
                            input_tokens + cache_read_tokens + cache_write_tokens + output_tokens
                                AS billed_tokens,
                            c.requests AS requests,
                            c.limit_nanos AS limit_nanos,
                            c.limit_tokens AS limit_tokens,
                            c.limit_requests AS limit_requests,
                            c.alert_at AS alert_at,
                            source_partition,
                            source_offset
                        FROM usage_events
                        ARRAY JOIN counts AS c
                        WHERE ({budget_id:String} = '' OR has(counts.budget_id, {budget_id:String}))
                          AND ({budget_id:String} = '' OR c.budget_id = {budget_id:String})
                    )
                    GROUP BY counter_key, period, bucket
                )
                WINDOW
                    w AS (PARTITION BY counter_key, period ORDER BY bucket RANGE BETWEEN 47 PRECEDING AND CURRENT ROW),
                    whole AS (PARTITION BY counter_key, period)
            )
            GROUP BY counter_key, period
        ) AS h
        LEFT JOIN
        (
            -- each budget's raises: (scope values, starts_at, ends, raise id, mode, amounts)
            SELECT
                budget_id,
                groupArray((
                    latest.1, latest.2, least(latest.3, ifNull(latest.4, latest.3)), raise_id,
                    latest.5, latest.6, latest.7, latest.8
                )) AS raises
            FROM
            (
                SELECT
                    raise_id,
                    any(budget_id) AS budget_id,
                    argMax(
                        (scope_values, starts_at, until, revoked_at, mode, raise_nanos,
                         raise_tokens, raise_requests),
                        recorded_at
                    ) AS latest
                FROM budget_raises
                GROUP BY raise_id
            )
            WHERE {budget_id:String} = '' OR budget_id = {budget_id:String}
            GROUP BY budget_id
        ) AS by_budget USING (budget_id)
    )
);

-- Replaces 011's view by the one above with every budget (the same columns, in order).
CREATE OR REPLACE VIEW budget_history AS
SELECT * FROM budget_history_of(budget_id = '');

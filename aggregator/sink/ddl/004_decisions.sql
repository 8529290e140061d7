-- decisions: what the enforcer decided for each request, a plain view over
-- usage_events (no storage of its own, so it is exactly as exact as usage_events).
-- Refusals are the rows whose outcome is 'refused' or 'failed_closed'; decision
-- carries the reason (budget_exceeded, job_budget_exceeded,
-- in_flight_budget_exceeded, throttled, failed_closed; see schemas/usage.py).
CREATE VIEW IF NOT EXISTS decisions AS
SELECT
    occurred_at,
    event_id,
    org_id,
    secret_id,
    project_id,
    grant_id,
    user_id,
    session_id,
    provider,
    model,
    gateway_id,
    outcome,
    decision,
    decision_budget_id,
    status_code,
    outcome IN ('refused', 'failed_closed') AS refused,
    cost_nanos,
    source_partition,
    source_offset
FROM usage_events;

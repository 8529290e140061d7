-- Billed units beyond tokens and the serving tier (UsageEvent v2, issue 22).
--
-- `units` is the event's `units` map (schemas/billed_units.py: web_search, web_fetch,
-- file_search, grounded_prompt, input_audio_tokens...), `service_tier` the tier the
-- provider says served the call (standard | priority | batch | default | flex ...), both
-- named after their Avro fields (the Avro insert reads `event.units`, `event.service_tier`).
-- Rows stored before this file read an empty map and NULL; cost_nanos already includes
-- what the units and tier cost (schemas/pricing.py).
ALTER TABLE usage_events ADD COLUMN IF NOT EXISTS units Map(String, Int64) AFTER counts;
ALTER TABLE usage_events ADD COLUMN IF NOT EXISTS service_tier LowCardinality(Nullable(String)) AFTER units;

-- unit_usage: one row per (stored event, unit it counted), for analysts:
--   SELECT org_id, unit, sum(count) FROM unit_usage GROUP BY org_id, unit
CREATE VIEW IF NOT EXISTS unit_usage AS
SELECT
    event_id,
    occurred_at,
    org_id,
    secret_id,
    project_id,
    provider,
    model,
    service_tier,
    unit_count.1 AS unit,
    unit_count.2 AS count
FROM usage_events
ARRAY JOIN CAST(units, 'Array(Tuple(String, Int64))') AS unit_count;

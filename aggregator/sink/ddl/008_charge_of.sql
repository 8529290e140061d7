-- A further charge of a call (UsageEvent v3 `charge_of`, issue 22): the event_id of the
-- call an event is billed apart from, at its own model (an Anthropic declined fallback hop
-- that had written output), named after the Avro field (the Avro insert reads
-- `event.charge_of`). Such an event counts no request of its own; it is an event (and a
-- row) of its own, so `count()` over usage_events counts it: requests are
--   SELECT count() FROM usage_events WHERE charge_of IS NULL
-- Rows stored before this file read NULL.
ALTER TABLE usage_events ADD COLUMN IF NOT EXISTS charge_of Nullable(String) AFTER service_tier;

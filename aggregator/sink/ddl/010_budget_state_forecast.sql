-- The verdicts' forecast (Verdict v2, schemas/forecast.py): what each counter burnt in its
-- trailing window (the last 12 five-minute buckets up to as_of, within its period), the
-- time that window covers, and when its first limit runs out at that rate. Rows stored
-- from v1 verdicts, and rolling windows, read NULL. A counter's live forecast:
--   SELECT counter_key, argMax(exhausts_at, seq) FROM budget_state GROUP BY counter_key
ALTER TABLE budget_state ADD COLUMN IF NOT EXISTS burn_nanos Nullable(Int64) AFTER emitted_at;
ALTER TABLE budget_state ADD COLUMN IF NOT EXISTS burn_tokens Nullable(Int64) AFTER burn_nanos;
ALTER TABLE budget_state ADD COLUMN IF NOT EXISTS burn_requests Nullable(Int64) AFTER burn_tokens;
ALTER TABLE budget_state ADD COLUMN IF NOT EXISTS burn_span_us Nullable(Int64) AFTER burn_requests;
ALTER TABLE budget_state ADD COLUMN IF NOT EXISTS exhausts_at Nullable(DateTime64(6, 'UTC')) AFTER burn_span_us;

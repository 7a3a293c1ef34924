-- Run (as postgres, psql -v dupkeys=N) before every measured run, so that every run starts from
-- the same state whatever ran before it: every table emptied, then holding the same dupkeys
-- completed keys (1..dupkeys), then analyzed.
--
-- Why not start empty: an empty table is not a steady state, and statements prepared once per
-- backend keep the plan made on their first call (see "Notes" in benches/README.md). Production
-- tables have history and statistics.
--
-- The dup20 variant draws 20% of its keys from 1..dupkeys (a redelivery of a message processed
-- before); new keys come from 100000..10^12.
TRUNCATE floor_keys, idempotency_keys, processed_events, business_rows, idempotency.records;

INSERT INTO floor_keys (key) SELECT g::text FROM generate_series(1, :dupkeys) g;
INSERT INTO processed_events (event_id) SELECT g::text FROM generate_series(1, :dupkeys) g;
INSERT INTO idempotency_keys (idempotency_key, status, response_payload)
SELECT g::text, 'COMPLETED', '{"status":"ok","amount":42}' FROM generate_series(1, :dupkeys) g;
-- Straight into the storage table: the rows idem_claim + idem_complete leave for a key.
INSERT INTO idempotency.records (scope, key, status, token, attempts, payload, created_at, updated_at)
SELECT 'default', g::text, 'completed', nextval('idempotency.token_seq'), 1,
       '{"status":"ok","amount":42}', now(), now()
  FROM generate_series(1, :dupkeys) g;

ANALYZE floor_keys, idempotency_keys, processed_events, business_rows, idempotency.records;

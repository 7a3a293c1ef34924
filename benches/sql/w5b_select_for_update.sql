-- Pattern 5b: SELECT ... FOR UPDATE, INSERT if absent, then UPDATE to completed; one transaction,
-- statement by statement. (The constant column "found" tells pgbench whether a row came back.)
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
\set found 0
SELECT 1 AS found, status, response_payload FROM idempotency_keys WHERE idempotency_key = :k::text FOR UPDATE \aset
\if :found = 0
INSERT INTO idempotency_keys (idempotency_key, status) VALUES (:k::text, 'PENDING');
UPDATE idempotency_keys SET status = 'COMPLETED', response_payload = '{"status":"ok","amount":42}'::jsonb, updated_at = now() WHERE idempotency_key = :k::text;
\endif
COMMIT;

-- Pattern 5a, as written in the field and sent statement by statement: insert PENDING, skip on
-- conflict, then mark COMPLETED with the response. A duplicate reads the stored response instead.
-- (RETURNING 1 stands for the row count the application checks; pgbench needs it in a variable.)
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
\set inserted 0
INSERT INTO idempotency_keys (idempotency_key, status) VALUES (:k::text, 'PENDING') ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1 AS inserted \aset
\if :inserted
UPDATE idempotency_keys SET status = 'COMPLETED', response_payload = '{"status":"ok","amount":42}'::jsonb, updated_at = now() WHERE idempotency_key = :k::text;
\else
SELECT status, response_payload FROM idempotency_keys WHERE idempotency_key = :k::text;
\endif
COMMIT;

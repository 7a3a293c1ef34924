-- Workload 2b: idem_once in the transaction that makes the business write (only for a new key).
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
SELECT idem_once(:k::text)::int AS fresh \gset
\if :fresh
INSERT INTO business_rows (message_key, amount) VALUES (:k::text, 42);
\endif
COMMIT;

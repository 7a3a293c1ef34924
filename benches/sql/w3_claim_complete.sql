-- Workload 3: idem_claim + idem_complete in one transaction with a small JSON payload
-- (one-transaction mode: no token needed). A duplicate gets outcome 'completed' and its payload.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed, payload FROM idem_claim(:k::text) \gset
\if :claimed
SELECT idem_complete(:k::text, '{"status":"ok","amount":42}'::jsonb);
\endif
COMMIT;

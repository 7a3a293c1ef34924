-- Pattern 5a wrapped in two minimal SECURITY DEFINER PL/pgSQL functions (benches/sql/schema.sql:
-- bench_min_claim, bench_min_complete), each SET search_path = pg_catalog, pg_temp and doing nothing but its
-- statement: the floor of the SQL edition's own approach (issue 32), measured beside 5a in every run.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
SELECT bench_min_claim(:k::text)::int AS inserted \gset
\if :inserted
SELECT bench_min_complete(:k::text, '{"status":"ok","amount":42}'::jsonb);
\else
SELECT status, response_payload FROM idempotency_keys WHERE idempotency_key = :k::text;
\endif
COMMIT;

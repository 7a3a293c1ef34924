-- Issue 32: the SQL edition's floor on its own storage, claim + complete in one transaction: bench_floor_claim
-- and bench_floor_complete (benches/sql/edition_schema.sql), the edition's two writes into its write partition
-- in minimal SECURITY DEFINER functions that check nothing. Run in the edition's database (row f_w3).
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
SELECT bench_floor_claim(:k::text)::int AS inserted \gset
\if :inserted
SELECT bench_floor_complete(:k::text, '{"status":"ok","amount":42}'::jsonb);
\endif
COMMIT;

-- Issue 32: the floor of w3_floor_edition.sql on a table of the record's columns without the lease index
-- (bench_floor_records, benches/sql/edition_schema.sql), where the completion is a HOT update: what a storage
-- without that index could reach. Run in the edition's database (row f2_w3).
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
BEGIN;
SELECT bench_floor2_claim(:k::text)::int AS inserted \gset
\if :inserted
SELECT bench_floor2_complete(:k::text, '{"status":"ok","amount":42}'::jsonb);
\endif
COMMIT;

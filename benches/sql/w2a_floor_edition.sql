-- Issue 32: the SQL edition's floor on its own storage for idem_once: bench_floor_once
-- (benches/sql/edition_schema.sql), the edition's insert of a completed record into its write partition in a
-- minimal SECURITY DEFINER function that checks nothing. Run in the edition's database (row f_w2a).
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
SELECT bench_floor_once(:k::text);

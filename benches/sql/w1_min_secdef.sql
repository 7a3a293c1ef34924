-- Workload 1's bare insert alone in a minimal SECURITY DEFINER PL/pgSQL function, bench_min_once
-- (benches/sql/schema.sql), SET search_path = pg_catalog, pg_temp as the SQL edition's functions: what such a
-- call costs around an insert, beside idem_once and the edition's floor f_w2a (issue 32; row m_w1).
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
SELECT bench_min_once(:k::text);

-- Workload 8, growth: idem_claim of a new key alone (autocommit), against a table holding
-- 0, 1M or 10M retained keys.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
SELECT outcome FROM idem_claim(:k::text);

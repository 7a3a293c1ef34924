-- Workload 1, the floor: one bare insert into an unpartitioned primary-key table per transaction.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
INSERT INTO floor_keys (key) VALUES (:k::text) ON CONFLICT DO NOTHING;

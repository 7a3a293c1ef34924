-- Pattern 5c: a plain insert into processed_events that fails on a duplicate. pgbench aborts a
-- client on that error, so the duplicates variant of 5c runs through benches/pydriver.py instead.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
INSERT INTO processed_events (event_id) VALUES (:k::text);

-- Workload 12: idem_once_batch of a poll's :n keys, drawn as in w12_floor_batch.sql (so that it and the
-- floor insert the same key mix).
\set base random(1, 100000000000)
SELECT count(*) FROM idem_once_batch(ARRAY(
  SELECT CASE WHEN abs(hashint8(:base::bigint * 10000 + g)::bigint) % 100 < :dup
              THEN (1 + abs(hashint8(:base::bigint * 10000 + g + 1)::bigint) % :dupkeys)::text
              ELSE (:base::bigint * 10000 + g)::text END
    FROM generate_series(1, :n) g));

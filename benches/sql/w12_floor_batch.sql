-- Workload 12, the batch floor: a bare batch insert of :n keys into a primary-key table, what a
-- consumer writes by hand to remember a poll's keys (no status, no lease). Keys as in w12_*: from :base.
\set base random(1, 100000000000)
WITH new_keys AS (
  INSERT INTO floor_keys
  SELECT CASE WHEN abs(hashint8(:base::bigint * 10000 + g)::bigint) % 100 < :dup
              THEN (1 + abs(hashint8(:base::bigint * 10000 + g + 1)::bigint) % :dupkeys)::text
              ELSE (:base::bigint * 10000 + g)::text END
    FROM generate_series(1, :n) g
  ON CONFLICT DO NOTHING RETURNING key)
SELECT count(*) FROM new_keys;

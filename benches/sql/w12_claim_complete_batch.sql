-- Workload 12, the extension's batch pattern: idem_claim_batch of a poll's :n keys, then
-- idem_complete_batch of those claimed, in one transaction (one statement). Keys as in w12_floor_batch.sql.
\set base random(1, 100000000000)
SELECT idem_complete_batch(ARRAY(
  SELECT key FROM idem_claim_batch(ARRAY(
    SELECT CASE WHEN abs(hashint8(:base::bigint * 10000 + g)::bigint) % 100 < :dup
                THEN (1 + abs(hashint8(:base::bigint * 10000 + g + 1)::bigint) % :dupkeys)::text
                ELSE (:base::bigint * 10000 + g)::text END
      FROM generate_series(1, :n) g))
   WHERE outcome = 'claimed'));

-- Workload 12, the hand-written batch pattern: claim a poll's :n keys as PENDING (the new ones), do the
-- work, mark them COMPLETED, in one transaction. Keys as in w12_floor_batch.sql.
\set base random(1, 100000000000)
BEGIN;
INSERT INTO idempotency_keys (idempotency_key, status)
SELECT CASE WHEN abs(hashint8(:base::bigint * 10000 + g)::bigint) % 100 < :dup
            THEN (1 + abs(hashint8(:base::bigint * 10000 + g + 1)::bigint) % :dupkeys)::text
            ELSE (:base::bigint * 10000 + g)::text END, 'PENDING'
  FROM generate_series(1, :n) g
ON CONFLICT DO NOTHING;
UPDATE idempotency_keys SET status = 'COMPLETED', updated_at = now()
 WHERE status = 'PENDING' AND idempotency_key = ANY (ARRAY(
       SELECT CASE WHEN abs(hashint8(:base::bigint * 10000 + g)::bigint) % 100 < :dup
                   THEN (1 + abs(hashint8(:base::bigint * 10000 + g + 1)::bigint) % :dupkeys)::text
                   ELSE (:base::bigint * 10000 + g)::text END
         FROM generate_series(1, :n) g));
COMMIT;

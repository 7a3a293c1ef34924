-- Workload 7: idem_claim_batch of :n keys per call, keys drawn as in w7_once_batch.sql.
SELECT count(*) FROM idem_claim_batch(ARRAY(
    SELECT CASE WHEN random() * 100 < :dup
                THEN (1 + floor(random() * :dupkeys))::bigint::text
                ELSE (100000 + floor(random() * 999999900000))::bigint::text END
      FROM generate_series(1, :n)));

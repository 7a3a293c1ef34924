-- Workload 7: idem_once_batch of :n keys per call (one broker poll). The keys are drawn in SQL:
-- with -D dup=20 each key is one of the preloaded 1..dupkeys with probability 20%.
SELECT count(*) FROM idem_once_batch(ARRAY(
    SELECT CASE WHEN random() * 100 < :dup
                THEN (1 + floor(random() * :dupkeys))::bigint::text
                ELSE (100000 + floor(random() * 999999900000))::bigint::text END
      FROM generate_series(1, :n)));

-- reset.sql for the SQL edition's database (run as postgres, psql -v dupkeys=N): its record table and
-- business table emptied, then the same dupkeys completed keys (1..dupkeys) as the extension's, then analyzed;
-- bench_floor_records (edition_schema.sql, the floor row f2_w3, the record's columns) a copy of those rows.
TRUNCATE business_rows, idempotency.records, bench_floor_records;
INSERT INTO idempotency.records (scope, key, status, token, attempts, payload, created_at, updated_at)
SELECT 'default', g::text, 'completed', nextval('idempotency.token_seq'), 1,
       '{"status":"ok","amount":42}', now(), now()
  FROM generate_series(1, :dupkeys) g;
INSERT INTO bench_floor_records SELECT * FROM idempotency.records;

ANALYZE business_rows, idempotency.records, bench_floor_records;

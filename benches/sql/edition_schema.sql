-- The SQL edition's side of the benchmark (issue 28), run in the database bench_edition of the same cluster
-- (the native extension and the edition both use the schema idempotency, so they cannot share a database)
-- by that database's owner, a non-superuser with CREATEROLE, right after it installed the edition with
-- `psql -f idempotency.sql` (scripts/sql-edition): the consumer role bench (schema.sql) calls the edition
-- there as it calls the extension in the database postgres.

-- Its first partitions (the current one and premake ahead), as schema.sql does for the extension.
SELECT FROM idem_maintenance();

-- The business write of workload 2b, as in schema.sql.
CREATE TABLE business_rows (
    id          bigserial PRIMARY KEY,
    message_key text NOT NULL,
    amount      integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON business_rows TO bench;
GRANT USAGE ON SEQUENCE business_rows_id_seq TO bench;

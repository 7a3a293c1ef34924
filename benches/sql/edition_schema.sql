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

-- The edition's floor on its own storage (issue 32): the writes of a claim, a completion and idem_once as
-- the edition makes them, each alone in a minimal SECURITY DEFINER PL/pgSQL function that checks nothing
-- (no argument, limit, setting, grant or state test, no result table): straight into the write partition
-- (named in the function, found here once), every column the contract keeps (scope, token from the
-- edition's sequence, attempts, created_at, updated_at, the lease's expires_at), the completion ending the
-- lease (expires_at NULL), as idem_complete does. What any PL/pgSQL edition on this storage can reach:
-- rows f_w3 and f_w2a (benches/sql/w3_floor_edition.sql, w2a_floor_edition.sql). f2_w3 runs the same pair
-- on a table of the same columns without the lease index (bench_floor_records), where the completion is a
-- HOT update: what a storage without that index could reach.
CREATE TABLE bench_floor_records (LIKE idempotency.records INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE UNIQUE INDEX ON bench_floor_records (key, scope);

DO $do$
DECLARE
    w text;
    t record;
BEGIN
    SELECT pg_catalog.format('idempotency.%I', p.partition_name) INTO STRICT w FROM idempotency.partition_ranges p
     WHERE p.range_from <= pg_catalog.now() AND pg_catalog.now() < p.range_to;
    FOR t IN SELECT * FROM (VALUES ('', w), ('2', 'public.bench_floor_records')) v(suffix, tab) LOOP
        EXECUTE pg_catalog.format($f$
            CREATE FUNCTION bench_floor%1$s_claim(k text) RETURNS boolean
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                INSERT INTO %2$s (scope, key, status, token, attempts, created_at, updated_at, expires_at)
                VALUES ('default', k, 'pending', pg_catalog.nextval('idempotency.token_seq'), 1, pg_catalog.now(),
                        pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) '5 min'::interval)
                ON CONFLICT DO NOTHING;
                RETURN FOUND;
            END
            $b$;
            CREATE FUNCTION bench_floor%1$s_complete(k text, p jsonb) RETURNS void
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                UPDATE %2$s x SET status = 'completed', payload = p, expires_at = NULL,
                                  updated_at = pg_catalog.clock_timestamp()
                 WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) 'default';
            END
            $b$;
            CREATE FUNCTION bench_floor%1$s_once(k text) RETURNS boolean
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                INSERT INTO %2$s (scope, key, status, token, attempts, created_at, updated_at)
                VALUES ('default', k, 'completed', pg_catalog.nextval('idempotency.token_seq'), 1, pg_catalog.now(),
                        pg_catalog.clock_timestamp())
                ON CONFLICT DO NOTHING;
                RETURN FOUND;
            END
            $b$;
        $f$, t.suffix, t.tab);
    END LOOP;
END
$do$;

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
-- the edition's common path makes them (sql/edition/30-keys.sql, 33-settle.sql, 35-once.sql), each alone in a
-- minimal SECURITY DEFINER PL/pgSQL function that checks nothing (no argument, limit, setting, grant or state
-- test, no result table): straight into the write partition (named in the function, found here once: on a
-- fresh install, after idem_maintenance(), the partition covering now, which is the oldest unsealed one), with
-- the columns the edition writes and created_at from idempotency.created_at, as the edition takes it (kept
-- inside the partition's range, so a run that crosses midnight still writes there); the claim draws its token from the edition's
-- sequence and sets the lease's expires_at, the completion ends the lease (expires_at NULL), idem_once's
-- completed row has neither. What a PL/pgSQL edition that writes the claim as a row, then changes it, can
-- reach on this storage: rows f_w3 and f_w2a (benches/sql/w3_floor_edition.sql, w2a_floor_edition.sql). f2_w3
-- runs the same pair on a table of the same columns without the lease index (bench_floor_records, filled and
-- analyzed as the record table is by reset_edition.sql), where the completion can be a HOT update.
CREATE TABLE bench_floor_records (LIKE idempotency.records INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE UNIQUE INDEX ON bench_floor_records (key, scope);

DO $do$
DECLARE
    w record;
    t record;
BEGIN
    SELECT pg_catalog.format('idempotency.%I', p.partition_name) AS name, p.range_from, p.range_to INTO STRICT w
      FROM idempotency.partition_ranges p
     WHERE p.range_from <= pg_catalog.now() AND pg_catalog.now() < p.range_to;
    FOR t IN SELECT * FROM (VALUES ('', w.name), ('2', 'public.bench_floor_records')) v(suffix, tab) LOOP
        EXECUTE pg_catalog.format($f$
            CREATE FUNCTION bench_floor%1$s_claim(k text) RETURNS boolean
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                INSERT INTO %2$s (scope, key, status, token, attempts, created_at, updated_at, expires_at)
                VALUES ('default', k, 'pending', pg_catalog.nextval('idempotency.token_seq'), 1,
                        idempotency.created_at(%3$L::timestamptz, %4$L::timestamptz),
                        pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) '5 min'::interval)
                ON CONFLICT DO NOTHING;
                RETURN FOUND;
            END
            $b$;
            CREATE FUNCTION bench_floor%1$s_complete(k text, p jsonb) RETURNS void
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                UPDATE %2$s x SET status = 'completed', payload = p, updated_at = pg_catalog.clock_timestamp(),
                                  expires_at = NULL
                 WHERE x.key OPERATOR(pg_catalog.=) k AND x.scope OPERATOR(pg_catalog.=) 'default';
            END
            $b$;
            CREATE FUNCTION bench_floor%1$s_once(k text) RETURNS boolean
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
            BEGIN
                INSERT INTO %2$s (scope, key, status, attempts, created_at, updated_at)
                VALUES ('default', k, 'completed', 1,
                        idempotency.created_at(%3$L::timestamptz, %4$L::timestamptz),
                        pg_catalog.now())
                ON CONFLICT DO NOTHING;
                RETURN FOUND;
            END
            $b$;
        $f$, t.suffix, t.tab, w.range_from, w.range_to);
    END LOOP;
END
$do$;

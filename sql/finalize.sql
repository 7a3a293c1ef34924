-- Runs after everything else: no function is executable by PUBLIC (each function's grants and comment
-- sit beside it: the Rust function's extension_sql!, or the SQL file that creates it), and what pg_dump keeps.

-- No function of the extension is executable by PUBLIC. (Here, as everywhere in the extension's scripts,
-- every operator has operands of exactly its types and every function is qualified: the script runs with
-- the target schema on the search path, where the database's owner may have planted lookalikes.)
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT d.objid::regprocedure
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
         WHERE e.extname = 'idempotency' AND d.deptype = 'e'
           AND d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;

-- No partition is made here. A dump restored into this database brings its own partitions, and any
-- made now would collide with them (CREATE EXTENSION cannot tell a restore from a new install: it
-- runs its script with check_function_bodies off either way). The first writing call, or the
-- first maintenance round (SELECT * FROM idem_maintenance()), makes them.

-- pg_dump keeps the rows of these member tables and the token sequence's position.
SELECT pg_catalog.pg_extension_config_dump('idempotency.offsets', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.token_seq', '');

-- Drops one partition if its lock comes within wait_ms; false (nothing done) otherwise. The
-- lock_timeout applies to this drop only: the exception block's subtransaction undoes it on
-- failure, and it is reset by hand on success.
CREATE FUNCTION idempotency.drop_partition(part regclass, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    saved text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    EXECUTE format('DROP TABLE %s', part);
    PERFORM set_config('lock_timeout', saved, true);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;
REVOKE ALL ON FUNCTION idempotency.drop_partition(regclass, integer) FROM PUBLIC;
COMMENT ON FUNCTION idempotency.drop_partition(regclass, integer) IS
'Drops one partition of idempotency.records unless its lock takes longer than wait_ms; used by maintenance.';

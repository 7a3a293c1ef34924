-- 0.6.0 -> 0.7.0: each partition's expires_at index holds only the rows with a lease (expires_at IS NOT NULL),
-- the only rows anything looks up through it (the reclaim sweep, idempotency.in_flight). Before, every
-- settled record (completed or failed, expires_at NULL) had an entry there too: one more index insertion,
-- and its WAL, for every idem_once and every completion, which no query ever read. The lookups by
-- (scope, key) and what is stored do not change.
-- The update drops and rebuilds that index on every partition (and on pg_partman's template table when
-- the table was handed over): each rebuild reads its partition once and holds a SHARE lock on it meanwhile,
-- so claims of that partition wait for it; run it when consumers are quiet. Run by ALTER EXTENSION
-- idempotency UPDATE, after PostgreSQL was restarted on the 0.7.0 library. Like the install script, this
-- one qualifies what it calls: it runs with the extension's schema on the search path.

CREATE OR REPLACE FUNCTION idempotency.index_partition(part regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel name;
    nsp name;
BEGIN
    SELECT c.relname, n.nspname INTO rel, nsp
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = part;
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (scope, key)', rel || '_scope_key_idx', nsp, rel);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (expires_at) WHERE expires_at IS NOT NULL',
                   rel || '_expires_at_idx', nsp, rel);
END
$$;
COMMENT ON FUNCTION idempotency.index_partition(regclass) IS
'Creates the (scope, key) index and the (expires_at) index of leased rows that a partition of idempotency.records needs, unless they exist. For partitions attached by hand.';

DO LANGUAGE plpgsql $$
DECLARE
    partman name;
    tables oid[];
    ix record;
BEGIN
    SET LOCAL search_path = pg_catalog, pg_temp;
    SELECT array_agg(relid::oid) INTO tables FROM pg_partition_tree('idempotency.records'::regclass) WHERE isleaf;
    SELECT n.nspname INTO partman
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_partman';
    IF partman IS NOT NULL THEN
        EXECUTE format('SELECT $1 || array_agg(template_table::regclass::oid) FROM %I.part_config
                         WHERE parent_table = ''idempotency.records'' AND template_table IS NOT NULL', partman)
           INTO tables USING tables;
    END IF;
    -- Each expires_at index that index_partition made (named after its table, on expires_at alone, whole).
    FOR ix IN
        SELECT n.nspname AS nsp, i.relname AS name, x.indrelid::regclass AS tab
          FROM pg_index x
          JOIN pg_class i ON i.oid = x.indexrelid
          JOIN pg_class t ON t.oid = x.indrelid
          JOIN pg_namespace n ON n.oid = i.relnamespace
          JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
         WHERE x.indrelid = ANY (coalesce(tables, '{}'))
           AND i.relname = t.relname || '_expires_at_idx'
           AND x.indnatts = 1 AND a.attname = 'expires_at' AND x.indpred IS NULL AND x.indexprs IS NULL
    LOOP
        EXECUTE format('DROP INDEX %I.%I', ix.nsp, ix.name);
        EXECUTE format('CREATE INDEX %I ON %s (expires_at) WHERE expires_at IS NOT NULL', ix.name, ix.tab);
    END LOOP;
END
$$;

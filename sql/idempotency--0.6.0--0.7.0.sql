-- 0.6.0 -> 0.7.0: the two indexes of every partition change; what is stored does not.
-- * The lookup index <partition>_scope_key_idx on (scope, key) becomes <partition>_key_scope_idx on
--   (key, scope): with the key first, a descent compares one column at each step instead of two (scope is
--   the same for most keys), which makes every lookup and every insertion cheaper.
-- * The expires_at index holds only the rows with a lease (expires_at IS NOT NULL), the only rows anything
--   looks up through it (the reclaim sweep, idempotency.in_flight). Before, every settled record (completed
--   or failed, expires_at NULL) had an entry there too: one more index insertion, and its WAL, for every
--   idem_once and every completion, which no query ever read.
-- The update drops the old indexes and builds the new ones on every partition (and on pg_partman's template
-- table when the table was handed over), in the one transaction of ALTER EXTENSION: it holds an ACCESS
-- EXCLUSIVE lock on every partition until it commits, so every claim and lookup waits for the whole update,
-- and it takes about four lock-table entries per partition. Stop the consumers first (or SET lock_timeout:
-- the update then fails and changes nothing rather than queue behind them). Until the update, the 0.7.0
-- library reads the 0.6.0 indexes. Run by ALTER EXTENSION
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
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (key, scope)', rel || '_key_scope_idx', nsp, rel);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (expires_at) WHERE expires_at IS NOT NULL',
                   rel || '_expires_at_idx', nsp, rel);
END
$$;
COMMENT ON FUNCTION idempotency.index_partition(regclass) IS
'Creates the (key, scope) index and the (expires_at) index of leased rows that a partition of idempotency.records needs, unless they exist. For partitions attached by hand.';

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
        EXECUTE format('SELECT $1 || array_agg(to_regclass(template_table)::oid) FROM %I.part_config
                         WHERE parent_table = ''idempotency.records'' AND to_regclass(template_table) IS NOT NULL',
                       partman)
           INTO tables USING tables;
    END IF;
    -- Each index that index_partition made (named after its table): (scope, key), and expires_at whole.
    FOR ix IN
        SELECT n.nspname AS nsp, i.relname AS name, x.indrelid::regclass AS tab, t.relname AS tabname,
               i.relname = (t.relname || '_expires_at_idx')::name AS expiry
          FROM pg_index x
          JOIN pg_class i ON i.oid = x.indexrelid
          JOIN pg_class t ON t.oid = x.indrelid
          JOIN pg_namespace n ON n.oid = i.relnamespace
         WHERE x.indrelid = ANY (coalesce(tables, '{}'))
           AND x.indpred IS NULL AND x.indexprs IS NULL
           -- (A cast to name clips a long name as CREATE INDEX clipped it.)
           AND ((i.relname = (t.relname || '_expires_at_idx')::name AND x.indnatts = 1
                 AND (SELECT a.attname FROM pg_attribute a
                       WHERE a.attrelid = x.indrelid AND a.attnum = x.indkey[0]) = 'expires_at')
             OR (i.relname = (t.relname || '_scope_key_idx')::name AND x.indnatts = 2
                 AND ARRAY(SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY k(attnum, i)
                             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                            ORDER BY k.i) = ARRAY['scope', 'key']))
    LOOP
        EXECUTE format('DROP INDEX %I.%I', ix.nsp, ix.name);
        IF ix.expiry THEN
            EXECUTE format('CREATE INDEX %I ON %s (expires_at) WHERE expires_at IS NOT NULL', ix.name, ix.tab);
        ELSE
            -- (No IF NOT EXISTS: a relation of that name that is not this index fails the update loudly.)
            EXECUTE format('CREATE INDEX %I ON %s (key, scope)', ix.tabname || '_key_scope_idx', ix.tab);
        END IF;
    END LOOP;
END
$$;

-- idempotency 0.1.0 -> 0.2.0. Run by ALTER EXTENSION idempotency UPDATE, in one transaction.
--
-- Before it: install the 0.2.0 build and restart PostgreSQL (the per-key lock hash changed in the
-- library: a backend still running 0.1.0's library would take other locks for the same keys).
--
-- What changes in the schema: the record table loses its partitioned indexes, and each partition
-- gets indexes of its own (same columns, same names as before). With a partitioned index, every
-- partition's index in a dump collided on restore with the one ATTACH PARTITION had made.
-- Rebuilding the indexes takes time in proportion to the retained keys, under an exclusive lock
-- on the record table: consumers wait for the update to commit.

CREATE FUNCTION idempotency.index_partition(part regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel name;
    nsp name;
BEGIN
    SELECT c.relname, n.nspname INTO rel, nsp
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = part;
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (scope, key)', rel || '_scope_key_idx', nsp, rel);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I (expires_at)', rel || '_expires_at_idx', nsp, rel);
END
$$;
REVOKE ALL ON FUNCTION idempotency.index_partition(regclass) FROM PUBLIC;
COMMENT ON FUNCTION idempotency.index_partition(regclass) IS
'Creates the (scope, key) and (expires_at) indexes a partition of idempotency.records needs, unless they exist. For partitions attached by hand.';

-- Dropping a partitioned index drops the partitions' indexes attached to it; they are made again,
-- unattached, right after, in the same transaction.
DROP INDEX idempotency.records_scope_key_idx;
DROP INDEX idempotency.records_expires_idx;
SELECT idempotency.index_partition(relid)
  FROM pg_catalog.pg_partition_tree('idempotency.records')
 WHERE isleaf;

-- Under pg_partman (idem_partman_handover), new partitions copy the template table's indexes.
DO $$
DECLARE
    partman name;
    template text;
BEGIN
    SELECT n.nspname INTO partman
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'pg_partman';
    IF partman IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT template_table FROM %I.part_config WHERE parent_table = %L',
                   partman, 'idempotency.records') INTO template;
    IF template IS NOT NULL THEN
        PERFORM idempotency.index_partition(template::regclass);
    END IF;
END
$$;

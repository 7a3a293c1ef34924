-- 0.2.0 -> 0.3.0: sealed partitions with membership filters, and the key and fingerprint helpers.
-- Run by ALTER EXTENSION idempotency UPDATE, after PostgreSQL was restarted on the 0.3.0 library.
-- Existing past partitions are sealed (and get their filters) by the first maintenance round after
-- the update; until then claims probe their indexes as 0.2.0 did.
-- Sealed partitions: past partitions that take no new row any more (see src/storage/filters.rs),
-- each with a membership filter of its keys so that a claim reads one 32-byte block instead of its
-- index. blocks = 0: sealed without a filter (idempotency.filter_memory was reached). chunks lists where
-- the filter's rows of idempotency.filter_chunks lie, in order. Neither table is dumped: a restored
-- database has no sealed partition until maintenance seals them again.
CREATE TABLE idempotency.sealed (
    partition      oid PRIMARY KEY,
    partition_name name NOT NULL,
    range_to       timestamptz NOT NULL,
    keys           bigint NOT NULL,
    blocks         integer NOT NULL,
    chunks         tid[] NOT NULL,
    sealed_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE idempotency.sealed IS 'Sealed partitions of idempotency.records (no new rows) and where their membership filters lie.';

-- The filters' bits, 7,936 bytes a row: stored inline and uncompressed so that a claim reads them in
-- place in a shared buffer.
CREATE TABLE idempotency.filter_chunks (
    partition oid NOT NULL,
    chunk     integer NOT NULL,
    bits      bytea NOT NULL
);
ALTER TABLE idempotency.filter_chunks ALTER COLUMN bits SET STORAGE PLAIN;
COMMENT ON TABLE idempotency.filter_chunks IS 'Bits of the membership filters of sealed partitions (split block Bloom filters), read by ctid.';

-- Takes the SHARE lock that seals a partition, if it comes within wait_ms: it waits for the
-- transactions that wrote there and keeps new writers out until the sealing transaction ends.
-- false (nothing done) otherwise.
CREATE FUNCTION idempotency.seal_lock(part regclass, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    saved text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    EXECUTE format('LOCK TABLE %s IN SHARE MODE', part);
    PERFORM set_config('lock_timeout', saved, true);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;
REVOKE ALL ON FUNCTION idempotency.seal_lock(regclass, integer) FROM PUBLIC;
COMMENT ON FUNCTION idempotency.seal_lock(regclass, integer) IS
'Takes the SHARE lock that seals a partition of idempotency.records unless it takes longer than wait_ms; used by maintenance.';

-- Every partition of the record table with its range, what it holds, and when retention drops it.
-- (pg_partman's default partition, if any, has no range.)
CREATE OR REPLACE VIEW idempotency.partitions AS
SELECT c.oid::regclass                                        AS partition,
       b.bound[1]::timestamptz                                AS range_from,
       b.bound[2]::timestamptz                                AS range_to,
       greatest(c.reltuples, 0)::bigint                       AS row_estimate,
       pg_catalog.pg_total_relation_size(c.oid)               AS total_bytes,
       pg_catalog.pg_size_pretty(pg_catalog.pg_total_relation_size(c.oid)) AS size,
       b.bound[2]::timestamptz
         + pg_catalog.current_setting('idempotency.retention', true)::interval AS dropped_after,
       s.sealed_at,
       s.blocks * 32                                          AS filter_bytes
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
  LEFT JOIN idempotency.sealed s ON s.partition = c.oid AND s.partition_name = c.relname
  LEFT JOIN LATERAL (
        SELECT regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                            'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS bound
       ) b ON true
 WHERE i.inhparent = 'idempotency.records'::regclass
 ORDER BY range_from NULLS LAST;

COMMENT ON VIEW idempotency.partitions IS 'Partitions of idempotency.records: range, estimated rows, size, when retention drops each, and when it was sealed (no new rows) with its filter''s size.';

CREATE FUNCTION idem_key("namespace" uuid, "parts" VARIADIC text[]) RETURNS text
IMMUTABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'idem_key_wrapper';
CREATE FUNCTION idem_fingerprint("document" jsonb, "paths" VARIADIC text[] DEFAULT '{}') RETURNS text
IMMUTABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'idem_fingerprint_wrapper';
REVOKE ALL ON FUNCTION idem_key(uuid, text[]), idem_fingerprint(jsonb, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_key(uuid, text[]), idem_fingerprint(jsonb, text[]) TO idempotency_consumer;
COMMENT ON FUNCTION idem_key(uuid, text[]) IS
'A key derived from a message''s identifying parts: the version-5 UUID of namespace and the parts (each as <UTF-8 length>:<bytes>;), as text. The client libraries compute the same value.';
COMMENT ON FUNCTION idem_fingerprint(jsonb, text[]) IS
'A request fingerprint for idem_claim: hex SHA-256 of the RFC 8785 canonical JSON of the document, or of an object mapping each given JSON Pointer to its value (null when absent). The client libraries compute the same value.';

CREATE FUNCTION idempotency."seal_partition"("part" oid) RETURNS bool
VOLATILE PARALLEL UNSAFE SET search_path TO pg_catalog, pg_temp
LANGUAGE c AS 'MODULE_PATHNAME', 'seal_partition_wrapper';
REVOKE ALL ON FUNCTION idempotency.seal_partition(oid) FROM PUBLIC;
COMMENT ON FUNCTION idempotency.seal_partition(oid) IS
'Seals a partition of idempotency.records (an oid: pass ''idempotency.records_p...''::regclass) now and builds its membership filter (maintenance seals past partitions by itself). Waits for the partition''s writers within lock_timeout. Sealing the partition of the present moves new keys to the next one. False if it was sealed already.';

-- Scale-out on Citus (sql/distribute.sql, the same text as a fresh install runs).
-- Scale-out on Citus: idem_distribute(colocate_with) registers the consumer functions whose records belong to
-- one scope as Citus distributed functions, delegated by their scope argument to the worker that holds the
-- scope's shard of a hash-distributed table. A tenant's keys then live in that worker's own
-- idempotency.records, beside the tenant's business rows, and commit with them in one local transaction.
--
-- Nothing here needs Citus to be installed: the Citus catalogs are only read (by EXECUTE) after
-- idem_distribute checked that the citus extension is there.

-- The guard of the coordinator's record table. Once the functions are delegated, a call that Citus does not
-- delegate (a shape it cannot route: inside INSERT ... SELECT, a WHERE clause, a CTE or subquery, a
-- PL/pgSQL expression) runs on the coordinator, where no delegated call would ever see its record: the same
-- key could then be claimed twice. idem_distribute puts this trigger on the coordinator's record table, so
-- such a call fails loudly instead (0A000), and its transaction with it.
CREATE FUNCTION idempotency.refuse_undelegated() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'idempotency: key % of scope % was about to be recorded on the Citus coordinator',
                    quote_literal(left(NEW.key, 100)), quote_literal(left(NEW.scope, 100))
        USING ERRCODE = 'feature_not_supported',
              DETAIL = 'idem_distribute() delegated the idempotency functions to the worker that holds the '
                       'scope''s shard; this call was not delegated, so it ran on the coordinator, whose '
                       'records no delegated call consults.',
              HINT = 'Make the call a statement of its own, SELECT idem_once(...) or SELECT ... FROM '
                     'idem_claim(...), with the scope as a constant or a bind parameter: Citus does not '
                     'delegate a call inside INSERT ... SELECT, a WHERE clause, a CTE, a subquery, a join or '
                     'a PL/pgSQL expression.';
END
$$;
REVOKE ALL ON FUNCTION idempotency.refuse_undelegated() FROM PUBLIC;
COMMENT ON FUNCTION idempotency.refuse_undelegated() IS
'Trigger of the Citus coordinator''s record table, put there by idem_distribute: a record written on the coordinator means a call that Citus did not delegate; it raises 0A000.';

CREATE FUNCTION idem_distribute(colocate_with regclass) RETURNS SETOF regprocedure
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ext_nsp name;
    local_group integer;
    part_method "char";
    rep_model "char";
    colocation integer;
    dist_column name;
    dist_type regtype;
    held bigint;
    f regprocedure;
    f_colocation integer;
    -- The consumer functions whose records belong to one scope, each with its scope parameter.
    -- idem_record_offset, idem_next_offset, idem_offsets and idem_reset_offset are not among them:
    -- offsets stay on the coordinator (see the README, "Scaling out").
    signatures constant text[] := ARRAY[
        'idem_claim(text, interval, text, text, boolean)',
        'idem_complete(text, jsonb, text, bigint)',
        'idem_fail(text, jsonb, boolean, text, bigint)',
        'idem_heartbeat(text, interval, text, bigint)',
        'idem_once(text, text)',
        'idem_status(text, text)',
        'idem_claim_batch(text[], interval, text)',
        'idem_complete_batch(text[], jsonb[], text, bigint[])',
        'idem_once_batch(text[], text)'];
    sig text;
    funcs regprocedure[] := '{}';
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'colocate_with must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    -- 1. Citus, and this node its coordinator.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'idem_distribute needs Citus: the extension citus is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On a Citus coordinator: CREATE EXTENSION citus, add the workers, distribute the '
                         'business tables by tenant, then call idem_distribute(''<one of them>'').';
    END IF;
    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO local_group;
    IF local_group IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'idem_distribute must run on the Citus coordinator (this node is in group %)', local_group
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    -- 2. A hash-distributed table with one shard placement per shard (what Citus can delegate to), whose
    -- distribution column is text or varchar: the scope is hashed as that column's value, so a tenant's
    -- scope must be the text of its distribution value.
    EXECUTE 'SELECT partmethod, repmodel, colocationid, column_to_column_name(logicalrelid, partkey)
               FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1'
       INTO part_method, rep_model, colocation, dist_column USING colocate_with;
    IF part_method IS NULL THEN
        RAISE EXCEPTION 'table % is not a distributed table', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Distribute it by its tenant column first: SELECT create_distributed_table(''<table>'', ''<tenant column>'').';
    END IF;
    IF part_method <> 'h' THEN
        RAISE EXCEPTION 'table % is not hash-distributed (a reference, single-shard or append table)', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Colocate with a table hash-distributed by its tenant column.';
    END IF;
    IF rep_model <> 's' THEN
        RAISE EXCEPTION 'table % has replicated shards: Citus delegates function calls only to tables with one placement per shard', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Distribute it with citus.shard_replication_factor = 1.';
    END IF;
    SELECT pg_catalog.format_type(a.atttypid, NULL)::regtype INTO dist_type
      FROM pg_catalog.pg_attribute a WHERE a.attrelid = colocate_with AND a.attname = dist_column;
    -- A domain counts as its base type.
    SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype::regtype ELSE t.oid::regtype END INTO dist_type
      FROM pg_catalog.pg_type t WHERE t.oid = dist_type;
    IF dist_type NOT IN ('text'::regtype, 'character varying'::regtype) THEN
        RAISE EXCEPTION 'table % is distributed by column % of type %, not text or varchar', colocate_with, dist_column, dist_type
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The scope argument is hashed as a value of the distribution column: it must be the tenant''s value as text.',
                  HINT = 'Colocate with a table distributed by a text or varchar tenant column.';
    END IF;

    -- 3. The coordinator must hold no shard of the group (calls for those scopes would run on the
    -- coordinator itself, which the guard below refuses) and no records (keys written before the scale-out:
    -- no delegated call would consult them).
    EXECUTE 'SELECT count(*) FROM pg_catalog.pg_dist_placement p JOIN pg_catalog.pg_dist_shard s USING (shardid)
              WHERE s.logicalrelid = $1 AND p.groupid = 0' INTO held USING colocate_with;
    IF held > 0 THEN
        RAISE EXCEPTION 'the coordinator holds % shards of %', held, colocate_with
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Calls for their scopes would run on the coordinator, whose record table refuses rows once the functions are delegated.',
                  HINT = 'Move them to workers (citus_drain_node on the coordinator, after citus_set_node_property(..., ''shouldhaveshards'', false)).';
    END IF;
    IF EXISTS (SELECT FROM idempotency.records) THEN
        RAISE EXCEPTION 'the coordinator''s idempotency.records holds keys'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Once the functions are delegated to the workers, no call consults the coordinator''s records: a redelivered message whose key is there would be processed again.',
                  HINT = 'Wait until retention dropped them (or delete them if they no longer matter), or copy each scope''s records to the worker that holds its shard, then call idem_distribute again.';
    END IF;

    -- 4. The functions, and none already delegated with another colocation group (the scopes would move
    -- to other nodes, away from their records).
    SELECT e.extnamespace::regnamespace::name INTO ext_nsp
      FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency';
    FOREACH sig IN ARRAY signatures LOOP
        f := pg_catalog.format('%I.%s', ext_nsp, sig)::regprocedure;
        EXECUTE 'SELECT colocationid FROM pg_catalog.pg_dist_object
                  WHERE classid = ''pg_catalog.pg_proc''::regclass AND objid = $1' INTO f_colocation USING f;
        IF f_colocation IS NOT NULL AND f_colocation <> colocation THEN
            RAISE EXCEPTION '% is already delegated with colocation group %, not % (the group of %)',
                            f, f_colocation, colocation, colocate_with
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Delegating it with another group sends each scope to other nodes, away from the records written so far.';
        END IF;
        funcs := funcs || f;
    END LOOP;

    -- 5. Everything checked: register. An error from Citus rolls all of it back with the caller's transaction.
    FOREACH f IN ARRAY funcs LOOP
        EXECUTE 'SELECT create_distributed_function($1, $2, colocate_with := $3, force_delegation := true)'
          USING f, 'scope', colocate_with::text;
        RETURN NEXT f;
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                    WHERE tgrelid = 'idempotency.records'::regclass AND tgname = 'idem_refuse_undelegated') THEN
        CREATE TRIGGER idem_refuse_undelegated BEFORE INSERT ON idempotency.records
            FOR EACH ROW EXECUTE FUNCTION idempotency.refuse_undelegated();
    END IF;
END
$$;
REVOKE ALL ON FUNCTION idem_distribute(regclass) FROM PUBLIC;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'On a Citus coordinator: delegates idem_claim, idem_complete, idem_fail, idem_heartbeat, idem_once, idem_status and the three batch forms by their scope argument, colocated with colocate_with (a table hash-distributed by a text or varchar tenant column), so each scope''s records live on the worker holding that tenant''s shard; the coordinator''s own record table then refuses rows (0A000). Returns the functions registered. Idempotent. 55000 outside Citus, off the coordinator, with records or shards on the coordinator, or when already delegated with another colocation group; 22023 for a table that is not hash-distributed by a text column.';

-- After citus_move_shard_placement moved a shard of the colocation group, the records of the scopes that
-- hash into that shard are still on the source worker (they are in its local record table, which the move
-- does not touch), while delegated calls for those scopes now go to the target: there, the keys are new.
-- idem_move_records copies those records to the target (skipping keys the target already has), raises the
-- target's token sequence above every copied token (fencing keeps working), then deletes them on the
-- source. Run it on the coordinator right after the move, with the consumers of the shard's tenants paused
-- from before the move until it returns. The records travel through the coordinator as one JSON document.
CREATE FUNCTION idem_move_records(shard_id bigint, source_node_name text, source_node_port integer,
                                  target_node_name text, target_node_port integer) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    local_group integer;
    rel regclass;
    lo integer;
    hi integer;
    shard_colocation integer;
    func_colocation integer;
    on_target boolean;
    ok boolean;
    res text;
    doc text;
    moved bigint;
    range_filter text;
BEGIN
    IF shard_id IS NULL OR source_node_name IS NULL OR source_node_port IS NULL
       OR target_node_name IS NULL OR target_node_port IS NULL THEN
        RAISE EXCEPTION 'idem_move_records: no argument may be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'idem_move_records needs Citus: the extension citus is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO local_group;
    IF local_group IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'idem_move_records must run on the Citus coordinator' USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    EXECUTE 'SELECT s.logicalrelid, s.shardminvalue::integer, s.shardmaxvalue::integer, p.colocationid
               FROM pg_catalog.pg_dist_shard s JOIN pg_catalog.pg_dist_partition p USING (logicalrelid)
              WHERE s.shardid = $1 AND p.partmethod = ''h'''
       INTO rel, lo, hi, shard_colocation USING shard_id;
    IF rel IS NULL THEN
        RAISE EXCEPTION 'shard % is not a shard of a hash-distributed table', shard_id USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE 'SELECT o.colocationid FROM pg_catalog.pg_dist_object o JOIN pg_catalog.pg_proc f ON f.oid = o.objid
              WHERE o.classid = ''pg_catalog.pg_proc''::regclass AND f.proname = ''idem_once''' INTO func_colocation;
    IF func_colocation IS DISTINCT FROM shard_colocation THEN
        RAISE EXCEPTION 'shard % of % is not in the colocation group the idempotency functions are delegated with', shard_id, rel
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'See idem_distribute.';
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p JOIN pg_catalog.pg_dist_node n USING (groupid)
                             WHERE p.shardid = $1 AND n.nodename = $2 AND n.nodeport = $3)'
       INTO on_target USING shard_id, target_node_name, target_node_port;
    IF NOT on_target THEN
        RAISE EXCEPTION 'shard % is not placed on %:% : move it first (citus_move_shard_placement)', shard_id,
                        target_node_name, target_node_port USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    range_filter := pg_catalog.format('worker_hash(scope) BETWEEN %s AND %s', lo, hi);
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, doc USING source_node_name, source_node_port,
            'SELECT coalesce(json_agg(r), ''[]'') FROM idempotency.records r WHERE ' || range_filter;
    IF NOT ok THEN
        RAISE EXCEPTION 'reading the records on %:% failed: %', source_node_name, source_node_port, doc
            USING ERRCODE = 'connection_failure';
    END IF;
    moved := pg_catalog.json_array_length(doc::json);
    IF moved = 0 THEN
        RETURN 0;
    END IF;
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, res USING target_node_name, target_node_port, pg_catalog.format($cmd$
        WITH j AS (SELECT * FROM json_populate_recordset(NULL::idempotency.records, %L::json)),
             parts AS (SELECT idempotency.premake_partitions(t) FROM (SELECT DISTINCT date_trunc('hour', created_at) t FROM j) d),
             seq AS (SELECT setval('idempotency.token_seq', greatest((SELECT last_value FROM idempotency.token_seq),
                                                                   (SELECT max(token) FROM j), 1)))
        SELECT (SELECT count(*) FROM parts) + (SELECT count(*) FROM seq)$cmd$, doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'preparing %:% failed: %', target_node_name, target_node_port, res USING ERRCODE = 'connection_failure';
    END IF;
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, res USING target_node_name, target_node_port, pg_catalog.format($cmd$
        INSERT INTO idempotency.records
        SELECT j.* FROM json_populate_recordset(NULL::idempotency.records, %L::json) j
         WHERE NOT EXISTS (SELECT FROM idempotency.records t WHERE t.scope = j.scope AND t.key = j.key)$cmd$, doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'writing the records on %:% failed: %', target_node_name, target_node_port, res
            USING ERRCODE = 'connection_failure';
    END IF;
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, res USING source_node_name, source_node_port, pg_catalog.format($cmd$
        DELETE FROM idempotency.records r USING json_populate_recordset(NULL::idempotency.records, %L::json) j
         WHERE r.scope = j.scope AND r.key = j.key$cmd$, doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'deleting the copied records on %:% failed: %', source_node_name, source_node_port, res
            USING ERRCODE = 'connection_failure', HINT = 'They are on the target already; call idem_move_records again.';
    END IF;
    RETURN moved;
END
$$;
REVOKE ALL ON FUNCTION idem_move_records(bigint, text, integer, text, integer) FROM PUBLIC;
COMMENT ON FUNCTION idem_move_records(bigint, text, integer, text, integer) IS
'On a Citus coordinator, after citus_move_shard_placement(shard_id, source, target): copies the idempotency records of the scopes hashing into that shard from the source worker to the target (keys the target has already are kept as they are), raises the target''s token sequence above the copied tokens, deletes them on the source; returns how many were read. Pause the consumers of the shard''s tenants from before the move until it returns.';

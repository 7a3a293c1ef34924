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
    -- The functions whose records belong to one scope (src/citus.rs, DELEGATED).
    signatures constant text[] := ARRAY(SELECT idempotency.delegated_functions());
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
'On a Citus coordinator: delegates idem_claim, idem_complete, idem_fail, idem_heartbeat, idem_once, idem_status, the three batch forms and the admin''s idem_redrive, idem_redrive_scope and idem_forget by their scope argument, colocated with colocate_with (a table hash-distributed by a text or varchar tenant column), so each scope''s records live on the worker holding that tenant''s shard; the coordinator''s own record table then refuses rows (0A000). Returns the functions registered. Idempotent. 55000 outside Citus, off the coordinator, with records or shards on the coordinator, or when already delegated with another colocation group; 22023 for a table that is not hash-distributed by a text column.';

-- The target's half of idem_move_records: writes the records it is sent (keys it has already are kept as
-- they are) and raises the token sequence above their tokens, so fencing goes on. A record whose time falls
-- in a sealed partition gets the end of the newest sealed range as its time instead, as a late writer's row
-- does: a sealed partition's filter knows only the keys it held when sealed, so a row added to it later
-- would never be found. Returns how many records were written.
CREATE FUNCTION idempotency.adopt_records(records json) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sealed_to timestamptz;
    written bigint;
BEGIN
    -- A seal holds SHARE on its partition until it commits. ROW EXCLUSIVE on every partition (what a claim
    -- takes on one) waits for a seal under way and keeps new ones out until this transaction ends, so that
    -- sealed_to stays true for the rows written below; claims go on meanwhile.
    LOCK TABLE idempotency.records IN ROW EXCLUSIVE MODE;
    SELECT max(s.range_to) INTO sealed_to FROM idempotency.sealed s;
    PERFORM pg_catalog.setval('idempotency.token_seq',
                              greatest((SELECT q.last_value FROM idempotency.token_seq q),
                                       (SELECT max(r.token) FROM json_populate_recordset(NULL::idempotency.records, records) r),
                                       1));
    INSERT INTO idempotency.records
           (scope, key, status, token, attempts, fingerprint, payload, error, created_at, updated_at, expires_at)
    SELECT r.scope, r.key, r.status, r.token, r.attempts, r.fingerprint, r.payload, r.error,
           greatest(r.created_at, sealed_to), r.updated_at, r.expires_at
      FROM json_populate_recordset(NULL::idempotency.records, records) r
     WHERE NOT EXISTS (SELECT FROM idempotency.records t WHERE t.scope = r.scope AND t.key = r.key);
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
REVOKE ALL ON FUNCTION idempotency.adopt_records(json) FROM PUBLIC;
COMMENT ON FUNCTION idempotency.adopt_records(json) IS
'The target worker''s half of idem_move_records: writes the records given as a JSON array (keeping the keys it has), a record of a sealed range at the end of the newest sealed partition, and raises the token sequence above their tokens; returns how many it wrote.';

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

    -- Every statement sent to a worker runs there as the caller under that database's search_path, which
    -- a role with CREATE on one of its schemas could fill with lookalikes: every function, type and
    -- operator in them is qualified.
    range_filter := pg_catalog.format(
        'pg_catalog.worker_hash(r.scope) OPERATOR(pg_catalog.>=) %s AND pg_catalog.worker_hash(r.scope) OPERATOR(pg_catalog.<=) %s',
        lo, hi);
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, doc USING source_node_name, source_node_port,
            'SELECT COALESCE(pg_catalog.json_agg(r), ''[]''::pg_catalog.json) FROM idempotency.records r WHERE '
            || range_filter;
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
        WITH j AS (SELECT * FROM pg_catalog.json_populate_recordset(NULL::idempotency.records, %L::pg_catalog.json)),
             parts AS (SELECT idempotency.premake_partitions(t)
                         FROM (SELECT DISTINCT pg_catalog.date_trunc('hour'::pg_catalog.text,
                                        GREATEST(j.created_at, (SELECT pg_catalog.max(s.range_to) FROM idempotency.sealed s))) t
                                 FROM j) d)
        SELECT pg_catalog.count(*) FROM parts$cmd$, doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'preparing %:% failed: %', target_node_name, target_node_port, res USING ERRCODE = 'connection_failure';
    END IF;
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, res USING target_node_name, target_node_port,
            pg_catalog.format('SELECT idempotency.adopt_records(%L::pg_catalog.json)', doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'writing the records on %:% failed: %', target_node_name, target_node_port, res
            USING ERRCODE = 'connection_failure';
    END IF;
    EXECUTE 'SELECT success, result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false)'
       INTO ok, res USING source_node_name, source_node_port, pg_catalog.format($cmd$
        DELETE FROM idempotency.records r
         USING pg_catalog.json_populate_recordset(NULL::idempotency.records, %L::pg_catalog.json) j
         WHERE r.scope OPERATOR(pg_catalog.=) j.scope AND r.key OPERATOR(pg_catalog.=) j.key$cmd$, doc);
    IF NOT ok THEN
        RAISE EXCEPTION 'deleting the copied records on %:% failed: %', source_node_name, source_node_port, res
            USING ERRCODE = 'connection_failure', HINT = 'They are on the target already; call idem_move_records again.';
    END IF;
    RETURN moved;
END
$$;
REVOKE ALL ON FUNCTION idem_move_records(bigint, text, integer, text, integer) FROM PUBLIC;
COMMENT ON FUNCTION idem_move_records(bigint, text, integer, text, integer) IS
'On a Citus coordinator, after citus_move_shard_placement(shard_id, source, target): copies the idempotency records of the scopes hashing into that shard from the source worker to the target (keys the target has already are kept as they are; a record of a range the target has sealed is written after it), raises the target''s token sequence above the copied tokens, deletes them on the source; returns how many were read. Pause the consumers of the shard''s tenants from before the move until it returns.';

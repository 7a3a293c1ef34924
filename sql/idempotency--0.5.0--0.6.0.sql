-- 0.5.0 -> 0.6.0: hostile sessions get nowhere (issue 20).
-- * idempotency.partitions reads each partition's range from its catalog entry through the new
--   idempotency.partition_range(text), never through text: under some DateStyle, TimeZone or zone
--   abbreviations the text read back hours away from the bound, and a consumer's keys went to the wrong
--   partition, where another session did not find them.
-- * idempotency.partitions and idempotency.stats are recreated with every operator's operands of exactly its
--   types and every function qualified: before, an operator a database owner planted in the schema
--   CREATE EXTENSION ran in (oid = regclass, bigint / double precision) was bound into them and ran as the
--   storage's owner.
-- * idem_move_records qualifies every function, type and operator of the statements it sends to Citus workers.
-- * pg_monitor no longer reads idempotency.in_flight and idempotency.dead_letters (keys, live fencing tokens,
--   stored errors): idempotency_admin does.
-- * Scope and consumer-group grants: idem_grant_scope, idem_revoke_scope, idem_grant_group,
--   idem_revoke_group and the table idempotency.scope_grants (empty: nothing changes until the first grant).
-- * idem_reset_offset takes generation => n, which replaces the stored generation.
-- * idem_distribute reads the functions it delegates from idempotency.delegated_functions(), the same table
--   as the planner hook that guards them.
-- Nothing stored changes. Run by ALTER EXTENSION idempotency UPDATE, after PostgreSQL was restarted on the
-- 0.6.0 library. Like the install script, this one qualifies what it calls: it runs with the extension's
-- schema on the search path.

CREATE FUNCTION idempotency.partition_range(bound text)
RETURNS TABLE (range_from timestamp with time zone, range_to timestamp with time zone)
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'partition_range_wrapper';
REVOKE ALL ON FUNCTION idempotency.partition_range(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.partition_range(text) TO idempotency_admin, pg_monitor;
COMMENT ON FUNCTION idempotency.partition_range(text) IS
'The range [range_from, range_to) of a partition bound (pg_class.relpartbound as text), read from its node tree (no row for a default partition); what idempotency.partitions shows, unmoved by DateStyle or TimeZone.';

CREATE OR REPLACE VIEW idempotency.partitions AS
SELECT c.oid::pg_catalog.regclass                             AS partition,
       b.range_from,
       b.range_to,
       GREATEST(c.reltuples, 0::pg_catalog.float4)::pg_catalog.int8 AS row_estimate,
       pg_catalog.pg_total_relation_size(c.oid)               AS total_bytes,
       pg_catalog.pg_size_pretty(pg_catalog.pg_total_relation_size(c.oid)) AS size,
       b.range_to OPERATOR(pg_catalog.+)
         pg_catalog.current_setting('idempotency.retention', true)::pg_catalog.interval AS dropped_after,
       s.sealed_at,
       s.blocks OPERATOR(pg_catalog.*) 32                     AS filter_bytes
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
  LEFT JOIN idempotency.sealed s
         ON s.partition OPERATOR(pg_catalog.=) c.oid AND s.partition_name OPERATOR(pg_catalog.=) c.relname
  LEFT JOIN LATERAL idempotency.partition_range(c.relpartbound::pg_catalog.text) b ON true
 WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::pg_catalog.oid
 ORDER BY b.range_from NULLS LAST;

CREATE OR REPLACE VIEW idempotency.stats AS
SELECT s.scope,
       s.counts[1]  AS claims,
       s.counts[2]  AS claimed_new,
       s.counts[3]  AS takeovers,
       s.counts[4]  AS retries,
       s.counts[5]  AS answered_completed,
       s.counts[6]  AS answered_in_progress,
       s.counts[7]  AS answered_failed,
       s.counts[8]  AS answered_mismatch,
       s.counts[9]  AS poisoned,
       s.counts[10] AS dead_lettered,
       s.counts[11] AS stale_refused,
       s.counts[12] AS serialization_failures,
       s.counts[13] AS lock_waits,
       s.counts[14]::pg_catalog.float8 OPERATOR(pg_catalog./) 1000.0::pg_catalog.float8 AS lock_wait_ms,
       s.counts[15] AS completes,
       s.counts[16] AS fails,
       s.counts[17] AS heartbeats,
       s.stats_reset
  FROM idempotency.scope_stats() s;

REVOKE SELECT ON idempotency.in_flight, idempotency.dead_letters FROM pg_monitor;

CREATE OR REPLACE FUNCTION idem_move_records(shard_id bigint, source_node_name text, source_node_port integer,
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

DROP FUNCTION idem_reset_offset(text, text, integer, bigint);
CREATE FUNCTION idem_reset_offset(consumer_group text, topic text, partition integer, next_offset bigint,
                                  generation bigint DEFAULT NULL)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_reset_offset_wrapper';
REVOKE ALL ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) IS
'Sets the next offset of (consumer_group, topic, partition), backwards or forwards, and, when generation is given, the stored generation (lower or higher: a zombie''s huge generation is undone here). For DBAs; not granted to idempotency_consumer.';

CREATE FUNCTION idempotency.scope_grants_changed() RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'scope_grants_changed_wrapper';

CREATE TABLE idempotency.scope_grants (
    role       regrole NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('scope', 'group')),
    pattern    text COLLATE "C" NOT NULL CHECK (pattern <> ''),
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (role, kind, pattern)
);
COMMENT ON TABLE idempotency.scope_grants IS
'Which roles may call with which scopes and consumer groups (idem_grant_scope, idem_grant_group). Enforced once a kind has a grant, or always with idempotency.require_scope_grants.';
-- Every change, by the functions below or by hand, tells every backend to read the grants again.
CREATE TRIGGER scope_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scope_grants
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.scope_grants_changed();
SELECT pg_catalog.pg_extension_config_dump('idempotency.scope_grants', '');

CREATE FUNCTION idempotency.grant_pattern(grantee regrole, kind text, pattern text, revoke boolean)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    done boolean;
BEGIN
    IF grantee IS NULL OR pattern IS NULL THEN
        RAISE EXCEPTION 'idempotency: role and % must not be NULL', kind USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pattern = '' THEN
        RAISE EXCEPTION 'idempotency: % must not be empty', kind
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Grant ''*'' for every name.';
    END IF;
    IF revoke THEN
        DELETE FROM idempotency.scope_grants g WHERE g.role = grantee AND g.kind = grant_pattern.kind
                                                 AND g.pattern = grant_pattern.pattern;
    ELSE
        INSERT INTO idempotency.scope_grants (role, kind, pattern) VALUES (grantee, grant_pattern.kind, grant_pattern.pattern)
            ON CONFLICT DO NOTHING;
    END IF;
    GET DIAGNOSTICS done = ROW_COUNT;
    RETURN done;
END
$$;
COMMENT ON FUNCTION idempotency.grant_pattern(regrole, text, text, boolean) IS
'What idem_grant_scope, idem_revoke_scope, idem_grant_group and idem_revoke_group do.';

CREATE FUNCTION idem_grant_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, false) $$;
CREATE FUNCTION idem_revoke_scope(role regrole, scope text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'scope', scope, true) $$;
CREATE FUNCTION idem_grant_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, false) $$;
CREATE FUNCTION idem_revoke_group(role regrole, consumer_group text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT idempotency.grant_pattern(role, 'group', consumer_group, true) $$;

REVOKE ALL ON FUNCTION idempotency.scope_grants_changed(), idempotency.grant_pattern(regrole, text, text, boolean),
    idem_grant_scope(regrole, text), idem_revoke_scope(regrole, text), idem_grant_group(regrole, text),
    idem_revoke_group(regrole, text) FROM PUBLIC;
-- Scope and consumer-group grants (sql/grants.sql): idempotency_admin fences consumers by scope.
GRANT SELECT ON idempotency.scope_grants TO idempotency_admin;
GRANT EXECUTE ON FUNCTION
    idem_grant_scope(regrole, text),
    idem_revoke_scope(regrole, text),
    idem_grant_group(regrole, text),
    idem_revoke_group(regrole, text)
TO idempotency_admin;
COMMENT ON FUNCTION idem_grant_scope(regrole, text) IS
'Lets members of role call with scope (a name, or a prefix followed by *). Once any scope is granted, a consumer without a grant gets 42501 from every call with a scope (idempotency.require_scope_grants enforces it before the first grant). True when the grant is new. For idempotency_admin.';
COMMENT ON FUNCTION idem_revoke_scope(regrole, text) IS
'Takes back a grant of idem_grant_scope (the same role and pattern); true when there was one. For idempotency_admin.';
COMMENT ON FUNCTION idem_grant_group(regrole, text) IS
'Lets members of role record and read the offsets of consumer_group (a name, or a prefix followed by *). Once any group is granted, a consumer without a grant gets 42501 from the offset calls of other groups. True when the grant is new. For idempotency_admin.';
COMMENT ON FUNCTION idem_revoke_group(regrole, text) IS
'Takes back a grant of idem_grant_group (the same role and pattern); true when there was one. For idempotency_admin.';
COMMENT ON FUNCTION idempotency.scope_grants_changed() IS
'Statement trigger of idempotency.scope_grants: every backend reads the grants again after the change commits.';

CREATE FUNCTION idempotency.delegated_functions() RETURNS SETOF text
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delegated_functions_wrapper';
REVOKE ALL ON FUNCTION idempotency.delegated_functions() FROM PUBLIC;
COMMENT ON FUNCTION idempotency.delegated_functions() IS
'The functions idem_distribute delegates to the Citus workers by their scope argument (regprocedure text), from the same table as the planner hook that guards them.';

CREATE OR REPLACE FUNCTION idem_distribute(colocate_with regclass) RETURNS SETOF regprocedure
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

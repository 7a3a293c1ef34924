-- Privileges, documentation and the first partitions. Runs after the generated functions.

-- The API is not for PUBLIC: grant the role idempotency_consumer to the roles that consume.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_consumer') THEN
        CREATE ROLE idempotency_consumer NOLOGIN;
    END IF;
END
$$;

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

-- What a consumer needs. (idem_reset_offset and idempotency.* stay with the owner: DBA moves.)
GRANT EXECUTE ON FUNCTION
    idem_claim(text, interval, text, text, boolean),
    idem_complete(text, jsonb, text, bigint),
    idem_fail(text, jsonb, boolean, text, bigint),
    idem_heartbeat(text, interval, text, bigint),
    idem_once(text, text),
    idem_status(text, text),
    idem_claim_batch(text[], interval, text),
    idem_complete_batch(text[], jsonb[], text, bigint[]),
    idem_once_batch(text[], text),
    idem_record_offset(text, text, integer, bigint, bigint),
    idem_next_offset(text, text, integer),
    idem_offsets(text, text),
    idem_key(uuid, text[]),
    idem_fingerprint(jsonb, text[])
TO idempotency_consumer;

COMMENT ON FUNCTION idem_claim(text, interval, text, text, boolean) IS
'Claims (scope, key) for processing. outcome: claimed (you own it; token is your fencing token), completed (payload replays the stored result), in_progress (another holder''s lease is live), failed (terminal; payload is the stored error), mismatch (same key, different fingerprint). ttl NULL = idempotency.lease_ttl.';
COMMENT ON FUNCTION idem_complete(text, jsonb, text, bigint) IS
'Marks a claimed key completed and stores payload for replay. token may be NULL only in the transaction that claimed. Errors: P0002 unknown key, 55000 already terminal, 55006 lease lost.';
COMMENT ON FUNCTION idem_fail(text, jsonb, boolean, text, bigint) IS
'Records a failed attempt. retryable: releases the key for another claim and returns released, or returns failed once idempotency.max_attempts is reached. Not retryable: terminal at once, returns failed.';
COMMENT ON FUNCTION idem_heartbeat(text, interval, text, bigint) IS
'Extends the caller''s lease to now + ttl and returns the new expires_at. 55006 if the lease was lost.';
COMMENT ON FUNCTION idem_once(text, text) IS
'True exactly once per (scope, key) over all committed transactions; records the key as completed in the caller''s transaction.';
COMMENT ON FUNCTION idem_status(text, text) IS
'The stored record of (scope, key): status, attempts, token, payload, error and timestamps; no row if unknown.';
COMMENT ON FUNCTION idem_claim_batch(text[], interval, text) IS
'Claims many keys of one scope in one call (one broker poll); one row per input key, in input order, with the same outcomes as idem_claim. Keys are locked in sorted order.';
COMMENT ON FUNCTION idem_complete_batch(text[], jsonb[], text, bigint[]) IS
'Completes many claimed keys; payloads and tokens, when given, pair with keys by position. All or nothing; returns the number completed.';
COMMENT ON FUNCTION idem_once_batch(text[], text) IS
'The keys of the batch seen for the first time over all committed transactions, each once, in input order; records them as completed.';
COMMENT ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) IS
'Stores processed_offset + 1 as the next offset of (consumer_group, topic, partition) in the caller''s transaction. False when processed_offset is not beyond the stored position (a duplicate). 55006 when generation is older than the stored one.';
COMMENT ON FUNCTION idem_next_offset(text, text, integer) IS
'Where to seek on restart: last processed offset + 1, or NULL when nothing is stored.';
COMMENT ON FUNCTION idem_offsets(text, text) IS
'Stored positions of a consumer group (optionally one topic), for the startup seek.';
COMMENT ON FUNCTION idem_key(uuid, text[]) IS
'A key derived from a message''s identifying parts: the version-5 UUID of namespace and the parts (each as <UTF-8 length>:<bytes>;), as text. The client libraries compute the same value.';
COMMENT ON FUNCTION idem_fingerprint(jsonb, text[]) IS
'A request fingerprint for idem_claim: hex SHA-256 of the RFC 8785 canonical JSON of the document, or of an object mapping each given JSON Pointer to its value (null when absent). The client libraries compute the same value.';
COMMENT ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) IS
'Sets the next offset of (consumer_group, topic, partition), backwards or forwards, and, when generation is given, the stored generation (lower or higher: a zombie''s huge generation is undone here). For DBAs; not granted to idempotency_consumer.';
COMMENT ON FUNCTION idem_maintenance(timestamptz) IS
'One maintenance round as of as_of: premake partitions, drop those older than idempotency.retention, reclaim leases expired longer than idempotency.reclaim_after. What the background worker runs; call it from cron when the library cannot be preloaded.';
COMMENT ON FUNCTION idem_partman_handover() IS
'Registers idempotency.records with pg_partman (create_parent, retention and premake from the GUCs). Set idempotency.partition_manager = pg_partman first.';
COMMENT ON FUNCTION idempotency.seal_partition(oid) IS
'Seals a partition of idempotency.records (an oid: pass ''idempotency.records_p...''::regclass) now and builds its membership filter (maintenance seals past partitions by itself). Waits for the partition''s writers within lock_timeout. Sealing the partition of the present moves new keys to the next one. False if it was sealed already.';
COMMENT ON FUNCTION idempotency.partition_range(text) IS
'The range [range_from, range_to) of a partition bound (pg_class.relpartbound as text), read from its node tree (no row for a default partition); what idempotency.partitions shows, unmoved by DateStyle or TimeZone.';
COMMENT ON FUNCTION idempotency.premake_partitions(timestamptz) IS
'Creates the missing partitions of idempotency.records from as_of to idempotency.premake intervals ahead; returns how many.';

-- Watching and steering: idempotency_admin redrives and forgets keys and resets the statistics;
-- it and pg_monitor read the statistics, the health snapshot and the partitions. Only idempotency_admin
-- reads the views of keys in flight and dead letters: keys, live fencing tokens and stored errors often
-- hold personal data, and a token lets its reader complete another consumer's lease. Consumers get none
-- of it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA idempotency TO idempotency_admin, pg_monitor;
GRANT SELECT ON idempotency.stats, idempotency.partitions TO idempotency_admin, pg_monitor;
GRANT SELECT ON idempotency.in_flight, idempotency.dead_letters TO idempotency_admin;
GRANT EXECUTE ON FUNCTION
    idem_stats(),
    idem_metrics(),
    idempotency.scope_stats(),
    idempotency.stats_totals(),
    idempotency.maintenance_state(),
    idempotency.partition_range(text)
TO idempotency_admin, pg_monitor;
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
GRANT EXECUTE ON FUNCTION
    idem_stats_reset(text),
    idem_redrive(text, text),
    idem_redrive_scope(text, timestamptz, integer),
    idem_forget(text, text)
TO idempotency_admin;

COMMENT ON VIEW idempotency.stats IS
'Cumulative counters per scope of this database since stats_reset (shared memory; needs shared_preload_libraries). Counted when the calling transaction ends, committed or not. scope NULL: the scopes beyond idempotency.stats_max_scopes. claims = claimed_new + takeovers + retries + answered_*.';
COMMENT ON VIEW idempotency.in_flight IS
'Pending keys: state leased (live lease), expired (lease ended, not taken over yet) or released (a retryable failure, waiting for the next claim); age = now - created_at.';
COMMENT ON VIEW idempotency.dead_letters IS
'Terminal failures with their stored error: idem_fail(retryable => false), retries past idempotency.max_attempts, poison messages. idem_redrive makes them claimable again.';
COMMENT ON FUNCTION idem_stats() IS
'The counters of idempotency.stats added up over all scopes of this database, with the number of scopes, whether counting is on (library preloaded and idempotency.stats on) and the oldest stats_reset.';
COMMENT ON FUNCTION idem_stats_reset(text) IS
'Zeroes the counters of one scope, or of all scopes of this database (NULL); returns the time of the reset. For idempotency_admin.';
COMMENT ON FUNCTION idem_metrics() IS
'Health snapshot computed now, one row per scope: retained, completed, in flight, oldest in flight, expired leases, awaiting retry, dead letters; and for the database: partitions, premade_ahead, the maintenance rounds (needs the library preloaded), worker_running. Reads every retained record.';
COMMENT ON FUNCTION idem_redrive(text, text) IS
'Makes a failed (dead-letter) key claimable again: released, attempts counted from zero, error kept. False when the key is not failed; P0002 when unknown. Takes the key lock. For idempotency_admin.';
COMMENT ON FUNCTION idem_redrive_scope(text, timestamptz, integer) IS
'Redrives up to max_keys failed keys of a scope (failed since failed_since, when given), in key order; returns how many. Call again until 0. Holds each key''s lock until commit. For idempotency_admin.';
COMMENT ON FUNCTION idem_forget(text, text) IS
'Deletes a key''s record whatever its state, so that it is processed again from scratch; false when unknown. A holder of its lease then gets P0002. Takes the key lock. For idempotency_admin.';
COMMENT ON FUNCTION idempotency.scope_stats() IS
'The counters behind idempotency.stats, per scope, in the order of its columns (lock waits in microseconds).';
COMMENT ON FUNCTION idempotency.stats_totals() IS
'The counters behind idem_stats(), added up over the scopes of this database.';
COMMENT ON FUNCTION idempotency.maintenance_state() IS
'The last maintenance round of this database since the server started (worker or idem_maintenance()), how many ran and failed, the last error. Empty without the library preloaded.';

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

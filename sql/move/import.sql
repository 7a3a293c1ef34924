-- Moving between editions (docs/managed.md, "Moving between editions"), step 2 of 2: the import.
--
--   psql -X -v ON_ERROR_STOP=1 -d TARGET_DB -f sql/move/import.sql
--
-- Run in the target database after the other edition is installed there (and, when moving to another server,
-- after pg_restore of the schema idempotency_move that sql/move/export.sql wrote in the source). Run it as a
-- superuser when the target is the native extension, as the edition's owner when it is the SQL edition.
--
-- CONSUMERS MUST BE STOPPED DURING THE WHOLE MOVE, from before the export until this import has committed,
-- and so must any scheduled idem_maintenance() of the target: the import refuses a target that holds records
-- already, and a key written there meanwhile could be claimed twice.
--
-- One transaction, which:
--   1. refuses unless idempotency_move is there, the target has no records and no offsets yet, every role a
--      scope grant names exists here (CREATE ROLE the missing ones first: a dropped grant would widen
--      access), and no partition the rows need is sealed already (a target whose maintenance ran for longer
--      than a partition interval: install afresh and import before scheduling maintenance);
--   2. makes the partitions the rows need: idempotency.premake_partitions for every partition slot from the
--      oldest created_at to now, one call per partition interval of the target (the native extension's
--      idempotency.partition_interval, the SQL edition's idempotency.settings.partition_interval), so the
--      partitions run without a gap from the oldest row to the present, whatever either edition's interval;
--   3. inserts the rows as they are (every column), sets idempotency.token_seq so that the next token is
--      above every moved token and above the source's sequence, copies the offsets (with their generations)
--      and the scope grants (by role name);
--   4. runs one maintenance round, SELECT * FROM idem_maintenance(), which seals the past partitions (new
--      keys then go to the present one, and the native extension builds its filters of the moved keys), and
--      drops idempotency_move.
-- The first maintenance round also applies the target's retention: rows in partitions older than the
-- target's retention are dropped there, as they would be in the source. Settings (GUCs of the native
-- extension, idempotency.settings of the SQL edition) are not moved: set them on the target by hand.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;

DO $move_import$
DECLARE
    edition text;
    step interval;
    manager text;
    lo timestamptz;
    hi timestamptz;
    t timestamptz;
    sealed_to timestamptz;
    missing text;
    n_records bigint;
    n_offsets bigint;
    n_grants bigint;
    position bigint;
    made integer := 0;
BEGIN
    IF pg_catalog.to_regclass('idempotency_move.records') IS NULL OR pg_catalog.to_regclass('idempotency_move.offsets') IS NULL
       OR pg_catalog.to_regclass('idempotency_move.scope_grants') IS NULL OR pg_catalog.to_regclass('idempotency_move.about') IS NULL THEN
        RAISE EXCEPTION 'idempotency move: no export in database "%" (the schema idempotency_move and its tables records, offsets, scope_grants, about)', pg_catalog.current_database()
            USING ERRCODE = 'undefined_table',
                  HINT = 'Run sql/move/export.sql in the source first; from another server, pg_dump -n idempotency_move there and pg_restore it here.';
    END IF;
    IF pg_catalog.to_regclass('idempotency.records') IS NULL OR pg_catalog.to_regprocedure('idempotency.premake_partitions(timestamptz)') IS NULL THEN
        RAISE EXCEPTION 'idempotency move: no edition of idempotency is installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'undefined_table',
                  HINT = 'CREATE EXTENSION idempotency (the native extension, or the pg_tle edition), or run the SQL edition''s idempotency.sql, then this again.';
    END IF;

    -- Which edition this is, and its partition interval.
    IF pg_catalog.to_regclass('idempotency.settings') IS NOT NULL THEN
        edition := 'SQL edition';
        EXECUTE 'SELECT s.partition_interval, s.partition_manager FROM idempotency.settings s' INTO step, manager;
    ELSE
        edition := 'native extension';
        IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
            RAISE EXCEPTION 'idempotency move: the import into the native extension is run by a superuser'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        -- The library registers its settings when it loads: a call loads it (and makes the present's partitions).
        PERFORM idempotency.premake_partitions(pg_catalog.now());
        SELECT pg_catalog.make_interval(secs => s.setting::pg_catalog.float8) INTO step
          FROM pg_catalog.pg_settings s WHERE s.name OPERATOR(pg_catalog.=) 'idempotency.partition_interval';
        manager := pg_catalog.current_setting('idempotency.partition_manager', true);
    END IF;
    IF step IS NULL OR step OPERATOR(pg_catalog.<) '1 minute'::interval THEN
        RAISE EXCEPTION 'idempotency move: cannot read the partition interval of the target (%)', coalesce(step::text, 'none');
    END IF;
    IF manager IS DISTINCT FROM 'builtin' THEN
        RAISE EXCEPTION 'idempotency move: the target''s partition_manager is %, not builtin', coalesce(manager, 'unknown')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Import with the builtin partition manager; hand over to pg_partman afterwards (idem_partman_handover).';
    END IF;

    -- Only into an empty target: a second import, or one over keys written meanwhile, could claim a key twice.
    IF EXISTS (SELECT FROM idempotency.records) THEN
        RAISE EXCEPTION 'idempotency move: the target database "%" holds records already', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Import into a freshly installed edition (consumers stopped); nothing was changed.';
    END IF;
    IF EXISTS (SELECT FROM idempotency.offsets) THEN
        RAISE EXCEPTION 'idempotency move: the target database "%" holds offsets already', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Import into a freshly installed edition (consumers stopped); nothing was changed.';
    END IF;

    -- Every role a grant names must exist here: a grant left out would widen what a consumer may do.
    SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(g.role_name), ', ') INTO missing
      FROM idempotency_move.scope_grants g
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) g.role_name);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency move: the scope grants name roles that do not exist here: %', missing
            USING ERRCODE = 'undefined_object', HINT = 'CREATE ROLE them (and GRANT idempotency_consumer TO them) first; nothing was changed.';
    END IF;

    -- The partitions: from the oldest row's slot to the present (and the newest row's, if ahead), no gap.
    SELECT pg_catalog.min(m.created_at), pg_catalog.max(m.created_at) INTO lo, hi FROM idempotency_move.records m;
    SELECT pg_catalog.max(x.range_to) INTO sealed_to FROM idempotency.sealed x;
    IF lo IS NOT NULL AND sealed_to IS NOT NULL AND lo OPERATOR(pg_catalog.<) sealed_to THEN
        RAISE EXCEPTION 'idempotency move: the target''s partitions are sealed up to %, and the oldest moved row was created at %', sealed_to, lo
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its maintenance ran for longer than a partition interval: install the edition afresh (DROP EXTENSION, or sql/move/uninstall-sql-edition.sql, and install again) and import before scheduling maintenance.';
    END IF;
    hi := GREATEST(hi, pg_catalog.now());
    t := coalesce(lo, hi);
    LOOP
        made := made OPERATOR(pg_catalog.+) idempotency.premake_partitions(t);
        EXIT WHEN t OPERATOR(pg_catalog.>=) hi;
        t := LEAST(t OPERATOR(pg_catalog.+) step, hi);
    END LOOP;

    INSERT INTO idempotency.records (scope, key, status, token, attempts, fingerprint, payload, error,
                                     created_at, updated_at, expires_at)
    SELECT m.scope, m.key, m.status, m.token, m.attempts, m.fingerprint, m.payload, m.error,
           m.created_at, m.updated_at, m.expires_at
      FROM idempotency_move.records m
     ORDER BY m.created_at;
    GET DIAGNOSTICS n_records = ROW_COUNT;
    -- The SQL edition's key calls skip partitions ahead of the write partition that maintenance found empty:
    -- the rows just written may be there.
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute a
                WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idempotency.partition_ranges')
                  AND a.attname OPERATOR(pg_catalog.=) 'known_empty' AND NOT a.attisdropped) THEN
        EXECUTE 'UPDATE idempotency.partition_ranges SET known_empty = false WHERE known_empty';
    END IF;

    -- A seal that committed before the inserts above took their partitions' locks is seen here: its rows
    -- would be missing from the seal's bookkeeping (the native extension's filters).
    IF EXISTS (SELECT FROM idempotency.sealed x
                WHERE EXISTS (SELECT FROM idempotency.records r WHERE r.tableoid OPERATOR(pg_catalog.=) x.partition)) THEN
        RAISE EXCEPTION 'idempotency move: a partition the rows went to was sealed during the import'
            USING ERRCODE = '40001', HINT = 'Stop the target''s maintenance (scheduler, or the native worker''s database) and import again.';
    END IF;

    -- The next token is above every token handed out in the source, and above anything handed out here.
    SELECT GREATEST(a.token_position, (SELECT pg_catalog.max(m.token) FROM idempotency_move.records m),
                    (SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value OPERATOR(pg_catalog.-) 1 END
                       FROM idempotency.token_seq q))
      INTO position FROM idempotency_move.about a;
    IF position OPERATOR(pg_catalog.>=) 1 THEN
        PERFORM pg_catalog.setval('idempotency.token_seq', position, true);
    END IF;

    INSERT INTO idempotency.offsets (consumer_group, topic, partition, next_offset, generation, updated_at)
    SELECT o.consumer_group, o.topic, o.partition, o.next_offset, o.generation, o.updated_at
      FROM idempotency_move.offsets o;
    GET DIAGNOSTICS n_offsets = ROW_COUNT;

    INSERT INTO idempotency.scope_grants (role, kind, pattern, granted_at)
    SELECT pg_catalog.quote_ident(g.role_name)::pg_catalog.regrole, g.kind, g.pattern, g.granted_at
      FROM idempotency_move.scope_grants g
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n_grants = ROW_COUNT;

    RAISE NOTICE 'idempotency move into the % of database "%": % records, % offsets, % scope grants; % partitions made; next token above %',
        edition, pg_catalog.current_database(), n_records, n_offsets, n_grants, made, position;
END
$move_import$;

-- One maintenance round, SELECT * FROM idem_maintenance() (found in the schema where the edition put it):
-- seals the past partitions, so that new keys go to the present one; applies the target's retention.
DO $move_import$
DECLARE
    fn text;
    r record;
BEGIN
    SELECT pg_catalog.format('%I.idem_maintenance', n.nspname) INTO STRICT fn
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
     WHERE p.proname OPERATOR(pg_catalog.=) 'idem_maintenance' AND p.pronargs OPERATOR(pg_catalog.=) 1
       AND n.nspname OPERATOR(pg_catalog.<>) 'idempotency_move';
    EXECUTE pg_catalog.format('SELECT * FROM %s()', fn) INTO STRICT r;
    RAISE NOTICE 'idempotency move: %() %', fn, r;
    -- What the round dropped (rows older than the target's retention, expired leases reclaimed) is said.
    IF (SELECT pg_catalog.count(*) FROM idempotency.records) OPERATOR(pg_catalog.<>) (SELECT pg_catalog.count(*) FROM idempotency_move.records) THEN
        RAISE WARNING 'idempotency move: % of % moved records are left after the first maintenance round (the others were older than the target''s retention, or leases expired longer than reclaim_after ago)',
            (SELECT pg_catalog.count(*) FROM idempotency.records), (SELECT pg_catalog.count(*) FROM idempotency_move.records);
    END IF;
END
$move_import$;

DROP SCHEMA idempotency_move CASCADE;
COMMIT;

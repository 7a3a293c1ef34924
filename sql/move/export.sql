-- Moving between editions (docs/managed.md, "Moving between editions"), step 1 of 2: the export.
--
--   psql -X -v ON_ERROR_STOP=1 -d SOURCE_DB -f sql/move/export.sql
--
-- Copies everything the idempotency extension keeps into a new schema idempotency_move of the same database:
--   idempotency_move.records       every row of idempotency.records, every column as it is
--   idempotency_move.offsets       every row of idempotency.offsets, every column
--   idempotency_move.scope_grants  the scope and group grants, with the role's NAME (role_name), not its oid,
--                                  so that they restore on another server
--   idempotency_move.about         one row: where it came from, when, how many rows of each, and
--                                  token_position, the token sequence's position: the greater of its last_value
--                                  and the largest token of any record (sql/move/import.sql sets the target's
--                                  sequence above it, so no token is ever handed out twice)
-- sql/move/import.sql, run in the target database once the other edition is installed there, reads them back
-- and drops the schema. Works unchanged on either edition: run it as a superuser on the native extension, as
-- the edition's owner (the role that installed it) on the SQL edition, plain or through pg_tle.
--
-- STOP EVERY CONSUMER (and any scheduled idem_maintenance()) BEFORE THE EXPORT, and keep them stopped until
-- the import has committed in the target: a key claimed or completed after the export is not moved, and a
-- consumer working on both sides of a move could process a message twice. The export also takes SHARE locks
-- on the three tables, so writers that are still running wait for it (and it for them).
--
-- One transaction: either the whole copy is there or nothing is. It refuses to run when idempotency_move
-- exists already (an earlier export not imported yet: import it, or DROP SCHEMA idempotency_move CASCADE).
-- When a superuser runs it, the schema and its tables are given to the database's owner, who can then run the
-- import into a SQL edition in this same database.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;

DO $move_export$
BEGIN
    IF pg_catalog.to_regnamespace('idempotency_move') IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency move: the schema idempotency_move exists already in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'duplicate_schema',
                  HINT = 'An earlier export that was not imported yet: run sql/move/import.sql in the target, or DROP SCHEMA idempotency_move CASCADE and export again.';
    END IF;
    IF pg_catalog.to_regclass('idempotency.records') IS NULL OR pg_catalog.to_regclass('idempotency.offsets') IS NULL
       OR pg_catalog.to_regclass('idempotency.scope_grants') IS NULL OR pg_catalog.to_regclass('idempotency.token_seq') IS NULL THEN
        RAISE EXCEPTION 'idempotency move: no idempotency storage (idempotency.records, offsets, scope_grants, token_seq) in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'undefined_table';
    END IF;
END
$move_export$;

-- Writers still running wait here until they commit, and new ones wait for the end of the export: every
-- statement below (READ COMMITTED, each with a fresh snapshot) sees the same rows.
LOCK TABLE idempotency.records, idempotency.offsets, idempotency.scope_grants IN SHARE MODE;

CREATE SCHEMA idempotency_move;
COMMENT ON SCHEMA idempotency_move IS 'An export of the idempotency extension (sql/move/export.sql), read and dropped by sql/move/import.sql.';
REVOKE ALL ON SCHEMA idempotency_move FROM PUBLIC;

CREATE TABLE idempotency_move.records AS
SELECT r.scope, r.key, r.status, r.token, r.attempts, r.fingerprint, r.payload, r.error,
       r.created_at, r.updated_at, r.expires_at
  FROM idempotency.records r;

CREATE TABLE idempotency_move.offsets AS
SELECT o.consumer_group, o.topic, o.partition, o.next_offset, o.generation, o.updated_at
  FROM idempotency.offsets o;

-- A grant names its role by oid (regrole); the name is what means the same role on another server. A grant of
-- a role dropped since (no name any more) grants nothing and is left out, with a notice.
CREATE TABLE idempotency_move.scope_grants AS
SELECT a.rolname::text AS role_name, g.kind, g.pattern, g.granted_at
  FROM idempotency.scope_grants g
  JOIN pg_catalog.pg_roles a ON a.oid OPERATOR(pg_catalog.=) g.role::pg_catalog.oid;

CREATE TABLE idempotency_move.about AS
SELECT CASE WHEN pg_catalog.to_regclass('idempotency.settings') IS NOT NULL THEN 'SQL edition' ELSE 'native extension' END AS source_edition,
       coalesce((SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'),
                'plain script') AS source_version,
       pg_catalog.current_database()::text AS source_database,
       pg_catalog.version() AS source_server,
       pg_catalog.now() AS exported_at,
       current_user::text AS exported_by,
       GREATEST((SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value OPERATOR(pg_catalog.-) 1 END
                   FROM idempotency.token_seq q),
                (SELECT pg_catalog.max(m.token) FROM idempotency_move.records m),
                0) AS token_position,
       (SELECT pg_catalog.count(*) FROM idempotency_move.records) AS records,
       (SELECT pg_catalog.count(*) FROM idempotency_move.offsets) AS offsets,
       (SELECT pg_catalog.count(*) FROM idempotency_move.scope_grants) AS scope_grants;

DO $move_export$
DECLARE
    lost bigint;
    owner_name name;
    t text;
BEGIN
    SELECT pg_catalog.count(*) INTO lost FROM idempotency.scope_grants g
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) g.role::pg_catalog.oid);
    IF lost OPERATOR(pg_catalog.>) 0 THEN
        RAISE NOTICE 'idempotency move: % scope grant(s) of roles dropped since are not exported (they grant nothing)', lost;
    END IF;
    -- A superuser's export is handed to the database's owner, who installs and imports the SQL edition.
    SELECT pg_catalog.pg_get_userbyid(d.datdba) INTO owner_name FROM pg_catalog.pg_database d
     WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database();
    IF owner_name OPERATOR(pg_catalog.<>) current_user
       AND (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        EXECUTE pg_catalog.format('ALTER SCHEMA idempotency_move OWNER TO %I', owner_name);
        FOREACH t IN ARRAY ARRAY['records', 'offsets', 'scope_grants', 'about'] LOOP
            EXECUTE pg_catalog.format('ALTER TABLE idempotency_move.%I OWNER TO %I', t, owner_name);
        END LOOP;
    END IF;
    RAISE NOTICE 'idempotency move: exported % records, % offsets, % scope grants, token position % into idempotency_move',
        (SELECT a.records FROM idempotency_move.about a), (SELECT a.offsets FROM idempotency_move.about a),
        (SELECT a.scope_grants FROM idempotency_move.about a), (SELECT a.token_position FROM idempotency_move.about a);
END
$move_export$;

COMMIT;

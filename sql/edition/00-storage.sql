-- The SQL edition (docs/managed.md): the storage. The same tables and columns as the native extension's
-- sql/bootstrap.sql for what is kept (records, offsets, scope grants, the token sequence), so that moving
-- between the editions copies rows as they are; its own tables for what it manages differently (sealing,
-- settings). Installed by a non-superuser (the database owner, or pg_tle's pgtle_admin); that role owns
-- every object here and the SECURITY DEFINER functions run as it. Nothing here is reachable by PUBLIC.
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

-- The roles, created when missing (cluster-wide). Needs CREATEROLE, which every managed service's admin
-- role has. The documented next step is the installing role's GRANT idempotency_consumer TO a consumer: on
-- PostgreSQL 16 and later only a role with ADMIN OPTION on a role may grant it (the role that created it
-- has that, a superuser always), so a second database's owner, installing after another database's install
-- made the roles, cannot. The install goes on (a superuser or another admin may grant the roles itself),
-- but says so at once, with who holds ADMIN OPTION and what they run (docs/managed.md). Up to 15, CREATEROLE
-- grants any role that is not a superuser. "Can grant" is what GRANT itself needs: ADMIN OPTION held by
-- this role or by a role whose privileges it inherits (a role that only created an ADMIN holder gets
-- "no possible grantors").
DO $$
DECLARE
    me constant name := current_user;
    v16 constant boolean := pg_catalog.current_setting('server_version_num')::integer OPERATOR(pg_catalog.>=) 160000;
    r text;
    cannot text[] := ARRAY[]::text[];
    holders text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_consumer') THEN
        CREATE ROLE idempotency_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
    IF (SELECT u.rolsuper OR (u.rolcreaterole AND NOT v16) FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) me) THEN
        RETURN;
    END IF;
    FOREACH r IN ARRAY ARRAY['idempotency_consumer', 'idempotency_admin'] LOOP
        IF NOT (CASE WHEN v16
                     THEN EXISTS (SELECT FROM pg_catalog.pg_auth_members a
                                   WHERE a.roleid OPERATOR(pg_catalog.=) r::pg_catalog.regrole::pg_catalog.oid
                                     AND a.admin_option AND pg_catalog.pg_has_role(me, a.member, 'USAGE'))
                     ELSE pg_catalog.pg_has_role(me, r, 'MEMBER WITH ADMIN OPTION') END) THEN
            cannot := pg_catalog.array_append(cannot, r);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(cannot) OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(m.rolname), ', ') INTO holders
      FROM pg_catalog.pg_auth_members a JOIN pg_catalog.pg_roles m ON m.oid OPERATOR(pg_catalog.=) a.member
     WHERE a.admin_option AND a.roleid OPERATOR(pg_catalog.=) ANY (cannot::pg_catalog.regrole[]::pg_catalog.oid[]);
    RAISE WARNING 'idempotency: role % cannot grant %: the roles exist, and it holds no ADMIN OPTION on them',
        pg_catalog.quote_ident(me), pg_catalog.array_to_string(cannot, ', ')
        USING DETAIL = CASE WHEN v16
            THEN 'The roles are the server''s, not the database''s, and were made before (by the install in another '
                 'database, or by hand); since PostgreSQL 16 only a role with ADMIN OPTION on a role may grant it (held by '
                 OPERATOR(pg_catalog.||) coalesce(holders OPERATOR(pg_catalog.||) ', and by ', '') OPERATOR(pg_catalog.||) 'superusers).'
            ELSE 'Up to PostgreSQL 15, granting them needs CREATEROLE or ADMIN OPTION on them.' END,
        HINT = pg_catalog.format('So that %s can grant them to its consumers, %s runs: GRANT %s TO %s WITH ADMIN OPTION%s; '
                                 'or that role grants them to the consumer roles itself.',
            pg_catalog.quote_ident(me),
            CASE WHEN NOT v16 THEN 'a role with CREATEROLE or a superuser'
                 WHEN holders IS NULL THEN 'a superuser'
                 ELSE 'a role with ADMIN OPTION on them (' OPERATOR(pg_catalog.||) holders OPERATOR(pg_catalog.||) ') or a superuser' END,
            pg_catalog.array_to_string(cannot, ', '), pg_catalog.quote_ident(me),
            CASE WHEN v16 THEN ', INHERIT FALSE, SET FALSE' ELSE '' END);
END
$$;
GRANT USAGE ON SCHEMA idempotency TO idempotency_admin, pg_monitor;

CREATE SEQUENCE idempotency.token_seq AS bigint CACHE 1;

-- One row per (scope, key), range-partitioned by created_at so that retention drops whole partitions.
-- Each partition has a UNIQUE index on (key, scope): a new key is inserted with ON CONFLICT DO NOTHING
-- into the one partition that takes new rows (the oldest unsealed one), so concurrent claims of a key
-- meet in that index, as a hand-written keys table's claims do, and no key lock is taken.
CREATE TABLE idempotency.records (
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    status      text NOT NULL,
    token       bigint,
    attempts    integer NOT NULL DEFAULT 1,
    fingerprint text,
    payload     jsonb,
    error       jsonb,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at  timestamptz
) PARTITION BY RANGE (created_at);
COMMENT ON TABLE idempotency.records IS 'Idempotency records, one per (scope, key), range-partitioned by created_at.';

CREATE TABLE idempotency.offsets (
    consumer_group text COLLATE "C" NOT NULL,
    topic          text COLLATE "C" NOT NULL,
    partition      integer NOT NULL CHECK (partition >= 0),
    next_offset    bigint NOT NULL CHECK (next_offset >= 0),
    generation     bigint CHECK (generation >= 0),
    updated_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (consumer_group, topic, partition)
) WITH (fillfactor = 50);
COMMENT ON TABLE idempotency.offsets IS 'Consumer positions: next offset to read per (consumer_group, topic, partition).';

CREATE TABLE idempotency.scope_grants (
    role       regrole NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('scope', 'group')),
    pattern    text COLLATE "C" NOT NULL CHECK (pattern <> ''),
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (role, kind, pattern)
);
GRANT SELECT ON idempotency.scope_grants TO idempotency_admin;
COMMENT ON TABLE idempotency.scope_grants IS
'Which roles may call with which scopes and consumer groups (idem_grant_scope, idem_grant_group). Enforced once a kind has a grant, or always with require_scope_grants.';

-- Sealed partitions: past partitions that take no new row (updates of their rows go on). New rows go to
-- the oldest partition not listed here. Sealing takes the partition's SHARE lock, which waits for the
-- transactions writing there, and moves idempotency.sealed_upto forward before it commits.
CREATE TABLE idempotency.sealed (
    partition      regclass PRIMARY KEY,    -- (regclass: a dump names the partition, a restore finds it again)
    partition_name name NOT NULL,
    range_from     timestamptz NOT NULL,
    range_to       timestamptz NOT NULL,
    sealed_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    filtered_keys  bigint                   -- the keys in its filter (idempotency.sealed_keys); NULL: none yet
);
COMMENT ON TABLE idempotency.sealed IS 'Sealed partitions of idempotency.records: no new rows go there.';

-- The key filters of the sealed partitions (0.9.0): a new key is looked for in all of them at once, with
-- one descent of one index, instead of in each sealed partition's own index. A key's 64-bit hash
-- (idempotency.key_hash) picks its bucket (its top 16 bits) and its print (its low 31 bits); a partition's
-- row of a bucket lists the prints of its keys in that bucket, about 9 for a partition of 600,000 keys. A
-- print found means the key may be there (the call then reads the partitions' indexes); none found means
-- it is not (a sealed partition takes no new rows). Written by idempotency.filter_sealed in the first
-- maintenance round after the seal; until then a sealed partition is read through its index.
-- The prints are in the index too (INCLUDE), so that a call reads a bucket from the index alone (an
-- index-only scan: one descent, no heap page per partition) once the rows are all-visible, which
-- autovacuum makes them soon after they are written (its insert threshold is 1,000 rows here, whatever
-- the table's size). A row holds at most 256 prints (chunk numbers the rows of a bucket and partition
-- beyond that), so that an index entry stays far below the 2,704 bytes a B-tree entry may take, however
-- many keys a partition holds or however a caller chose its keys.
CREATE TABLE idempotency.sealed_keys (
    bucket    integer NOT NULL,
    partition regclass NOT NULL,
    chunk     integer NOT NULL,
    prints    integer[] NOT NULL,
    PRIMARY KEY (bucket, partition, chunk) INCLUDE (prints)
) WITH (autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0);
COMMENT ON TABLE idempotency.sealed_keys IS
'Key filters of the sealed partitions of idempotency.records (written by maintenance): where a new key is looked for first.';

-- The end (range_to, in microseconds since the Unix epoch) of the newest sealed partition. A sequence:
-- its value is seen at once by every transaction, whatever its snapshot, so a writer that waited for a
-- seal's lock learns of the seal even under REPEATABLE READ (see idempotency.write_partition).
CREATE SEQUENCE idempotency.sealed_upto AS bigint MINVALUE 0 START 0 NO CYCLE;
-- (Called once, so that pg_sequence_last_value reads 0 rather than NULL before the first seal.)
SELECT FROM pg_catalog.setval('idempotency.sealed_upto', 0, true);

-- The settings a session must not loosen (see idempotency.config()), one row. The database owner (the
-- edition's owner) changes them with UPDATE idempotency.settings SET ...; a session's SET
-- idempotency.<name> may tighten them (a superuser's may also loosen them).
CREATE TABLE idempotency.settings (
    one                  boolean PRIMARY KEY DEFAULT true CHECK (one),
    max_lease_ttl        interval NOT NULL DEFAULT '1 day',
    max_attempts         integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    max_key_bytes        integer NOT NULL DEFAULT 512 CHECK (max_key_bytes >= 1),
    max_payload_bytes    integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes >= 1),
    max_batch_keys       integer NOT NULL DEFAULT 1000 CHECK (max_batch_keys >= 1),
    require_scope_grants boolean NOT NULL DEFAULT false,
    lease_ttl            interval NOT NULL DEFAULT '5 min',
    partition_interval   interval NOT NULL DEFAULT '1 day' CHECK (partition_interval >= '60 s'),
    premake              integer NOT NULL DEFAULT 4 CHECK (premake >= 1),
    retention            interval NOT NULL DEFAULT '7 days',
    reclaim_after        interval NOT NULL DEFAULT '1 hour',
    drop_lock_timeout    interval NOT NULL DEFAULT '100 ms',
    partition_manager    text NOT NULL DEFAULT 'builtin' CHECK (partition_manager IN ('builtin', 'pg_partman', 'none'))
);
INSERT INTO idempotency.settings DEFAULT VALUES;
GRANT SELECT ON idempotency.settings TO idempotency_admin;
COMMENT ON TABLE idempotency.settings IS
'Settings of the SQL edition (the native extension''s idempotency.* GUCs), one row; change them with UPDATE as the edition''s owner.';

-- The last maintenance rounds (what the native extension keeps in shared memory).
CREATE TABLE idempotency.maintenance_rounds (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    last_round_at   timestamptz,
    last_round_micros bigint,
    rounds          bigint NOT NULL DEFAULT 0,
    failed_rounds   bigint NOT NULL DEFAULT 0,
    last_error      text,
    last_error_at   timestamptz
);
INSERT INTO idempotency.maintenance_rounds DEFAULT VALUES;

-- pg_dump keeps these rows (inside CREATE EXTENSION only: a plain install's tables are dumped anyway).
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.offsets', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.token_seq', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.scope_grants', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.settings', '');
    -- Which partitions are sealed, and how far: without them a restored edition would write new keys into
    -- its oldest partition.
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.sealed', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.sealed_upto', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.sealed_keys', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;

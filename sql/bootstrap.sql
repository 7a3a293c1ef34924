-- Storage for idempotency records. Runs before the generated function definitions.
-- Nothing here is readable or writable by PUBLIC: consumers go through the idem_* functions.

CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

-- The roles the functions are granted to, created when missing (they are cluster-wide: a second database's
-- CREATE EXTENSION finds them). idempotency_consumer: what a consumer needs, nothing more.
-- idempotency_admin: watching and steering (statistics, health, keys in flight and dead letters, redrive,
-- forget, scope grants); it and pg_monitor read the statistics, the health snapshot and the partitions.
-- Consumers get none of that: keys, live fencing tokens and stored errors often hold personal data, and a
-- token lets its reader complete another consumer's lease.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_consumer') THEN
        CREATE ROLE idempotency_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA idempotency TO idempotency_admin, pg_monitor;

-- Fencing tokens: global, so a key's token keeps growing even after its record was reclaimed.
CREATE SEQUENCE idempotency.token_seq AS bigint CACHE 1;

-- One row per (scope, key). Partitioned by time so that retention drops whole partitions.
-- No CHECK constraints: only the extension's own statements write here, and every partition
-- would re-read and compile them for each insert (a quarter of idem_once's CPU, measured).
-- (scope, key) is unique across partitions by the per-key lock every writer takes first;
-- a partitioned table cannot carry that unique index itself.
-- No index on this parent either: each partition gets its own (idempotency.index_partition).
-- A partitioned index would make every restored partition's index collide with the one that
-- ATTACH PARTITION creates, and no restore could run without errors.
CREATE TABLE idempotency.records (
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    status      text NOT NULL,           -- 'pending', 'completed' or 'failed'
    token       bigint,
    attempts    integer NOT NULL DEFAULT 1,
    fingerprint text,
    payload     jsonb,
    error       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz
) PARTITION BY RANGE (created_at);


-- The indexes every partition of the record table carries: (key, scope) for lookups (the key first: a
-- descent then compares one column, where scope, the same for most keys, cost a second comparison at every
-- step), and expires_at for the reclaim sweep of maintenance and idempotency.in_flight, of the rows with a
-- lease only (a settled record, completed or failed, has expires_at NULL and no entry: nothing looks it up
-- by expires_at, and idem_once and completions skip an index insertion). Named after the partition, as PostgreSQL would name them. Called for
-- each partition the extension creates, for pg_partman's template table at the handover, and by a DBA for a
-- partition attached by hand.
CREATE FUNCTION idempotency.index_partition(part regclass) RETURNS void
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

COMMENT ON SCHEMA idempotency IS 'Storage of the idempotency extension; use the idem_* functions, not these tables.';
COMMENT ON TABLE idempotency.records IS 'Idempotency records, one per (scope, key), range-partitioned by created_at.';

-- Broker positions: one row per (consumer_group, topic, partition), updated in the consumer's
-- transaction. Never partitioned and never touched by retention. A low fillfactor leaves room
-- on each page so that the frequent updates of the same rows stay HOT.
CREATE TABLE idempotency.offsets (
    consumer_group text COLLATE "C" NOT NULL,
    topic          text COLLATE "C" NOT NULL,
    partition      integer NOT NULL CHECK (partition >= 0),
    next_offset    bigint NOT NULL CHECK (next_offset >= 0),
    generation     bigint CHECK (generation >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
) WITH (fillfactor = 50);

COMMENT ON TABLE idempotency.offsets IS 'Consumer positions: next offset to read per (consumer_group, topic, partition).';


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

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

-- The SQL edition, 0.8.0 -> 0.9.0 (issue 32: a new key is looked for in the key filters of the sealed
-- partitions, one index for all of them, instead of in each sealed partition's index). Added: the table
-- idempotency.sealed_keys (the filters), the column idempotency.sealed.filtered_keys (NULL until a
-- filter is written), and two fields of the type idempotency.call_state. Nothing stored changes: the
-- filters of the partitions sealed before the upgrade are written by the next maintenance round (about 3 s
-- for 600,000 keys; until then those partitions are read through their indexes, as by 0.8.0). Run by the
-- 0.9.0 plain script over a 0.8.0 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.0
-- idempotency-tle.sql registered this path; in either case one transaction, in the schema of the install.
-- It takes an ACCESS EXCLUSIVE lock on partition_ranges and sealed, so it waits for the transactions that
-- called the edition and they wait for it (it takes a moment).

-- Storage. partition_ranges first, as in 0.7.0 -> 0.8.0: once its lock is held no seal is under way.
LOCK TABLE idempotency.partition_ranges IN ACCESS EXCLUSIVE MODE;
ALTER TABLE idempotency.sealed ADD COLUMN filtered_keys bigint;

CREATE TABLE idempotency.sealed_keys (
    bucket    integer NOT NULL,
    partition regclass NOT NULL,
    chunk     integer NOT NULL,
    prints    integer[] NOT NULL,
    PRIMARY KEY (bucket, partition, chunk) INCLUDE (prints)
) WITH (autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0);
COMMENT ON TABLE idempotency.sealed_keys IS
'Key filters of the sealed partitions of idempotency.records (written by maintenance): where a new key is looked for first.';
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.sealed_keys', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;

ALTER TYPE idempotency.call_state ADD ATTRIBUTE filtered boolean, ADD ATTRIBUTE unfiltered_from timestamptz;

-- Every function that changed or is new in 0.9.0, from the sources.
--@include 15-state.sql: idempotency.live_state idempotency.cached_state idempotency.write_call_cache idempotency.refresh_call_cache idempotency.call_state idempotency.fast_version idempotency.fast_version_native idempotency.check_key_scope
--@include 20-partitions.sql: idempotency.sync_partition_ranges idempotency.drop_partition
--@include 22-sealed-keys.sql
--@include 25-maintenance.sql
--@include 30-keys.sql
--@include 33-settle.sql
--@include 35-once.sql
--@include 40-batch.sql: idem_claim_batch idem_once_batch idem_complete_batch
--@include 90-finalize.sql

-- The state of this database with the new fields, now rather than at the next maintenance round.
SELECT FROM idempotency.write_call_cache();

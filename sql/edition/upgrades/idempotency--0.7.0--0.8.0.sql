-- The SQL edition, 0.7.0 -> 0.8.0 (issue 32: the key calls read the state they need, the limits, whether
-- scope grants are enforced, the write partition and which partitions to look in, as the constants of
-- idempotency.cached_state, which statement triggers write again when its tables change). What is stored
-- does not change; added: partition_ranges.known_empty (false until a maintenance round finds a partition
-- ahead of the write partition empty), the type idempotency.call_state, the triggers call_cache, and
-- idempotency.sealed_upto made "called" (so pg_sequence_last_value reads its value, 0 before the first
-- seal, rather than NULL). Run by the 0.8.0 plain script over a 0.7.0 install, or by ALTER EXTENSION
-- idempotency UPDATE after the 0.8.0 idempotency-tle.sql registered this path; in either case one
-- transaction, in the schema of the install. It takes an ACCESS EXCLUSIVE lock on partition_ranges, so it
-- waits for the transactions that called the edition and they wait for it (no partition is rebuilt: it
-- takes a moment).

-- Storage. partition_ranges first: every seal, claim and maintenance round reads it, so once its lock is
-- held no seal is under way or starts before this commits, and sealed_upto is set again to its own value
-- without a seal moving it in between (setval is not undone by a rollback; the value is kept, so that does
-- not matter).
ALTER TABLE idempotency.partition_ranges ADD COLUMN known_empty boolean NOT NULL DEFAULT false;
SELECT pg_catalog.setval('idempotency.sealed_upto', q.last_value, true) FROM idempotency.sealed_upto q;

CREATE TYPE idempotency.call_state AS (
    max_lease_ttl     interval,
    max_attempts      integer,
    max_key_bytes     integer,
    max_payload_bytes integer,
    max_batch_keys    integer,
    lease_ttl         interval,
    grants_enforced   boolean,
    upto              bigint,
    w_from            timestamptz,
    w_to              timestamptz,
    w_to_us           bigint,
    probe_before      boolean,
    probe_ahead       boolean,
    stale_seal        boolean,
    w_at_seal         boolean,
    lease_ttl_ok      boolean,
    max_payload_bytes_4 integer,
    native_defaults_ok boolean,
    w_name text
);

-- The functions 0.8.0 no longer has, or has with other arguments.
DROP FUNCTION idempotency.check_seals_visible(text, text);
DROP FUNCTION idempotency.remembered_claim();
DROP FUNCTION idempotency.remember_claim(oid, tid);
DROP FUNCTION idempotency.check_ttl(interval, idempotency.settings);
DROP FUNCTION idempotency.claim_one(text, text, interval, text, boolean, integer, timestamptz, timestamptz);
DROP FUNCTION idempotency.once_one(text, text, timestamptz, timestamptz);

-- Every function and view of 0.8.0, from the sources in the manifest's order (scripts/sql-edition writes
-- them in, each made CREATE OR REPLACE; the files that also make storage by the names of their functions).
--@include 10-common.sql
--@include 15-state.sql: idempotency.live_state idempotency.cached_state idempotency.write_call_cache idempotency.refresh_call_cache idempotency.call_state idempotency.fast_version idempotency.check_key_scope
--@include 20-partitions.sql: idempotency.partitions idempotency.index_partition idempotency.ts_literal idempotency.sync_partition_ranges idempotency.premake_partitions idempotency.sealed_until idempotency.write_partition idempotency.seal_partition_within idempotency.seal_partition idempotency.drop_partition
--@include 25-maintenance.sql
--@include 30-keys.sql
--@include 35-once.sql
--@include 40-batch.sql: idempotency.too_many_keys idempotency.check_keys idem_claim_batch idem_complete_batch idem_once_batch
--@include 45-canonical.sql
--@include 50-derive.sql
--@include 60-offsets.sql
--@include 70-admin.sql
--@include ../grants.sql: idempotency.grant_pattern idem_grant_scope idem_revoke_scope idem_grant_group idem_revoke_group
--@include 80-observe.sql
--@include ../observe.sql: idempotency.stats idem_stats idempotency.in_flight idempotency.dead_letters
--@include ../surface/*.sql
--@include 90-finalize.sql

-- The triggers that keep idempotency.cached_state in step with its tables (15-state.sql, 20-partitions.sql).
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.settings
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scope_grants
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.sealed
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.partition_ranges
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();

-- The partitions ahead that hold no row, and the state of this database, now rather than at the next
-- maintenance round.
SELECT FROM idempotency.mark_empty_ahead();
SELECT FROM idempotency.write_call_cache();

-- The SQL edition, 0.9.4 -> 0.9.5 (issue 32: a key looked for in the key filters of the sealed partitions reads
-- one row, not one per partition). idempotency.sealed_keys gets the merged filter: for each bucket, the prints
-- of every filtered sealed partition in rows of partition 0 (idempotency.merge_sealed_keys), written again
-- whenever a partition's filter is written or forgotten, in the same transaction; idempotency.sealed_key_matches
-- reads those rows only. idempotency.call_state sends the batches key by key under REPEATABLE READ and
-- SERIALIZABLE when the snapshot does not see the merged filter (taken before this upgrade). The merged filter
-- is written at the end, from the partitions' filters, in this transaction: whoever sees the new functions sees
-- their rows. Run by the 0.9.5 plain script over a 0.9.4 install, or by ALTER EXTENSION idempotency UPDATE after
-- the 0.9.5 idempotency-tle.sql registered this path; in either case one transaction, in the schema of the install.

-- Every function that changed in 0.9.5, from the sources (forget_sealed_keys is PL/pgSQL now).
--@include 22-sealed-keys.sql: idempotency.sealed_key_matches idempotency.merge_sealed_keys idempotency.filter_sealed idempotency.forget_sealed_keys
--@include 15-state.sql: idempotency.call_state
-- (Under READ COMMITTED only: the merge must read what a round committed while this waited for it.)
DO $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'idempotency: the upgrade to 0.9.5 runs under READ COMMITTED, not %',
                        pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '25001', HINT = 'Run it in a session whose default_transaction_isolation is read committed.';
    END IF;
END
$$;
-- (After a maintenance round under way: one still running 0.9.4's filter_sealed would write a partition's filter
-- without merging it. Rounds try this lock and skip a round when it is taken.)
SELECT FROM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.maintenance')::bigint);
SELECT FROM idempotency.merge_sealed_keys();
--@include 90-finalize.sql

-- The SQL edition, 0.9.4 -> 0.9.5 (issue 32: the common paths' first test where the native library is loaded in
-- the cluster). Nothing stored changes. A native library of 0.9.5 or later has one read-only setting,
-- idempotency.edition_common_path: under READ COMMITTED, read-write, which groups of the idempotency.* limits the
-- calls read are at its defaults ('keys', then ',lease', ',payload', ',batch'), else 'off'.
-- idempotency.fast_version reads it (four function calls, through idempotency.common_path_says) in place of the
-- concatenation of seven settings (eleven), and idempotency.batch_args_fast reads its ',batch'. Whether the
-- library has it is part of the state: idempotency.call_state gets an attribute, common_path_guc, which
-- idempotency.live_state computes and idempotency.write_call_cache writes; an older library keeps 0.9.4's test.
-- The state is written again at the end; until then no call runs in this transaction. Run by the 0.9.5 plain
-- script over a 0.9.4 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.5 idempotency-tle.sql
-- registered this path; in either case one transaction, in the schema of the install.

ALTER TYPE idempotency.call_state ADD ATTRIBUTE common_path_guc boolean;

-- Every function that changed in 0.9.5, from the sources.
--@include 15-state.sql: idempotency.live_state idempotency.write_call_cache idempotency.common_path_says idempotency.fast_version
--@include 40-batch.sql: idempotency.batch_args_fast
SELECT FROM idempotency.write_call_cache();
--@include 90-finalize.sql

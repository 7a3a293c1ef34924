-- The SQL edition, 0.9.3 -> 0.9.4 (issue 32: the common paths where the native library is loaded in the
-- cluster, and in sessions that ran them before a change of the state). Nothing stored changes.
-- idempotency.fast_version takes the idempotency.* limits as unset or, where the native library is loaded, at
-- its defaults, in one test (before, that case went through a second test, idempotency.fast_version_native),
-- and idempotency.batch_args_fast takes the library's default of max_batch_keys the same way (before, the
-- batches took the long way there). fast_version, fast_state, batch_args_fast and bad_keys take the state
-- from their callers, which name idempotency.cached_state() in their own expressions, so that replacing it
-- invalidates the callers' plans (read inside the helpers, its constants stayed in a session's cached plans).
-- A limit a session set to '' no longer lifts a value ALTER ROLE or ALTER DATABASE gave it (config, call_state,
-- limit_in_force, limit_value), nor does SET ROLE lift the login role's (configured_values), and the native
-- library's default texts count as changing nothing only where the library is loaded, in the state's writer
-- and in the caller's session (live_state's native_defaults_ok, fast_version, batch_args_fast; the state is
-- written again at the end).
-- The common paths read one state from their first guard to their write: idempotency.call_state gets a
-- generation (gen), which idempotency.write_call_cache gives each state it writes, and idem_claim, idem_once
-- and idem_once_batch compare the generation their write planned with against the one read first (before,
-- they compared sealed_upto's version only, which a maintenance round writing a key filter does not move:
-- a key held by a sealed partition could be answered as new). The state is written again at the end; until
-- then no call runs in this transaction.
-- The helpers have new arguments: the new ones are made, the calls replaced, then the old ones dropped. Run
-- by the 0.9.4 plain script over a 0.9.3 install, or by ALTER EXTENSION idempotency UPDATE after the 0.9.4
-- idempotency-tle.sql registered this path; in either case one transaction, in the schema of the install.

ALTER TYPE idempotency.call_state ADD ATTRIBUTE gen bigint;

-- Every function that changed in 0.9.4, from the sources.
--@include 10-common.sql: idempotency.session_value idempotency.configured_values idempotency.limit_in_force idempotency.limit_value idempotency.config
--@include 15-state.sql: idempotency.live_state idempotency.write_call_cache idempotency.call_state idempotency.fast_state idempotency.fast_version
--@include 40-batch.sql: idempotency.batch_args_fast idempotency.bad_keys idem_claim_batch idem_once_batch
--@include 30-keys.sql: idem_claim
--@include 33-settle.sql: idem_complete
--@include 35-once.sql: idem_once
--@include 42-complete-batch.sql: idem_complete_batch
DROP FUNCTION idempotency.fast_version_native(boolean, boolean, boolean);
DROP FUNCTION idempotency.fast_version(boolean, boolean, boolean);
DROP FUNCTION idempotency.fast_state(boolean);
DROP FUNCTION idempotency.batch_args_fast(text[], text);
DROP FUNCTION idempotency.bad_keys(text[]);
SELECT FROM idempotency.write_call_cache();
--@include 90-finalize.sql

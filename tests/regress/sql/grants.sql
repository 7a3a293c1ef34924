-- Scope and consumer-group grants: the functions' contract, their SQLSTATEs, who may call them, and
-- enforcement once a grant exists (the attacker's view is tests/hostile/test_hostile.py).
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
SELECT FROM idem_maintenance();
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.proname IN ('idem_grant_scope', 'idem_revoke_scope', 'idem_grant_group', 'idem_revoke_group')
ORDER BY p.proname;
CREATE ROLE gr_a IN ROLE idempotency_consumer;
CREATE ROLE gr_b IN ROLE idempotency_consumer;
CREATE ROLE gr_admin IN ROLE idempotency_admin;
-- No grant: every consumer uses every scope and group.
SET ROLE gr_b;
SELECT idem_once('k0', scope => 'a/orders') AS open_before_grants;
RESET ROLE;
-- Bad input: NULLs and an empty pattern, nothing written.
SELECT idem_grant_scope(NULL, 'a/*');
SELECT idem_grant_scope('gr_a', NULL);
SELECT idem_grant_scope('gr_a', '');
SELECT idem_grant_group('gr_a', '');
SELECT idem_grant_scope('no_such_role', 'a/*');
SELECT count(*) AS grants FROM idempotency.scope_grants;
-- Consumers cannot grant; idempotency_admin can.
SET ROLE gr_b;
SELECT idem_grant_scope('gr_b', '*');
SELECT * FROM idempotency.scope_grants;
RESET ROLE;
SET ROLE gr_admin;
SELECT idem_grant_scope('gr_a', 'a/*') AS granted;
SELECT idem_grant_scope('gr_a', 'a/*') AS granted_again;
SELECT idem_grant_scope('gr_b', 'b') AS granted;
SELECT idem_grant_group('gr_a', 'group-a') AS granted;
SELECT role, kind, pattern FROM idempotency.scope_grants ORDER BY role::text, kind, pattern;
RESET ROLE;
-- Enforced: a prefix, a whole name, groups; superusers pass.
SET ROLE gr_a;
SELECT idem_once('k1', scope => 'a/orders') AS a_in_prefix;
SELECT idem_once('k1', scope => 'b');
SELECT idem_record_offset('group-a', 't', 0, 1) AS own_group;
RESET ROLE;
SET ROLE gr_b;
SELECT idem_once('k1', scope => 'b') AS b_whole_name;
SELECT idem_once('k1', scope => 'b/x');
SELECT * FROM idem_status('k1', scope => 'a/orders');
SELECT * FROM idem_claim_batch(ARRAY['x'], scope => 'a/orders');
SELECT idem_next_offset('group-a', 't', 0);
SELECT idem_record_offset('group-b', 't', 0, 1);
-- Bad arguments are refused for what they are (22004, 22023) before the scope's grant is looked at.
SELECT idem_complete(NULL, '1', scope => 'a/orders');
SELECT idem_complete(E'k\n', '1', scope => 'a/orders');
SELECT idem_complete('k1', '1', scope => NULL, token => 1);
SELECT idem_complete('k1', '1', scope => E'b\n');
RESET ROLE;
SELECT idem_once('k2', scope => 'anything') AS superuser_passes;
-- Revoked: the kind is off again once no grant of it is left.
SET ROLE gr_admin;
SELECT idem_revoke_scope('gr_a', 'a/*') AS revoked;
SELECT idem_revoke_scope('gr_a', 'a/*') AS revoked_again;
SELECT idem_revoke_scope('gr_b', 'b') AS revoked;
RESET ROLE;
SET ROLE gr_b;
SELECT idem_once('k3', scope => 'a/orders') AS open_again;
SELECT idem_next_offset('group-a', 't', 0);
RESET ROLE;
-- With grants required (a consumer cannot require them: native_settings), a consumer without a grant is refused.
SET idempotency.require_scope_grants = on;
SET ROLE gr_b;
SELECT idem_once('k4', scope => 'a/orders');
RESET ROLE;
RESET idempotency.require_scope_grants;
DROP ROLE gr_a, gr_b, gr_admin;

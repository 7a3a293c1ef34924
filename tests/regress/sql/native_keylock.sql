-- The per-key lock is part of the on-disk contract: two builds running side by side (an upgrade)
-- must take the same lock for the same key. Its identity is hashtextextended(scope || E'\x1f' || key,
-- 18756) split into classid (high 32 bits) and objid (low 32 bits) of an advisory lock with
-- objsubid 18756. These values are pinned here forever.
CREATE EXTENSION idempotency;
SELECT FROM idem_maintenance();
CREATE TABLE pinned (scope text, key text);
INSERT INTO pinned VALUES ('default', 'order-1'), ('payments', 'k'), ('ü', '日本'), ('a', 'bc'), ('ab', 'c');
BEGIN;
SELECT p.scope, p.key, c.outcome FROM pinned p, idem_claim(p.key, scope => p.scope) c ORDER BY 1, 2;
-- The locks this transaction holds, as pg_locks shows them.
SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid() ORDER BY 1, 2;
-- The same values computed in SQL, key by key.
SELECT p.scope, p.key, h >> 32 & 4294967295 AS classid, h & 4294967295 AS objid,
       EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 18756
                 AND l.pid = pg_backend_pid()
                 AND l.classid::bigint = h >> 32 & 4294967295 AND l.objid::bigint = h & 4294967295) AS held
  FROM pinned p, hashtextextended((p.scope || E'\x1f' || p.key) COLLATE "C", 18756) h ORDER BY 1, 2;
ROLLBACK;
-- Scope, separator and key are hashed from a buffer on the stack up to 256 bytes, from the heap past that:
-- 'default' with keys of 247 to 249 bytes falls on either side, and 400 bytes far past it. Each key's lock
-- is the one SQL computes.
CREATE TABLE pinned_long AS SELECT 'default' AS scope, repeat('k', n) AS key FROM unnest(ARRAY[247, 248, 249, 400]) n;
BEGIN;
SELECT count(*) AS claimed FROM pinned_long p, idem_claim(p.key, scope => p.scope) c WHERE c.outcome = 'claimed';
SELECT length(p.scope || E'\x1f' || p.key) AS hashed_bytes,
       EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 18756
                 AND l.pid = pg_backend_pid()
                 AND l.classid::bigint = h >> 32 & 4294967295 AND l.objid::bigint = h & 4294967295) AS held
  FROM pinned_long p, hashtextextended((p.scope || E'\x1f' || p.key) COLLATE "C", 18756) h ORDER BY 1;
ROLLBACK;
-- idem_once and the batches take the same lock.
BEGIN;
SELECT idem_once('order-1');
SELECT count(*) FROM idem_once_batch(ARRAY['k'], scope => 'payments');
SELECT classid::bigint, objid::bigint FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid() ORDER BY 1, 2;
ROLLBACK;

-- Offsets: idem_record_offset / idem_next_offset / idem_offsets / idem_reset_offset.
\set VERBOSITY sqlstate
CREATE EXTENSION idempotency;
-- A digest of every stored position (superuser view), to prove that nothing was written.
CREATE FUNCTION offsets_digest() RETURNS text LANGUAGE sql AS $$
  SELECT count(*) || ':' || md5(coalesce(string_agg(x, '|' ORDER BY x), ''))
  FROM (SELECT o.ctid::text || o.xmin::text || row_to_json(o)::text AS x
        FROM idempotency.offsets o) s
$$;
SELECT clock_timestamp() AS t0 \gset

-- Exact argument lists and results of the offsets contract.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments
FROM pg_proc p
WHERE p.proname IN ('idem_record_offset', 'idem_next_offset', 'idem_offsets', 'idem_reset_offset')
ORDER BY p.proname;
SELECT p.proname, pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.proname IN ('idem_record_offset', 'idem_next_offset', 'idem_offsets', 'idem_reset_offset')
ORDER BY p.proname;

-----------------------------------------------------------------------------
-- A high-water mark: true when the stored position advanced, false for a redelivery.
-----------------------------------------------------------------------------
-- Nothing stored yet.
SELECT idem_next_offset('billing', 'payments', 0) IS NULL AS nothing_stored;
SELECT count(*) AS rows FROM idem_offsets('billing');
SELECT idem_record_offset('billing', 'payments', 0, 41) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- The same offset again, and lower ones: false, and the position stays.
SELECT idem_record_offset('billing', 'payments', 0, 41) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 40) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 0) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- Higher ones advance it, gaps included.
SELECT idem_record_offset('billing', 'payments', 0, 42) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
SELECT idem_record_offset('billing', 'payments', 0, 100) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 99) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- Offset 0 is a valid first offset.
SELECT idem_record_offset('billing', 'payments', 1, 0) AS advanced;
SELECT idem_next_offset('billing', 'payments', 1) AS next_offset;
SELECT idem_record_offset('billing', 'payments', 1, 0) AS advanced;
-- Several calls in one transaction: each sees the previous one.
BEGIN;
SELECT idem_record_offset('billing', 'payments', 2, 10) AS advanced;
SELECT idem_record_offset('billing', 'payments', 2, 10) AS advanced;
SELECT idem_record_offset('billing', 'payments', 2, 11) AS advanced;
SELECT idem_next_offset('billing', 'payments', 2) AS next_offset;
COMMIT;
SELECT idem_next_offset('billing', 'payments', 2) AS next_offset;
-- Positions are per (group, topic, partition).
SELECT idem_next_offset('billing', 'payments', 3) IS NULL AS other_partition_empty;
SELECT idem_next_offset('billing', 'refunds', 0) IS NULL AS other_topic_empty;
SELECT idem_next_offset('shipping', 'payments', 0) IS NULL AS other_group_empty;
SELECT idem_record_offset('shipping', 'payments', 0, 5) AS advanced;
SELECT idem_next_offset('shipping', 'payments', 0) AS shipping_next,
       idem_next_offset('billing', 'payments', 0) AS billing_next;

-----------------------------------------------------------------------------
-- idem_offsets: the group's positions, by topic and partition; optionally one topic.
-----------------------------------------------------------------------------
SELECT idem_record_offset('billing', 'refunds', 10, 7) AS advanced;
SELECT idem_record_offset('billing', 'refunds', 2, 70) AS advanced;
SELECT idem_record_offset('billing', 'audit', 0, 1) AS advanced;
SELECT idem_record_offset('billing', 'payments', 10, 3) AS advanced;
SELECT topic, partition, next_offset, generation,
       updated_at BETWEEN :'t0'::timestamptz AND clock_timestamp() AS updated_recently
FROM idem_offsets('billing');
SELECT topic, partition, next_offset FROM idem_offsets('billing', 'refunds');
SELECT topic, partition, next_offset FROM idem_offsets('billing', topic => 'payments');
SELECT topic, partition, next_offset FROM idem_offsets('billing', NULL);
SELECT topic, partition, next_offset FROM idem_offsets('shipping');
SELECT count(*) AS rows FROM idem_offsets('billing', 'no-such-topic');
SELECT count(*) AS rows FROM idem_offsets('no-such-group');
-- next_offset matches idem_next_offset for every row.
SELECT bool_and(o.next_offset = idem_next_offset('billing', o.topic, o.partition)) AS consistent
FROM idem_offsets('billing') o;
-- updated_at moves when the position advances.
SELECT updated_at AS u0 FROM idem_offsets('billing', 'audit') \gset
SELECT pg_sleep(0.01);
SELECT idem_record_offset('billing', 'audit', 0, 2) AS advanced;
SELECT updated_at > :'u0'::timestamptz AS updated FROM idem_offsets('billing', 'audit');

-----------------------------------------------------------------------------
-- Generation fencing: a higher generation is stored, a lower one raises 55006
-- and changes nothing.
-----------------------------------------------------------------------------
SELECT idem_record_offset('fence', 'orders', 0, 10, generation => 5) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence');
SELECT offsets_digest() AS d0 \gset
-- A zombie of generation 4: refused, whether or not its offset would advance.
SELECT idem_record_offset('fence', 'orders', 0, 11, generation => 4);
SELECT idem_record_offset('fence', 'orders', 0, 10, generation => 4);
SELECT idem_record_offset('fence', 'orders', 0, 3, generation => 0);
SELECT offsets_digest() = :'d0' AS nothing_written;
SELECT next_offset, generation FROM idem_offsets('fence');
-- The same generation goes on as usual.
SELECT idem_record_offset('fence', 'orders', 0, 11, generation => 5) AS advanced;
SELECT idem_record_offset('fence', 'orders', 0, 11, generation => 5) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence');
-- A higher generation is stored even when the offset does not advance.
SELECT idem_record_offset('fence', 'orders', 0, 11, generation => 6) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence');
SELECT idem_record_offset('fence', 'orders', 0, 2, generation => 7) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence');
-- ... and from then on the previous generation is a zombie too.
SELECT offsets_digest() AS d0 \gset
SELECT idem_record_offset('fence', 'orders', 0, 50, generation => 6);
SELECT idem_record_offset('fence', 'orders', 0, 50, generation => 5);
SELECT offsets_digest() = :'d0' AS nothing_written;
SELECT next_offset, generation FROM idem_offsets('fence');
-- A higher generation that advances the offset.
SELECT idem_record_offset('fence', 'orders', 0, 50, generation => 100) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence');
-- Generations are per partition: partition 1 of the same topic is not fenced by partition 0.
SELECT idem_record_offset('fence', 'orders', 1, 0, generation => 1) AS advanced;
SELECT partition, next_offset, generation FROM idem_offsets('fence', 'orders');
-- A position first recorded without a generation takes one later; generation 0 is valid.
SELECT idem_record_offset('fence', 'nogen', 0, 1) AS advanced;
SELECT next_offset, generation IS NULL AS no_generation FROM idem_offsets('fence', 'nogen');
SELECT idem_record_offset('fence', 'nogen', 0, 1, generation => 0) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence', 'nogen');
SELECT idem_record_offset('fence', 'nogen', 0, 2, generation => 3) AS advanced;
SELECT next_offset, generation FROM idem_offsets('fence', 'nogen');
SELECT idem_record_offset('fence', 'nogen', 0, 3, generation => 2);
SELECT next_offset, generation FROM idem_offsets('fence', 'nogen');
-- A fenced call inside a transaction aborts it: the earlier writes are gone too.
BEGIN;
SELECT idem_record_offset('fence', 'orders', 1, 5, generation => 1) AS advanced;
SELECT idem_record_offset('fence', 'orders', 0, 60, generation => 99);
COMMIT;
SELECT partition, next_offset, generation FROM idem_offsets('fence', 'orders');

-----------------------------------------------------------------------------
-- idem_reset_offset: the DBA's move, backwards or forwards.
-----------------------------------------------------------------------------
SELECT idem_next_offset('billing', 'payments', 0) AS before_reset;
-- Backwards: the messages from 50 on will be processed again.
SELECT idem_reset_offset('billing', 'payments', 0, 50);
SELECT idem_next_offset('billing', 'payments', 0) AS after_reset;
SELECT idem_record_offset('billing', 'payments', 0, 49) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 50) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- Forwards: skip up to 1000.
SELECT idem_reset_offset('billing', 'payments', 0, 1000);
SELECT idem_next_offset('billing', 'payments', 0) AS after_reset;
SELECT idem_record_offset('billing', 'payments', 0, 500) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 999) AS advanced;
SELECT idem_record_offset('billing', 'payments', 0, 1000) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- Back to 0: the whole partition again.
SELECT idem_reset_offset('billing', 'payments', 0, 0);
SELECT idem_next_offset('billing', 'payments', 0) AS after_reset;
SELECT idem_record_offset('billing', 'payments', 0, 0) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;
-- A reset moves a fenced position too; fencing still applies afterwards.
SELECT idem_reset_offset('fence', 'orders', 0, 5);
SELECT next_offset FROM idem_offsets('fence', 'orders') WHERE partition = 0;
SELECT idem_record_offset('fence', 'orders', 0, 5, generation => 100) AS advanced;
SELECT idem_record_offset('fence', 'orders', 0, 6, generation => 99);
SELECT next_offset FROM idem_offsets('fence', 'orders') WHERE partition = 0;

-----------------------------------------------------------------------------
-- Rollback leaves the stored offset unchanged.
-----------------------------------------------------------------------------
SELECT offsets_digest() AS d0 \gset
SELECT idem_next_offset('billing', 'payments', 0) AS before_rollback;
BEGIN;
SELECT idem_record_offset('billing', 'payments', 0, 2000) AS advanced;
SELECT idem_next_offset('billing', 'payments', 0) AS inside;
SELECT idem_record_offset('billing', 'new-topic', 0, 1) AS advanced;
SELECT idem_record_offset('fence', 'orders', 0, 2000, generation => 200) AS advanced;
SELECT idem_reset_offset('billing', 'refunds', 2, 0);
ROLLBACK;
SELECT offsets_digest() = :'d0' AS nothing_written;
SELECT idem_next_offset('billing', 'payments', 0) AS after_rollback;
SELECT idem_next_offset('billing', 'new-topic', 0) IS NULL AS nothing_stored;
SELECT next_offset, generation FROM idem_offsets('fence', 'orders') WHERE partition = 0;
SELECT next_offset FROM idem_offsets('billing', 'refunds') WHERE partition = 2;
-- A rolled back savepoint inside a committed transaction.
BEGIN;
SAVEPOINT s;
SELECT idem_record_offset('billing', 'payments', 0, 3000) AS advanced;
ROLLBACK TO SAVEPOINT s;
SELECT idem_record_offset('billing', 'payments', 0, 2) AS advanced;
COMMIT;
SELECT idem_next_offset('billing', 'payments', 0) AS next_offset;

-----------------------------------------------------------------------------
-- Bad input: nothing is written.
-----------------------------------------------------------------------------
SELECT offsets_digest() AS d0 \gset
-- 22004: NULL group, topic, partition or offset.
SELECT idem_record_offset(NULL, 'payments', 0, 1);
SELECT idem_record_offset('billing', NULL, 0, 1);
SELECT idem_record_offset('billing', 'payments', NULL, 1);
SELECT idem_record_offset('billing', 'payments', 0, NULL);
SELECT idem_record_offset('billing', 'payments', 0, NULL, generation => 1);
SELECT idem_next_offset(NULL, 'payments', 0);
SELECT idem_next_offset('billing', NULL, 0);
SELECT idem_next_offset('billing', 'payments', NULL);
SELECT * FROM idem_offsets(NULL);
SELECT * FROM idem_offsets(NULL, 'payments');
SELECT idem_reset_offset(NULL, 'payments', 0, 1);
SELECT idem_reset_offset('billing', NULL, 0, 1);
SELECT idem_reset_offset('billing', 'payments', NULL, 1);
SELECT idem_reset_offset('billing', 'payments', 0, NULL);
SELECT offsets_digest() = :'d0' AS nothing_written;
-- 22023: empty group or topic, control characters.
SELECT idem_record_offset('', 'payments', 0, 1);
SELECT idem_record_offset('billing', '', 0, 1);
SELECT idem_record_offset(E'bill\ning', 'payments', 0, 1);
SELECT idem_record_offset('billing', E'pay\tments', 0, 1);
SELECT idem_next_offset('', 'payments', 0);
SELECT idem_next_offset('billing', '', 0);
SELECT * FROM idem_offsets('');
SELECT * FROM idem_offsets('billing', '');
SELECT idem_reset_offset('', 'payments', 0, 1);
SELECT idem_reset_offset('billing', '', 0, 1);
-- 22023: negative partition, offset or generation.
SELECT idem_record_offset('billing', 'payments', -1, 1);
SELECT idem_record_offset('billing', 'payments', 0, -1);
SELECT idem_record_offset('billing', 'payments', 0, -9223372036854775808);
SELECT idem_record_offset('billing', 'payments', 0, 5000, generation => -1);
SELECT idem_record_offset('fence', 'orders', 0, 5000, generation => -1);
SELECT idem_next_offset('billing', 'payments', -1);
SELECT idem_reset_offset('billing', 'payments', -1, 1);
SELECT idem_reset_offset('billing', 'payments', 0, -1);
-- 22003: the largest bigint as processed_offset (its successor cannot be stored).
SELECT idem_record_offset('billing', 'payments', 0, 9223372036854775807);
SELECT idem_record_offset('billing', 'max-topic', 0, 9223372036854775807);
-- 54000: group or topic over idempotency.max_key_bytes (512).
SELECT idem_record_offset(repeat('g', 513), 'payments', 0, 1);
SELECT idem_record_offset('billing', repeat('t', 513), 0, 1);
SELECT idem_record_offset('billing', repeat('é', 257), 0, 1);
SELECT idem_next_offset(repeat('g', 513), 'payments', 0);
SELECT * FROM idem_offsets(repeat('g', 513));
SELECT * FROM idem_offsets('billing', repeat('t', 513));
SELECT idem_reset_offset('billing', repeat('t', 513), 0, 1);
SELECT offsets_digest() = :'d0' AS nothing_written;
SELECT idem_next_offset('billing', 'payments', 0) AS unchanged;
SELECT idem_next_offset('billing', 'max-topic', 0) IS NULL AS nothing_stored;
-- At the limits it works.
SELECT idem_record_offset('billing', 'max-topic', 0, 9223372036854775806) AS advanced;
SELECT idem_next_offset('billing', 'max-topic', 0) AS next_offset;
SELECT idem_record_offset('billing', 'max-topic', 2147483647, 0, generation => 9223372036854775807) AS advanced;
SELECT partition, next_offset, generation FROM idem_offsets('billing', 'max-topic');
SELECT idem_record_offset(repeat('g', 512), repeat('t', 512), 0, 1) AS advanced;
SELECT idem_next_offset(repeat('g', 512), repeat('t', 512), 0) AS next_offset;
SELECT count(*) AS rows FROM idem_offsets(repeat('g', 512), repeat('t', 512));
-- Non-ASCII printable names are fine.
SELECT idem_record_offset('grüppe', 'тема', 0, 1) AS advanced;
SELECT topic, next_offset FROM idem_offsets('grüppe');

-----------------------------------------------------------------------------
-- Privileges: idempotency_consumer may record and read offsets but not reset them.
-----------------------------------------------------------------------------
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_offsets_plain;
RESET client_min_messages;
CREATE ROLE idem_offsets_plain;
SET ROLE idem_offsets_plain;
SELECT idem_record_offset('priv', 'payments', 0, 1);
SELECT idem_next_offset('priv', 'payments', 0);
SELECT * FROM idem_offsets('priv');
SELECT idem_reset_offset('priv', 'payments', 0, 0);
RESET ROLE;
GRANT idempotency_consumer TO idem_offsets_plain;
SET ROLE idem_offsets_plain;
SELECT idem_record_offset('priv', 'payments', 0, 1) AS advanced;
SELECT idem_record_offset('priv', 'payments', 0, 1) AS advanced;
SELECT idem_record_offset('priv', 'payments', 0, 2, generation => 3) AS advanced;
SELECT idem_record_offset('priv', 'payments', 0, 3, generation => 2);
SELECT idem_next_offset('priv', 'payments', 0) AS next_offset;
SELECT topic, partition, next_offset, generation FROM idem_offsets('priv');
-- The DBA's functions and the storage stay out of reach.
SELECT idem_reset_offset('priv', 'payments', 0, 0);
SELECT count(*) FROM idempotency.offsets;
UPDATE idempotency.offsets SET next_offset = 0;
RESET ROLE;
SELECT idem_next_offset('priv', 'payments', 0) AS unchanged;
SELECT idem_reset_offset('priv', 'payments', 0, 0);
SELECT idem_next_offset('priv', 'payments', 0) AS reset_by_owner;
DROP ROLE idem_offsets_plain;

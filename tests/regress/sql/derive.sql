-- idem_key and idem_fingerprint: the values every client library must compute too (clients/vectors.json).
-- These are pinned forever: a changed value would change every key ever derived.
CREATE EXTENSION idempotency;
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'orders', '42') = 'efe23554-59ac-5934-81b6-13e4d4b9654e' AS pinned;
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'a;b') = '68df55cf-2243-5e4a-8092-d00ed513fd44' AS pinned;
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'a', 'b') = '4b99c538-01c6-5da6-aa21-7551ef1386cf' AS pinned;
SELECT idem_key('00000000-0000-0000-0000-000000000000', 'é', '日本', '') = '331ea8d9-12a3-5d09-a8d8-3e8100b04362' AS pinned;
SELECT idem_key('a3bb189e-8bf9-3888-9912-ace4e6543002', '3:x;', ':;:;') = '97804051-bece-5acf-b3ab-3a73b26c84f0' AS pinned;
SELECT idem_key('a3bb189e-8bf9-3888-9912-ace4e6543002', 'payment', 'tenant-7', '2026-11-23T00:00:00Z') = 'e698a4c4-cf9b-5923-8919-73c49ed3fc8c' AS pinned;
SELECT idem_fingerprint('{"b": 1, "a": [1.0, 2, {"y": true, "x": null}]}') = '4785963269aa35aa8ceaf368e669a946f8f9772012fc1f01339d8ebdc4025f31' AS pinned;
SELECT idem_fingerprint('{"amount": 10.5, "currency": "EUR", "meta": {"z": "ü", "a": " "}}', '/amount', '/currency') = 'bb6b6f2c3fbec41beb35582e7bae97a9cc7c54c09d8c7b6e344de217cdbbc7a1' AS pinned;
SELECT idem_fingerprint('{"n": [1e+21, 0.1, -0.0, 123456789012, 1.5e-07]}') = '32bfe0a9d27cc244d752d7a9d95363a1b6b8fe28d128ec0ead316bd3bbb1fdb8' AS pinned;
SELECT idem_fingerprint('{"a/b": {"~c": 5}, "x": [10, 20]}', '/a~1b/~0c', '/x/1', '/missing', '') = '1b61806ca9e8bfb33c1cdd300ea9438259c3b3bc1c0d988be4d1b9c471428139' AS pinned;
SELECT idem_fingerprint('{"s": "line\nbreak \"q\" \\ \u0001"}') = '2e17dca30d52c350721b3f80b414a72fc073f043658cbb9ba80539d1e202cd77' AS pinned;
-- Key order, whitespace and number spelling do not change a fingerprint; values do.
SELECT idem_fingerprint('{"a": 1, "b": [1.0, 2e0]}') = idem_fingerprint('{"b":[1,2],"a":1.00}') AS same;
SELECT idem_fingerprint('{"a": 1}') = idem_fingerprint('{"a": 2}') AS same;
-- Only the chosen paths count.
SELECT idem_fingerprint('{"amount": 5, "trace": "x"}', '/amount') = idem_fingerprint('{"amount": 5, "trace": "y"}', '/amount') AS same;
-- An array of parts works as VARIADIC.
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY['orders', '42']) = idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'orders', '42') AS same;
-- Many parts (the SQL edition writes the name of more than 32 parts in one statement, and of fewer in a
-- loop): the client libraries' value; a two-dimensional array is its parts in order; a NULL among them is 22004.
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY(
           SELECT CASE g % 5 WHEN 0 THEN '' WHEN 1 THEN repeat('é', g) WHEN 2 THEN 'a;b:' || g
                             WHEN 3 THEN repeat('x', 60 + g) ELSE '日本' || g END
             FROM generate_series(0, 99) g ORDER BY g)) = 'ac889ef6-9abb-5f88-9232-5ff6f636aedc' AS pinned;
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY(SELECT ARRAY['p' || g, repeat('é', g)] FROM generate_series(1, 20) g ORDER BY g))
     = idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY(SELECT x FROM generate_series(1, 20) g, LATERAL unnest(ARRAY['p' || g, repeat('é', g)]) WITH ORDINALITY AS u(x, i) ORDER BY g, i)) AS same;
-- JSON Pointers: an array index is 0 or digits without a leading 0 (01, +1, ' 1' and -1 have no value in an
-- array, and are keys like any other in an object); ~1 is '/', then ~0 is '~'; a path given twice counts once.
SELECT idem_fingerprint('{"x": [10, 20], "o": {"01": 1, "+1": 2, "~": 3}, "~": {"/": 4}}',
           '/x/01', '/x/+1', '/x/ 1', '/x/-1', '/o/01', '/o/+1', '/x/1', '/x/1/0', '/~', '/~0', '/~0/~1', '/o/~', '/x/1')
     = '08662c105ea91e606683e01c9d72b239281031e0a03c5dbcbd7849691736f1dc' AS pinned;
-- Documents nested up to 100 arrays and objects deep are fingerprinted, the same value as the client
-- libraries' (clients/vectors.json); deeper ones (PostgreSQL takes thousands of levels) are refused with
-- 54000, never with a parser's internal error.
SELECT idem_fingerprint((repeat('[', 100) || '1' || repeat(']', 100))::jsonb) = '8f5812d74e5775f7b58b53904132a004d49f80ac62e5984c192a16453fb041b7' AS pinned;
SELECT length(idem_fingerprint((repeat('{"a":', 100) || '1' || repeat('}', 100))::jsonb, '/a/a')) AS fp_len;
SELECT idem_fingerprint(jsonb_build_object('s', repeat('[', 500), 'n', (repeat('[', 99) || ']' || repeat(']', 98))::jsonb)) IS NOT NULL AS brackets_in_strings_do_not_count;
-- Bad input: documented SQLSTATEs, no result.
\set VERBOSITY sqlstate
SELECT idem_fingerprint((repeat('[', 101) || '1' || repeat(']', 101))::jsonb);
SELECT idem_fingerprint((repeat('{"a":', 101) || '1' || repeat('}', 101))::jsonb, '/a');
SELECT idem_fingerprint((repeat('[', 5000) || '1' || repeat(']', 5000))::jsonb);
SELECT idem_key(NULL, 'a');
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'a', NULL);
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY[]::text[]);
SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY(SELECT CASE WHEN g = 40 THEN NULL ELSE 'p' || g END FROM generate_series(1, 50) g));
SELECT idem_fingerprint(NULL);
SELECT idem_fingerprint('{}', 'a/b');
SELECT idem_fingerprint('{}', NULL::text);
-- Consumers may call them.
SET ROLE idempotency_consumer;
SELECT length(idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'x')) AS len, length(idem_fingerprint('[]')) AS fp_len;
RESET ROLE;

-- Workload 4, two-transaction mode: claim and commit, then complete with the token and commit.
-- Each statement is its own (autocommit) transaction.
-- Key: 20% of the time (with -D dup=20) one of the preloaded keys 1..dupkeys, else a new one.
\set r random(1, 100)
\if :r <= :dup
\set k random(1, :dupkeys)
\else
\set k random(100000, 1000000000000)
\endif
SELECT (outcome = 'claimed')::int AS claimed, coalesce(token, 0) AS token FROM idem_claim(:k::text) \gset
\if :claimed
SELECT idem_complete(:k::text, '{"status":"ok","amount":42}'::jsonb, token => :token);
\endif

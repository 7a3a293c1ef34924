-- The SQL edition: the key filters of the sealed partitions (idempotency.sealed_keys, 0.9.0). A new key is
-- looked for in every partition before the write partition. Each such partition's index costs a call as
-- much as the call's own write (its lock, its scan, its descent), so at a week of daily partitions the
-- lookups cost more than the rest of the call; the filters answer for all the sealed partitions with one
-- descent of one index, and the partitions' indexes are read only when a print matches.

-- A key's 64-bit hash: its bucket is the top 16 bits (idempotency.sealed_keys.bucket), its print the low 31.
-- (Immutable throughout, so that the planner inlines it.)
CREATE FUNCTION idempotency.key_hash(key text, scope text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.hashtextextended(key OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) scope, 0)
$$;

-- Whether this server hashes keys as the filters were written (the hash of text depends on the machine's
-- byte order): a database restored on a machine of the other kind reads its sealed partitions through their
-- indexes, and maintenance writes no filter there.
CREATE FUNCTION idempotency.filters_usable() RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT idempotency.key_hash('idempotency', 'sealed_keys') OPERATOR(pg_catalog.=) 7267811164439816630
$$;

-- The filtered sealed partitions that may hold a key of hash h (a print of its bucket matches): none when
-- the key is in none of them. A set-returning SQL function, so that the planner inlines it into the calls'
-- statements (EXISTS (SELECT FROM idempotency.sealed_key_matches(h))), which a scalar one holding a
-- subquery it would not.
CREATE FUNCTION idempotency.sealed_key_matches(h bigint) RETURNS SETOF regclass
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT f.partition FROM idempotency.sealed_keys f
     WHERE f.bucket OPERATOR(pg_catalog.=) (h OPERATOR(pg_catalog.>>) 48)
       AND (h OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.=) ANY (f.prints)
$$;

-- Writes the filter of a sealed partition: the prints of all its keys, by bucket, at most per_row of them
-- in a row (idempotency.sealed_keys: the index holds them too), in one statement (about 3 s for 600,000
-- keys). NULL when the partition is not sealed or has its filter already. A sealed partition takes no new
-- rows (the seal waited for every transaction that wrote there), so the filter holds every key it will
-- hold; a key deleted later only makes the filter answer "maybe".
CREATE FUNCTION idempotency.filter_sealed(part regclass, per_row integer DEFAULT 256) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    IF per_row IS NULL OR per_row OPERATOR(pg_catalog.<) 1 OR per_row OPERATOR(pg_catalog.>) 512 THEN
        RAISE EXCEPTION 'idempotency: per_row must be between 1 and 512'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('per_row is %s.', coalesce(per_row::text, 'NULL'));
    END IF;
    PERFORM FROM idempotency.sealed x
      WHERE x.partition OPERATOR(pg_catalog.=) part AND x.filtered_keys IS NULL
        FOR UPDATE;
    IF NOT FOUND OR NOT idempotency.filters_usable() THEN
        RETURN NULL;
    END IF;
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) part;
    EXECUTE pg_catalog.format(
        'WITH written AS (
             INSERT INTO idempotency.sealed_keys (bucket, partition, chunk, prints)
             SELECT k.b, $1, (k.n OPERATOR(pg_catalog./) $2)::integer, pg_catalog.array_agg(k.p)
               FROM (SELECT y.b, y.p, pg_catalog.row_number() OVER (PARTITION BY y.b) OPERATOR(pg_catalog.-) 1 AS n
                       FROM (SELECT (x.h OPERATOR(pg_catalog.>>) 48)::integer AS b,
                                    (x.h OPERATOR(pg_catalog.&) 2147483647)::integer AS p
                               FROM (SELECT idempotency.key_hash(r.key, r.scope) AS h FROM %s r) x) y) k
              GROUP BY k.b, k.n OPERATOR(pg_catalog./) $2
             RETURNING pg_catalog.cardinality(prints) AS c)
         SELECT coalesce(pg_catalog.sum(w.c), 0)::bigint FROM written w', part)
      INTO n USING part, per_row;
    UPDATE idempotency.sealed x SET filtered_keys = n WHERE x.partition OPERATOR(pg_catalog.=) part;
    RETURN n;
END
$$;

-- Forgets the filters of partitions that are no longer sealed partitions of the record table.
CREATE FUNCTION idempotency.forget_sealed_keys(parts regclass[]) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) ANY (parts)
$$;

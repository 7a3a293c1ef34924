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

-- Whether a filtered sealed partition may hold a key of hash h: a row when a print of its bucket matches in the
-- merged filter (idempotency.merge_sealed_keys: one row per bucket for all the filtered partitions, partition
-- 0), none when the key is in none of them. Where the snapshot sees no merged row although there are
-- partitions' filters (the first entry of the index is not a merged row: a snapshot taken before the upgrade
-- to 0.9.5 wrote them, or a restore of an older version's rows), the partitions' rows are read instead, as
-- before 0.9.5. A set-returning SQL function, so that the planner inlines it into the calls' statements
-- (EXISTS (SELECT FROM idempotency.sealed_key_matches(h))), which a scalar one holding a subquery it would
-- not. (Before 0.9.5 it read the bucket's row of each partition: 7 rows a key at a week, 22,600
-- instructions, against one row.)
CREATE FUNCTION idempotency.sealed_key_matches(h bigint) RETURNS SETOF regclass
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT f.partition FROM idempotency.sealed_keys f
     WHERE f.bucket OPERATOR(pg_catalog.=) (h OPERATOR(pg_catalog.>>) 48)
       AND f.partition OPERATOR(pg_catalog.=) 0::pg_catalog.oid::pg_catalog.regclass
       AND (h OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.=) ANY (f.prints)
    UNION ALL
    SELECT f.partition FROM idempotency.sealed_keys f
     WHERE (SELECT g.partition FROM idempotency.sealed_keys g ORDER BY g.bucket, g.partition LIMIT 1)
           OPERATOR(pg_catalog.<>) 0::pg_catalog.oid::pg_catalog.regclass
       AND f.bucket OPERATOR(pg_catalog.=) (h OPERATOR(pg_catalog.>>) 48)
       AND (h OPERATOR(pg_catalog.&) 2147483647) OPERATOR(pg_catalog.=) ANY (f.prints)
$$;

-- Writes the merged filter again from the partitions' filters: for each bucket, the prints of every filtered
-- sealed partition, at most per_row of them in a row, as partition 0 (no relation). Called by filter_sealed
-- and forget_sealed_keys, in the transaction that changes the set of filters, so that whoever sees a
-- partition's filter (idempotency.sealed.filtered_keys, the cached state) sees it in the merged one too
-- (about 3 s for 4,000,000 keys). One writer at a time, each statement after the lock with a snapshot of its
-- own (PL/pgSQL: a second writer reads the first one's rows, and replaces them).
CREATE FUNCTION idempotency.merge_sealed_keys(per_row integer DEFAULT 256) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.merge_sealed_keys')::bigint);
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) 0::pg_catalog.oid::pg_catalog.regclass;
    INSERT INTO idempotency.sealed_keys (bucket, partition, chunk, prints)
    SELECT x.b, 0::pg_catalog.oid::pg_catalog.regclass, (x.n OPERATOR(pg_catalog./) per_row)::integer, pg_catalog.array_agg(x.p)
      FROM (SELECT f.bucket AS b, u.p, pg_catalog.row_number() OVER (PARTITION BY f.bucket) OPERATOR(pg_catalog.-) 1 AS n
              FROM idempotency.sealed_keys f, pg_catalog.unnest(f.prints) AS u(p)
             WHERE f.partition OPERATOR(pg_catalog.<>) 0::pg_catalog.oid::pg_catalog.regclass) x
     GROUP BY x.b, x.n OPERATOR(pg_catalog./) per_row;
END
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
    PERFORM idempotency.merge_sealed_keys(per_row);
    RETURN n;
END
$$;

-- Forgets the filters of partitions that are no longer sealed partitions of the record table (and their
-- prints in the merged filter, when there were any).
CREATE FUNCTION idempotency.forget_sealed_keys(parts regclass[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM idempotency.sealed_keys f WHERE f.partition OPERATOR(pg_catalog.=) ANY (parts);
    IF FOUND THEN
        PERFORM idempotency.merge_sealed_keys();
    END IF;
END
$$;

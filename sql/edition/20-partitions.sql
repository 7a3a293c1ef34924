-- The SQL edition: time partitions of idempotency.records, made ahead, sealed once past, dropped after the
-- retention. idem_maintenance() does all three; pg_cron or any outside scheduler calls it (docs/managed.md).
--
-- Where new rows go: the oldest partition that is not sealed (the "write partition"). Every writer of a
-- new key inserts there with ON CONFLICT DO NOTHING, so two transactions claiming one key meet in that
-- partition's unique index, whatever their clocks. A partition is sealed by maintenance once its range is
-- past: the seal takes its SHARE lock (waiting for its writers), moves idempotency.sealed_upto to its end
-- and commits; writers then move on to the next partition. A row's created_at is the transaction's start
-- (now()), moved into the write partition's range: in the minutes between a partition's end and its seal,
-- new rows still go to it, with created_at at its last microsecond.

-- Every partition of the record table and its range, kept by the functions below (and by maintenance,
-- for partitions attached by hand or by pg_partman).
CREATE TABLE idempotency.partition_ranges (
    partition      regclass PRIMARY KEY,    -- (regclass: a dump names the partition, a restore finds it again)
    partition_name name NOT NULL,
    range_from     timestamptz NOT NULL,
    range_to       timestamptz NOT NULL,
    -- Known to hold no row: a partition ahead of the write partition that maintenance found empty (a key
    -- call then does not look there). Only a move writes rows ahead (sql/move/import.sql clears it).
    known_empty    boolean NOT NULL DEFAULT false
);
CREATE INDEX ON idempotency.partition_ranges (range_from);
CREATE TRIGGER call_cache AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.partition_ranges
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.refresh_call_cache();
COMMENT ON TABLE idempotency.partition_ranges IS 'The partitions of idempotency.records and their ranges (the SQL edition''s own record of them).';
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.partition_ranges', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$$;

-- The partitions with their ranges, sizes, when retention drops each, and when each was sealed: the
-- native extension's view, read from idempotency.partition_ranges (filter_bytes: no filters here, NULL).
CREATE VIEW idempotency.partitions AS
SELECT p.partition::pg_catalog.regclass                           AS partition,
       p.range_from,
       p.range_to,
       GREATEST(c.reltuples, 0::pg_catalog.float4)::pg_catalog.int8 AS row_estimate,
       pg_catalog.pg_total_relation_size(c.oid)                   AS total_bytes,
       pg_catalog.pg_size_pretty(pg_catalog.pg_total_relation_size(c.oid)) AS size,
       p.range_to OPERATOR(pg_catalog.+) (SELECT s.retention FROM idempotency.settings s) AS dropped_after,
       x.sealed_at,
       NULL::integer                                              AS filter_bytes
  FROM idempotency.partition_ranges p
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.partition
  LEFT JOIN idempotency.sealed x ON x.partition OPERATOR(pg_catalog.=) p.partition
 ORDER BY p.range_from;
GRANT SELECT ON idempotency.partitions TO idempotency_admin, pg_monitor;
COMMENT ON VIEW idempotency.partitions IS 'Partitions of idempotency.records: range, estimated rows, size, when retention drops each, and when it was sealed (no new rows).';

-- The indexes a partition needs: the UNIQUE (key, scope) index that new keys meet in, and expires_at of
-- the leased rows (the reclaim sweep). For a partition attached by hand too.
CREATE FUNCTION idempotency.index_partition(part regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET default_tablespace = '' AS $$
DECLARE
    rel name;
    space text;
BEGIN
    SELECT c.relname INTO STRICT rel FROM pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) part::oid
       AND c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace::oid;
    SELECT coalesce((SELECT pg_catalog.format(' TABLESPACE %I', t.spcname) FROM pg_catalog.pg_tablespace t
                      WHERE t.oid OPERATOR(pg_catalog.=) c.reltablespace), '')
      INTO space FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) part::oid;
    EXECUTE pg_catalog.format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON idempotency.%I (key, scope)%s',
                              rel OPERATOR(pg_catalog.||) '_key_scope_idx', rel, space);
    EXECUTE pg_catalog.format('CREATE INDEX IF NOT EXISTS %I ON idempotency.%I (expires_at)%s WHERE expires_at IS NOT NULL',
                              rel OPERATOR(pg_catalog.||) '_expires_at_idx', rel, space);
END
$$;
COMMENT ON FUNCTION idempotency.index_partition(regclass) IS
'Creates the UNIQUE (key, scope) index and the (expires_at) index of leased rows that a partition of idempotency.records needs, unless they exist. For partitions attached by hand.';

-- A timestamp as a literal that reads back the same under any DateStyle and TimeZone.
CREATE FUNCTION idempotency.ts_literal(ts timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.quote_literal(pg_catalog.to_char(pg_catalog.timezone('UTC', ts), 'YYYY-MM-DD HH24:MI:SS.US')
                                    OPERATOR(pg_catalog.||) '+00')
$$;

-- Registers in partition_ranges the partitions of the record table it does not know (attached by hand or
-- by pg_partman), and forgets those that are gone; the ranges come from the bounds' own text, printed
-- with DateStyle and TimeZone pinned by this function's SET clauses.
CREATE FUNCTION idempotency.sync_partition_ranges() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET datestyle = 'ISO, YMD' SET timezone = 'UTC' AS $$
DECLARE
    gone regclass[];
BEGIN
    DELETE FROM idempotency.partition_ranges p
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                        WHERE i.inhrelid OPERATOR(pg_catalog.=) p.partition::oid
                          AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
    WITH forgotten AS (
        DELETE FROM idempotency.sealed x
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                            WHERE i.inhrelid OPERATOR(pg_catalog.=) x.partition::oid
                              AND i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid)
        RETURNING x.partition)
    SELECT pg_catalog.array_agg(f.partition) INTO gone FROM forgotten f;
    IF gone IS NOT NULL THEN
        PERFORM idempotency.forget_sealed_keys(gone);
    END IF;
    INSERT INTO idempotency.partition_ranges (partition, partition_name, range_from, range_to)
    SELECT c.oid::pg_catalog.regclass, c.relname, b[1]::timestamptz, b[2]::timestamptz
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid,
           LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                           '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$') AS b
     WHERE i.inhparent OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid
       AND b IS NOT NULL
    ON CONFLICT (partition) DO NOTHING;
END
$$;

-- Makes the partitions that cover as_of and `premake` intervals after it, where none covers them yet;
-- the number made. Slots are aligned to partition_interval from 2000-01-01 UTC, and named as the native
-- extension names them (records_pYYYY_MM_DD, or records_pYYYY_MM_DD_HH24MI below a day).
CREATE FUNCTION idempotency.premake_partitions(as_of timestamptz DEFAULT pg_catalog.now()) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET default_tablespace = '' AS $$
DECLARE
    s idempotency.settings;
    slot record;
    made integer := 0;
    -- New partitions and their indexes go where the record table says (ALTER TABLE idempotency.records SET
    -- TABLESPACE), else to the database's default: never where a caller's default_tablespace points.
    space text := (SELECT pg_catalog.format(' TABLESPACE %I', t.spcname) FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_tablespace t ON t.oid OPERATOR(pg_catalog.=) c.reltablespace
                    WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.records'::pg_catalog.regclass::oid);
BEGIN
    IF as_of IS NULL THEN
        RAISE EXCEPTION 'idempotency: as_of must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT pg_catalog.isfinite(as_of) THEN
        RAISE EXCEPTION 'idempotency: as_of must be a finite timestamp' USING ERRCODE = '22023';
    END IF;
    PERFORM idempotency.check_writable('idempotency.premake_partitions');
    SELECT * INTO STRICT s FROM idempotency.settings;
    -- One creator at a time (a transaction-scoped lock of the edition's own, taken only when making).
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency.partition_creation')::bigint);
    FOR slot IN
        SELECT g AS lo, g OPERATOR(pg_catalog.+) s.partition_interval AS hi,
               'records_p' OPERATOR(pg_catalog.||) pg_catalog.to_char(pg_catalog.timezone('UTC', g),
                   CASE WHEN s.partition_interval OPERATOR(pg_catalog.>=) '1 day'::interval
                        THEN 'YYYY_MM_DD' ELSE 'YYYY_MM_DD_HH24MI' END) AS name
          FROM pg_catalog.generate_series(
                   pg_catalog.date_bin(s.partition_interval, as_of, '2000-01-01 00:00:00+00'::timestamptz),
                   as_of OPERATOR(pg_catalog.+) pg_catalog.interval_mul(s.partition_interval, s.premake::pg_catalog.float8),
                   s.partition_interval) AS g
         ORDER BY g
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM idempotency.partition_ranges p
                               WHERE p.range_from OPERATOR(pg_catalog.<) slot.hi
                                 AND p.range_to OPERATOR(pg_catalog.>) slot.lo);
        -- Never behind the sealed ones: a slot before the end of the newest seal stays unmade.
        CONTINUE WHEN slot.lo OPERATOR(pg_catalog.<) idempotency.sealed_until();
        EXECUTE pg_catalog.format('CREATE TABLE idempotency.%I (LIKE idempotency.records INCLUDING DEFAULTS INCLUDING STORAGE)%s',
                                  slot.name, coalesce(space, ''));
        PERFORM idempotency.index_partition(pg_catalog.format('idempotency.%I', slot.name)::pg_catalog.regclass);
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.records ATTACH PARTITION idempotency.%I FOR VALUES FROM (%s) TO (%s)',
                                  slot.name, idempotency.ts_literal(slot.lo), idempotency.ts_literal(slot.hi));
        INSERT INTO idempotency.partition_ranges (partition, partition_name, range_from, range_to)
        VALUES (pg_catalog.format('idempotency.%I', slot.name)::pg_catalog.regclass, slot.name, slot.lo, slot.hi);
        made := made OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN made;
END
$$;
COMMENT ON FUNCTION idempotency.premake_partitions(timestamptz) IS
'Creates the partitions of idempotency.records that cover as_of and idempotency.premake intervals after it; returns how many were created.';

-- The end of the newest sealed partition, as every transaction sees it whatever its snapshot
-- (-infinity when none is sealed).
CREATE FUNCTION idempotency.sealed_until() RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    upto bigint;
BEGIN
    -- (PL/pgSQL, whose plans are kept for the session: a SQL function with a FROM clause is planned anew at
    -- every call from PL/pgSQL, at 80 us a time.)
    SELECT q.last_value INTO upto FROM idempotency.sealed_upto q;
    IF upto OPERATOR(pg_catalog.=) 0 THEN
        RETURN '-infinity'::timestamptz;
    END IF;
    RETURN pg_catalog.to_timestamp(upto::pg_catalog.float8 OPERATOR(pg_catalog./) 1000000);
END
$$;

-- The write partition, locked against a seal (ROW EXCLUSIVE: a seal's SHARE lock waits for this transaction,
-- and this waits for a seal under way): (partition, range_from, range_to) of the oldest partition past the
-- seals. Makes partitions when there is none to write to (a fresh install, or maintenance that has not run);
-- forgets one dropped or detached by hand.
CREATE FUNCTION idempotency.write_partition(OUT part oid, OUT range_from timestamptz, OUT range_to timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    upto timestamptz;
    nm name;
BEGIN
    FOR attempt IN 1..5 LOOP
        upto := idempotency.sealed_until();
        SELECT p.partition, p.partition_name, p.range_from, p.range_to INTO part, nm, range_from, range_to
          FROM idempotency.partition_ranges p
         WHERE p.range_from OPERATOR(pg_catalog.>=) upto
         ORDER BY p.range_from LIMIT 1;
        IF part IS NULL OR range_from OPERATOR(pg_catalog.>) GREATEST(pg_catalog.now(), upto) THEN
            -- Nothing to write to, or a gap before the oldest unsealed partition that now (or the end of the
            -- seals) falls in: make them. A write partition that starts where the seals end is used as it is,
            -- even ahead of now (a round run as of a later time sealed early): making partitions here would
            -- hold the creation lock, and a maintenance round behind it, until this transaction ends.
            CONTINUE WHEN idempotency.premake_partitions(GREATEST(pg_catalog.now(), upto)) OPERATOR(pg_catalog.>) 0
                       OR part IS NULL;
        END IF;
        BEGIN
            EXECUTE pg_catalog.format('LOCK TABLE idempotency.%I IN ROW EXCLUSIVE MODE', nm);
        EXCEPTION WHEN undefined_table THEN
            PERFORM idempotency.sync_partition_ranges();   -- dropped by hand, or by maintenance just now
            CONTINUE;
        END;
        IF pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', nm))::oid IS DISTINCT FROM part THEN
            PERFORM idempotency.sync_partition_ranges();   -- dropped and made again under its name
            CONTINUE;
        END IF;
        -- A seal that committed while this waited moved sealed_upto past it: take the next one.
        IF idempotency.sealed_until() OPERATOR(pg_catalog.<) range_to THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idempotency: the partitions of idempotency.records kept changing while they were looked up'
        USING ERRCODE = '40001', HINT = 'The transaction should be retried.';
END
$$;

-- Seals a partition now: waits up to wait_ms for its writers (false, nothing done, when they take
-- longer; 0: as long as it takes). Only the oldest unsealed partition can be sealed, and only once its range is past.
CREATE FUNCTION idempotency.seal_partition_within(part oid, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r idempotency.partition_ranges;
    saved text := pg_catalog.current_setting('lock_timeout');
BEGIN
    SELECT * INTO r FROM idempotency.partition_ranges p WHERE p.partition OPERATOR(pg_catalog.=) part;
    IF NOT FOUND OR EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) part) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM idempotency.partition_ranges p
                WHERE p.range_from OPERATOR(pg_catalog.<) r.range_from
                  AND NOT EXISTS (SELECT FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) p.partition)) THEN
        RAISE EXCEPTION 'idempotency: % is not the oldest unsealed partition', part::pg_catalog.regclass
            USING ERRCODE = '55000', HINT = 'Seal the partitions before it first.';
    END IF;
    IF NOT EXISTS (SELECT FROM idempotency.partition_ranges p WHERE p.range_from OPERATOR(pg_catalog.=) r.range_to) THEN
        RAISE EXCEPTION 'idempotency: no partition follows %: new rows would have nowhere to go', part::pg_catalog.regclass
            USING ERRCODE = '55000', HINT = 'Run idem_maintenance() first.';
    END IF;
    BEGIN
        PERFORM pg_catalog.set_config('lock_timeout', GREATEST(wait_ms, 0) OPERATOR(pg_catalog.||) 'ms', true);
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE', part::pg_catalog.regclass);
        PERFORM pg_catalog.set_config('lock_timeout', saved, true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    -- Seen at once by every writer that waited for the lock above (a sequence is not transactional).
    PERFORM pg_catalog.setval('idempotency.sealed_upto',
        GREATEST((SELECT q.last_value FROM idempotency.sealed_upto q),
                            (EXTRACT(epoch FROM r.range_to) OPERATOR(pg_catalog.*) 1000000)::bigint));
    -- Sealed as of now, the lock held: every transaction that wrote here began before (the lock waited for
    -- them), and the partition is dropped a retention after this when it holds keys written after its end.
    -- (Not this transaction's start, now(), alone: it may have begun before some of them, which then lost
    -- part of their retention, 0.9.5; never before it, should the clock have been set back.)
    INSERT INTO idempotency.sealed (partition, partition_name, range_from, range_to, sealed_at)
    VALUES (part, r.partition_name, r.range_from, r.range_to, GREATEST(pg_catalog.now(), pg_catalog.clock_timestamp()));
    RETURN true;
END
$$;

CREATE FUNCTION idempotency.seal_partition(part oid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM idempotency.check_writable('idempotency.seal_partition');
    -- Within the session's lock_timeout (0: as long as it takes).
    RETURN idempotency.seal_partition_within(part,
        (EXTRACT(epoch FROM pg_catalog.current_setting('lock_timeout')::interval) OPERATOR(pg_catalog.*) 1000)::integer);
END
$$;
COMMENT ON FUNCTION idempotency.seal_partition(oid) IS
'Seals a partition of idempotency.records now (no new rows go there; maintenance seals past ones itself); false if it was sealed or its writers took longer than lock_timeout. Pass ''idempotency.records_p2026_11_20''::regclass.';

-- Drops one partition if its lock comes within wait_ms; false (nothing done) otherwise.
CREATE FUNCTION idempotency.drop_partition(part regclass, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    saved text := pg_catalog.current_setting('lock_timeout');
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', wait_ms OPERATOR(pg_catalog.||) 'ms', true);
    EXECUTE pg_catalog.format('DROP TABLE %s', part);
    PERFORM pg_catalog.set_config('lock_timeout', saved, true);
    DELETE FROM idempotency.partition_ranges p WHERE p.partition OPERATOR(pg_catalog.=) part;
    DELETE FROM idempotency.sealed x WHERE x.partition OPERATOR(pg_catalog.=) part;
    PERFORM idempotency.forget_sealed_keys(ARRAY[part]);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;


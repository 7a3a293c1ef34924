-- The SQL edition: broker positions stored in the consumer's own transaction (the native extension's
-- src/api/offsets.rs and src/storage/offsets.rs). One row per (consumer_group, topic, partition) in
-- idempotency.offsets. Writers of one partition's position serialize on its row: the row is locked
-- (SELECT ... FOR UPDATE) or created (INSERT ... ON CONFLICT DO NOTHING, which waits for a concurrent
-- inserter) before it is decided on, so the second writer sees the first one's result. Under REPEATABLE
-- READ and SERIALIZABLE, PostgreSQL itself raises 40001 when the row was changed (or inserted) by a
-- transaction the snapshot cannot see.


-- The checks of a position, in the native order: the group (checked and authorized), the topic, the
-- partition (22004 when NULL, 22023 when negative).
CREATE FUNCTION idempotency.check_position(consumer_group text, topic text, partition integer,
                                           s idempotency.settings) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM idempotency.check_ident('consumer_group', check_position.consumer_group, s.max_key_bytes);
    PERFORM idempotency.authorize('group', check_position.consumer_group, s);
    PERFORM idempotency.check_ident('topic', check_position.topic, s.max_key_bytes);
    PERFORM idempotency.check_required('partition', check_position.partition);
    IF check_position.partition OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'idempotency: partition must not be negative, got %', check_position.partition
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- 22023 for a negative offset or generation (NULL passes: the caller decides whether it may be NULL).
CREATE FUNCTION idempotency.check_non_negative(what text, value bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'idempotency: % must not be negative, got %', what, value USING ERRCODE = '22023';
    END IF;
END
$$;

-- Locks the position's row, creating it from (init, init_generation) when absent. existed is false when
-- the row was just created (then next_offset and generation are NULL), true with the stored values
-- when it existed.
CREATE FUNCTION idempotency.lock_offset(g text, t text, p integer, init bigint, init_generation bigint,
                                        OUT existed boolean, OUT next_offset bigint, OUT generation bigint)
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        SELECT o.next_offset, o.generation INTO lock_offset.next_offset, lock_offset.generation
          FROM idempotency.offsets o
         WHERE o.consumer_group OPERATOR(pg_catalog.=) g AND o.topic OPERATOR(pg_catalog.=) t
           AND o.partition OPERATOR(pg_catalog.=) p
           FOR UPDATE;
        IF FOUND THEN
            lock_offset.existed := true;
            RETURN;
        END IF;
        INSERT INTO idempotency.offsets AS o (consumer_group, topic, partition, next_offset, generation, updated_at)
        VALUES (g, t, p, init, init_generation, pg_catalog.clock_timestamp())
        ON CONFLICT (consumer_group, topic, partition) DO NOTHING;
        IF FOUND THEN
            lock_offset.existed := false;
            RETURN;
        END IF;
        -- Another transaction inserted it concurrently and committed: lock its row.
    END LOOP;
END
$$;

CREATE FUNCTION idem_record_offset(consumer_group text, topic text, partition integer, processed_offset bigint,
                                   generation bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    nxt bigint;
    cur record;
    new_generation bigint;
    advances boolean;
BEGIN
    PERFORM idempotency.check_writable('idem_record_offset');
    PERFORM idempotency.check_position(idem_record_offset.consumer_group, idem_record_offset.topic,
                                       idem_record_offset.partition, s);
    PERFORM idempotency.check_non_negative('processed_offset', idem_record_offset.processed_offset);
    PERFORM idempotency.check_required('processed_offset', idem_record_offset.processed_offset);
    PERFORM idempotency.check_non_negative('generation', idem_record_offset.generation);
    IF idem_record_offset.processed_offset OPERATOR(pg_catalog.=) 9223372036854775807::bigint THEN
        RAISE EXCEPTION 'idempotency: processed_offset % is out of range', idem_record_offset.processed_offset
            USING ERRCODE = '22003';
    END IF;
    nxt := idem_record_offset.processed_offset OPERATOR(pg_catalog.+) 1::bigint;
    cur := idempotency.lock_offset(idem_record_offset.consumer_group, idem_record_offset.topic,
                                   idem_record_offset.partition, nxt, idem_record_offset.generation);
    IF NOT cur.existed THEN
        RETURN true;
    END IF;
    IF cur.generation IS NOT NULL AND idem_record_offset.generation IS NOT NULL
       AND idem_record_offset.generation OPERATOR(pg_catalog.<) cur.generation THEN
        RAISE EXCEPTION 'idempotency: consumer fenced on group % topic % partition %: generation % is older than the stored generation %',
            idempotency.quoted(idem_record_offset.consumer_group), idempotency.quoted(idem_record_offset.topic),
            idem_record_offset.partition, idem_record_offset.generation, cur.generation
            USING ERRCODE = '55006',
                  HINT = 'A newer member of the consumer group owns this partition; abandon this transaction.';
    END IF;
    new_generation := coalesce(idem_record_offset.generation, cur.generation);
    advances := nxt OPERATOR(pg_catalog.>) cur.next_offset;
    IF advances OR new_generation IS DISTINCT FROM cur.generation THEN
        UPDATE idempotency.offsets o
           SET next_offset = pg_catalog.int8larger(cur.next_offset, nxt), generation = new_generation,
               updated_at = pg_catalog.clock_timestamp()
         WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_record_offset.consumer_group
           AND o.topic OPERATOR(pg_catalog.=) idem_record_offset.topic
           AND o.partition OPERATOR(pg_catalog.=) idem_record_offset.partition;
    END IF;
    RETURN advances;
END
$$;
REVOKE ALL ON FUNCTION idem_record_offset(text, text, integer, bigint, bigint) FROM PUBLIC;

CREATE FUNCTION idem_next_offset(consumer_group text, topic text, partition integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    nxt bigint;
BEGIN
    PERFORM idempotency.check_position(idem_next_offset.consumer_group, idem_next_offset.topic,
                                       idem_next_offset.partition, s);
    SELECT o.next_offset INTO nxt FROM idempotency.offsets o
     WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_next_offset.consumer_group
       AND o.topic OPERATOR(pg_catalog.=) idem_next_offset.topic
       AND o.partition OPERATOR(pg_catalog.=) idem_next_offset.partition;
    RETURN nxt;
END
$$;
REVOKE ALL ON FUNCTION idem_next_offset(text, text, integer) FROM PUBLIC;

-- The checks of idem_offsets (a LANGUAGE sql function: PL/pgSQL refuses its argument topic, named as its
-- result column topic).
CREATE FUNCTION idempotency.check_offsets_args(consumer_group text, topic text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s idempotency.settings := idempotency.config();
BEGIN
    PERFORM idempotency.check_ident('consumer_group', check_offsets_args.consumer_group, s.max_key_bytes);
    PERFORM idempotency.authorize('group', check_offsets_args.consumer_group, s);
    IF check_offsets_args.topic IS NOT NULL THEN
        PERFORM idempotency.check_ident('topic', check_offsets_args.topic, s.max_key_bytes);
    END IF;
END
$$;

CREATE FUNCTION idem_offsets(consumer_group text, topic text DEFAULT NULL)
RETURNS TABLE (topic text, partition integer, next_offset bigint, generation bigint, updated_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT idempotency.check_offsets_args(idem_offsets.consumer_group, idem_offsets.topic);
SELECT o.topic::text, o.partition, o.next_offset, o.generation, o.updated_at
  FROM idempotency.offsets o
 WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_offsets.consumer_group
   AND (idem_offsets.topic IS NULL OR o.topic OPERATOR(pg_catalog.=) idem_offsets.topic)
 ORDER BY o.topic, o.partition;
$$;
REVOKE ALL ON FUNCTION idem_offsets(text, text) FROM PUBLIC;

-- For the edition's owner (the DBA): not granted to idempotency_consumer nor idempotency_admin, as in the
-- native extension, where it stays with the superuser.
CREATE FUNCTION idem_reset_offset(consumer_group text, topic text, partition integer, next_offset bigint,
                                  generation bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempotency.settings := idempotency.config();
    cur record;
BEGIN
    PERFORM idempotency.check_writable('idem_reset_offset');
    PERFORM idempotency.check_position(idem_reset_offset.consumer_group, idem_reset_offset.topic,
                                       idem_reset_offset.partition, s);
    PERFORM idempotency.check_non_negative('next_offset', idem_reset_offset.next_offset);
    PERFORM idempotency.check_required('next_offset', idem_reset_offset.next_offset);
    PERFORM idempotency.check_non_negative('generation', idem_reset_offset.generation);
    cur := idempotency.lock_offset(idem_reset_offset.consumer_group, idem_reset_offset.topic,
                                   idem_reset_offset.partition, idem_reset_offset.next_offset,
                                   idem_reset_offset.generation);
    IF cur.existed THEN
        -- NULL keeps the stored generation; a value replaces it, lower or higher (a zombie's huge
        -- generation is undone here).
        UPDATE idempotency.offsets o
           SET next_offset = idem_reset_offset.next_offset,
               generation = coalesce(idem_reset_offset.generation, cur.generation),
               updated_at = pg_catalog.clock_timestamp()
         WHERE o.consumer_group OPERATOR(pg_catalog.=) idem_reset_offset.consumer_group
           AND o.topic OPERATOR(pg_catalog.=) idem_reset_offset.topic
           AND o.partition OPERATOR(pg_catalog.=) idem_reset_offset.partition;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION idem_reset_offset(text, text, integer, bigint, bigint) FROM PUBLIC;

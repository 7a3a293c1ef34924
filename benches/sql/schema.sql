-- Tables and role of the benchmark, created once per run in the throwaway cluster (as postgres).
-- The comparison tables are the ones the hand-written patterns of issue 5 use, written the way
-- their authors write them: a plain primary key, default collation, no tuning.

CREATE EXTENSION IF NOT EXISTS idempotency;
-- Its first partitions (the current one and idempotency.premake ahead): since 0.2.0 CREATE EXTENSION
-- makes none, and reset.sql writes straight into idempotency.records.
SELECT FROM idem_maintenance();

-- The consumer: an ordinary login role with the extension's consumer grant, as in production.
CREATE ROLE bench LOGIN IN ROLE idempotency_consumer;
GRANT CREATE, USAGE ON SCHEMA public TO bench;
SET ROLE bench;

-- Workload 1, the floor: a bare primary-key table.
CREATE TABLE floor_keys (key text PRIMARY KEY);

-- Workloads 5a and 5b: the usual hand-rolled idempotency-key table.
CREATE TABLE idempotency_keys (
    idempotency_key  text PRIMARY KEY,
    status           text NOT NULL,
    response_payload jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The minimal SECURITY DEFINER pair (issue 32): 5a's two statements, each alone in a PL/pgSQL function that
-- pins its search_path, as the SQL edition's functions do (benches/sql/w5a_min_secdef.sql).
CREATE FUNCTION bench_min_claim(k text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.idempotency_keys (idempotency_key, status) VALUES (k, 'PENDING')
    ON CONFLICT (idempotency_key) DO NOTHING;
    RETURN FOUND;
END
$$;
CREATE FUNCTION bench_min_complete(k text, p jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE public.idempotency_keys SET status = 'COMPLETED', response_payload = p, updated_at = pg_catalog.now()
     WHERE idempotency_key = k;
END
$$;

-- The bare insert of workload 1 alone in the same kind of function (row m_w1, benches/sql/w1_min_secdef.sql):
-- what a SECURITY DEFINER PL/pgSQL call costs around an insert, beside idem_once (issue 32).
CREATE FUNCTION bench_min_once(k text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.floor_keys (key) VALUES (k) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Workload 5c: an insert-only dedup table; a duplicate fails on the primary key.
CREATE TABLE processed_events (
    event_id     text PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- The business write of workloads 2b and 5a+biz.
CREATE TABLE business_rows (
    id          bigserial PRIMARY KEY,
    message_key text NOT NULL,
    amount      integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

RESET ROLE;

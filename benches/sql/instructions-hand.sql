-- The hand-written side of benches/instructions-per-call: the tables of benches/sql/schema.sql that it compares
-- with, and the minimal SECURITY DEFINER pair (as bench_min_claim / bench_min_complete there).
CREATE TABLE floor_keys (key text PRIMARY KEY);
CREATE TABLE idempotency_keys (idempotency_key text PRIMARY KEY, status text NOT NULL, response_payload jsonb,
  created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE business_rows (id bigserial PRIMARY KEY, message_key text NOT NULL, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION min_claim(k text) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  INSERT INTO public.idempotency_keys (idempotency_key, status) VALUES (k, 'PENDING') ON CONFLICT (idempotency_key) DO NOTHING;
  RETURN FOUND;
END $f$;
CREATE FUNCTION min_complete(k text, p jsonb) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  UPDATE public.idempotency_keys SET status = 'COMPLETED', response_payload = p, updated_at = now() WHERE idempotency_key = k;
END $f$;

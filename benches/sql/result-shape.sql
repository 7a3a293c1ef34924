-- What the shape of a call's result costs it (benches/instructions-result-shape): four functions that answer
-- what idem_claim answers, its five columns, with no work of their own. shape_table (PL/pgSQL) and
-- shape_sql_table return as idem_claim does in both editions (RETURNS TABLE, one row); shape_row and
-- shape_sql_row return one value of a named composite type instead. (Statements end with ";" and a blank
-- line: a single-user backend reads them with -j.)
CREATE TYPE shape_claim AS (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz);

CREATE FUNCTION shape_table(key text)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    outcome := 'claimed'; token := 1; attempts := 1; expires_at := now();
    RETURN NEXT;
    RETURN;
END
$$;

CREATE FUNCTION shape_row(key text) RETURNS shape_claim
LANGUAGE plpgsql AS $$
BEGIN
    RETURN ROW('claimed', 1, 1, NULL, now())::shape_claim;
END
$$;

CREATE FUNCTION shape_sql_table(key text)
RETURNS TABLE (outcome text, token bigint, attempts integer, payload jsonb, expires_at timestamptz)
LANGUAGE sql AS $$ SELECT 'claimed'::text, 1::bigint, 1, NULL::jsonb, now() $$;

CREATE FUNCTION shape_sql_row(key text) RETURNS shape_claim
LANGUAGE sql AS $$ SELECT 'claimed'::text, 1::bigint, 1, NULL::jsonb, now() $$;


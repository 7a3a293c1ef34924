-- The SQL edition: idem_key and idem_fingerprint, the key and request fingerprint a client derives from a
-- message. They give the native extension's values (src/api/derive.rs) and the client libraries' (the
-- shared vectors in clients/vectors.json), with the same arguments, defaults, SQLSTATEs and messages.
--
-- Hashes.
--   SHA-256 is PostgreSQL's own pg_catalog.sha256(bytea) (PostgreSQL 11 and later).
--   SHA-1, which a version-5 UUID needs, is not built in: it comes from pgcrypto's digest(), which every
--   managed service offers and the edition's install script creates (CREATE EXTENSION IF NOT EXISTS
--   pgcrypto). pgcrypto may live in any schema (public, or extensions as on Supabase), and
--   @extschema:pgcrypto@ needs PostgreSQL 16, so idem_key is created by the DO block below, which looks
--   up pgcrypto's schema in pg_extension and writes it, quoted, into the body: no search_path lookup at
--   call time, and no SHA-1 of our own (a PL/pgSQL SHA-1 would cost a hundred times pgcrypto's). Moving
--   pgcrypto to another schema afterwards (ALTER EXTENSION pgcrypto SET SCHEMA) needs this file run again.
--
-- Privileges and search_path.
--   idem_fingerprint reads its size limit through idempotency.setting_int, in the schema consumers have
--   no USAGE on, so it is SECURITY DEFINER, and therefore pins search_path = pg_catalog, pg_temp.
--   idem_key is SECURITY DEFINER too: it runs pgcrypto's digest as the edition's owner, so a consumer
--   needs no USAGE on pgcrypto's schema (Supabase grants its extensions schema to its own roles only).
--   Both qualify every function, operator and type anyway (pg_catalog.…, OPERATOR(pg_catalog.…)), as the
--   rest of the edition does; neither could be inlined in any case (PL/pgSQL).
--   idem_fingerprint also sets extra_float_digits = 1: PostgreSQL then prints a double's shortest
--   round-trip digits (its Ryu), the digits ECMAScript's Number-to-String uses, whatever the session set.
--
-- Canonical JSON (RFC 8785) without recursion: one recursive CTE walks the document level by level
-- (PostgreSQL runs it as a loop over a work table) and gives each value a path of sort keys (object
-- members by their key's UTF-16 code units, array elements by index); the canonical text is its tokens
-- in path order. Nothing here recurses on the C stack, whatever the nesting.
-- The helpers are PL/pgSQL, not SQL: PL/pgSQL keeps their plans for the session, where a SQL function
-- called from PL/pgSQL is planned again at every call (measured: 1 ms a number that way, 4 us this way).
--
-- Depth: a document nested more than 100 levels deep (arrays and objects; a scalar is level 0, [] and {}
-- are 1) is refused with 54000, as the native extension refuses it (its JSON parser recurses). Checked by
-- one jsonpath query that looks no deeper than level 100.
--
-- Numbers: a jsonb number (exact decimal) becomes the nearest IEEE double (numeric -> float8 is
-- correctly rounded), printed by ECMAScript's rules (JCS 3.2.2.3): -0 is 0, fixed notation from 1e-6 up
-- to 1e21, exponent notation (1e+21, 1.5e-7) outside. A number beyond the largest double is refused with
-- 22003; one that rounds to zero (below 2^-1075) is 0.

-- The sort key of an object member's key: JCS orders keys by UTF-16 code units. UTF-8 bytes order the
-- same way except that U+E000..U+FFFF (UTF-8 lead bytes EE, EF) come after U+10000.. (lead bytes F0..F4)
-- in UTF-8 and before them in UTF-16 (surrogates D800..DFFF). Mapping the lead bytes EE, EF to F5, F6
-- (never in UTF-8) puts them last, as in UTF-16. A key's bytes never start with FF, which closes a
-- container's path below.
CREATE FUNCTION idempotency.jcs_key_order(k pg_catalog.text) RETURNS pg_catalog.bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (
    SELECT CASE WHEN pg_catalog.position(b, pg_catalog.decode('ee', 'hex')) OPERATOR(pg_catalog.=) 0
                 AND pg_catalog.position(b, pg_catalog.decode('ef', 'hex')) OPERATOR(pg_catalog.=) 0
                THEN b
                ELSE pg_catalog.convert_to(
                         pg_catalog.translate(pg_catalog.convert_from(b, 'LATIN1'),
                                              pg_catalog.chr(238) OPERATOR(pg_catalog.||) pg_catalog.chr(239),
                                              pg_catalog.chr(245) OPERATOR(pg_catalog.||) pg_catalog.chr(246)),
                         'LATIN1')
           END
      FROM (SELECT pg_catalog.convert_to(k, 'UTF8') AS b) s
    );
END
$$;

-- A jsonb number as JCS writes it (ECMAScript Number-to-String of the nearest double); NULL when it is
-- beyond the largest double (the caller raises). Needs extra_float_digits > 0 (idem_fingerprint sets 1).
CREATE FUNCTION idempotency.jcs_number(x pg_catalog.numeric) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    v pg_catalog.float8;
    f pg_catalog.text;     -- float8out's text: with extra_float_digits > 0, PostgreSQL's Ryu
    ip pg_catalog.text;    -- its digits before the point
    raw pg_catalog.text;   -- all its digits
    d pg_catalog.text;     -- the shortest digits, no leading or trailing zeros
    k pg_catalog.int4;     -- length(d)
    n pg_catalog.int4;     -- the position of the decimal point: value = 0.d × 10^n
    c pg_catalog.text;
    best pg_catalog.text;
    best_gap pg_catalog.numeric;
    gap pg_catalog.numeric;
BEGIN
    IF x OPERATOR(pg_catalog.=) 0 THEN
        RETURN '0';
    END IF;
    -- Rounds to zero: at most 2^-1075, half the smallest subnormal (the tie goes to the even zero).
    IF pg_catalog.abs(x) OPERATOR(pg_catalog.<) 1e-323 AND pg_catalog.abs(x) OPERATOR(pg_catalog.<=) (
            '2.4703282292062327208828439643411068618252990130716238221279284125033775363510437593264991818081' OPERATOR(pg_catalog.||)
            '799618989828234772285886546332835517796989819938739800539093906315035659515570226392290858392449' OPERATOR(pg_catalog.||)
            '105184435931802849936536152500319370457678249219365623669863658480757001585769269903706311928279' OPERATOR(pg_catalog.||)
            '558551332927834338409351978015531246597263579574622766465272827220056374006485499977096599470454' OPERATOR(pg_catalog.||)
            '020828166226237857393450736339007967761930577506740176324673600968951340535537458516661134223766' OPERATOR(pg_catalog.||)
            '678604162159680461914467291840300530057530849048765391711386591646239524912623653881879636239373' OPERATOR(pg_catalog.||)
            '280423891018672348497668235089863388587925628302755995657524455507255189313690836254779186948667' OPERATOR(pg_catalog.||)
            '994968324049705821028513185451396213837722826145437693412532098591327667236328125E-324')::pg_catalog.numeric THEN
        RETURN '0';
    END IF;
    -- Rounds to infinity: at least 2^1024 - 2^970, halfway between the largest double and 2^1024.
    IF pg_catalog.abs(x) OPERATOR(pg_catalog.>) 1.79e308 AND pg_catalog.abs(x) OPERATOR(pg_catalog.>=) (
            '179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587' OPERATOR(pg_catalog.||)
            '207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711' OPERATOR(pg_catalog.||)
            '531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093' OPERATOR(pg_catalog.||)
            '042880177904174497792')::pg_catalog.numeric THEN
        RETURN NULL;
    END IF;
    v := pg_catalog.abs(x)::pg_catalog.float8;
    f := v::pg_catalog.text;
    ip := pg_catalog.split_part(pg_catalog.split_part(f, 'e', 1), '.', 1);
    raw := ip OPERATOR(pg_catalog.||) pg_catalog.split_part(pg_catalog.split_part(f, 'e', 1), '.', 2);
    d := pg_catalog.rtrim(pg_catalog.ltrim(raw, '0'), '0');
    k := pg_catalog.length(d);
    n := pg_catalog.length(ip) OPERATOR(pg_catalog.-)
         (pg_catalog.length(raw) OPERATOR(pg_catalog.-) pg_catalog.length(pg_catalog.ltrim(raw, '0')));
    IF pg_catalog.strpos(f, 'e') OPERATOR(pg_catalog.>) 0 THEN
        n := n OPERATOR(pg_catalog.+) pg_catalog.split_part(f, 'e', 2)::pg_catalog.int4;
    END IF;
    -- PostgreSQL's Ryu never takes a bound of the double's rounding interval, where ECMAScript does
    -- when the double's mantissa is even (1e23 is 9.999999999999999e+22 in PostgreSQL, 1e+23 in
    -- ECMAScript). A bound can be a shorter decimal only from 2^53 up (below, a bound has more digits
    -- than any double's shortest form): there, the first length j < k at which d cut down or rounded
    -- up reads back as the same double gives the digits; the closer to d wins, then the even one.
    IF v OPERATOR(pg_catalog.>=) 9007199254740992::pg_catalog.float8 THEN
        FOR j IN 1 .. k OPERATOR(pg_catalog.-) 1 LOOP
            FOREACH c IN ARRAY ARRAY[pg_catalog.left(d, j),
                                     (pg_catalog.left(d, j)::pg_catalog.numeric OPERATOR(pg_catalog.+) 1)::pg_catalog.text] LOOP
                -- c × 10^(n - j); above the largest double it is no double.
                IF (c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric
                       OPERATOR(pg_catalog.<=) 1.7976931348623158e308
                   AND (c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric::pg_catalog.float8
                       OPERATOR(pg_catalog.=) v THEN
                    gap := pg_catalog.abs((c OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) j)::pg_catalog.text)::pg_catalog.numeric
                                          OPERATOR(pg_catalog.-)
                                          (d OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) (n OPERATOR(pg_catalog.-) k)::pg_catalog.text)::pg_catalog.numeric);
                    IF best IS NULL OR gap OPERATOR(pg_catalog.<) best_gap
                       OR (gap OPERATOR(pg_catalog.=) best_gap
                           AND pg_catalog.right(c, 1)::pg_catalog.int4 OPERATOR(pg_catalog.%) 2 OPERATOR(pg_catalog.=) 0) THEN
                        best := c;
                        best_gap := gap;
                    END IF;
                END IF;
            END LOOP;
            IF best IS NOT NULL THEN
                n := pg_catalog.length(best) OPERATOR(pg_catalog.+) n OPERATOR(pg_catalog.-) j;
                d := pg_catalog.rtrim(best, '0');
                k := pg_catalog.length(d);
                EXIT;
            END IF;
        END LOOP;
    END IF;
    -- ECMAScript's Number::toString layout.
    IF n OPERATOR(pg_catalog.>=) k AND n OPERATOR(pg_catalog.<=) 21 THEN
        f := d OPERATOR(pg_catalog.||) pg_catalog.repeat('0', n OPERATOR(pg_catalog.-) k);
    ELSIF n OPERATOR(pg_catalog.>) 0 AND n OPERATOR(pg_catalog.<=) 21 THEN
        f := pg_catalog.left(d, n) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.substr(d, n OPERATOR(pg_catalog.+) 1);
    ELSIF n OPERATOR(pg_catalog.>) -6 AND n OPERATOR(pg_catalog.<=) 0 THEN
        f := '0.' OPERATOR(pg_catalog.||) pg_catalog.repeat('0', OPERATOR(pg_catalog.-) n) OPERATOR(pg_catalog.||) d;
    ELSE
        f := pg_catalog.left(d, 1)
             OPERATOR(pg_catalog.||) CASE WHEN k OPERATOR(pg_catalog.>) 1 THEN '.' OPERATOR(pg_catalog.||) pg_catalog.substr(d, 2) ELSE '' END
             OPERATOR(pg_catalog.||) CASE WHEN n OPERATOR(pg_catalog.>) 1 THEN 'e+' ELSE 'e-' END
             OPERATOR(pg_catalog.||) pg_catalog.abs(n OPERATOR(pg_catalog.-) 1)::pg_catalog.text;
    END IF;
    RETURN CASE WHEN x OPERATOR(pg_catalog.<) 0 THEN '-' ELSE '' END OPERATOR(pg_catalog.||) f;
END
$$;

-- The JCS text of a document, iteratively (see the top of this file). Each value is a row: its path (one
-- sort key per level: a member's key order, an element's index as 4 big-endian bytes), its text (a
-- member's "key": prefix, a comma unless it comes first, then the scalar or the opening bracket); each
-- container adds its closing bracket at path || FF, after all its members. NULL when a number is beyond
-- the largest double.
CREATE FUNCTION idempotency.jcs_text(document pg_catalog.jsonb) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (
    WITH RECURSIVE node(path, prefix, kind, val) AS (
        SELECT ARRAY[]::pg_catalog.bytea[], '', pg_catalog.jsonb_typeof(document), document
      UNION ALL
        SELECT n.path OPERATOR(pg_catalog.||) c.sk, c.prefix, pg_catalog.jsonb_typeof(c.val), c.val
          FROM node n,
               LATERAL (
                   SELECT o.sk,
                          CASE WHEN pg_catalog.row_number() OVER (ORDER BY o.sk) OPERATOR(pg_catalog.=) 1 THEN '' ELSE ',' END
                              OPERATOR(pg_catalog.||) pg_catalog.to_json(o.key)::pg_catalog.text
                              OPERATOR(pg_catalog.||) ':' AS prefix,
                          o.val
                     FROM (SELECT idempotency.jcs_key_order(e.key) AS sk, e.key, e.value AS val
                             FROM pg_catalog.jsonb_each(CASE WHEN n.kind OPERATOR(pg_catalog.=) 'object'
                                                             THEN n.val ELSE '{}'::pg_catalog.jsonb END) e) o
                   UNION ALL
                   SELECT pg_catalog.int4send(a.i::pg_catalog.int4),
                          CASE WHEN a.i OPERATOR(pg_catalog.=) 1 THEN '' ELSE ',' END,
                          a.value
                     FROM pg_catalog.jsonb_array_elements(CASE WHEN n.kind OPERATOR(pg_catalog.=) 'array'
                                                               THEN n.val ELSE '[]'::pg_catalog.jsonb END)
                          WITH ORDINALITY a(value, i)
               ) c
         WHERE n.kind OPERATOR(pg_catalog.=) 'object' OR n.kind OPERATOR(pg_catalog.=) 'array'
    )
    SELECT CASE WHEN pg_catalog.bool_and(t.tok IS NOT NULL)
                THEN pg_catalog.string_agg(t.tok, '' ORDER BY t.path) END
      FROM (SELECT n.path,
                   n.prefix OPERATOR(pg_catalog.||) CASE n.kind
                       WHEN 'object' THEN '{'
                       WHEN 'array' THEN '['
                       WHEN 'number' THEN idempotency.jcs_number(n.val::pg_catalog.numeric)
                       ELSE n.val::pg_catalog.text   -- a string (jsonb escapes as JCS does), true, false, null
                   END AS tok
              FROM node n
            UNION ALL
            SELECT n.path OPERATOR(pg_catalog.||) pg_catalog.decode('ff', 'hex'),
                   CASE n.kind WHEN 'object' THEN '}' ELSE ']' END
              FROM node n
             WHERE n.kind OPERATOR(pg_catalog.=) 'object' OR n.kind OPERATOR(pg_catalog.=) 'array') t
    );
END
$$;

REVOKE ALL ON FUNCTION idempotency.jcs_key_order(pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.jcs_number(pg_catalog.numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.jcs_text(pg_catalog.jsonb) FROM PUBLIC;

-- idem_key: see the top of this file for why it is written through a DO block.
DO $do$
DECLARE
    pgcrypto_schema pg_catalog.name;
BEGIN
    SELECT n.nspname INTO pgcrypto_schema
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'pgcrypto';
    IF pgcrypto_schema IS NULL THEN
        RAISE EXCEPTION 'idempotency: the SQL edition needs pgcrypto for idem_key'
            USING ERRCODE = '55000', HINT = 'CREATE EXTENSION pgcrypto; then run the install again.';
    END IF;
    EXECUTE pg_catalog.replace($fn$
CREATE FUNCTION idem_key(namespace pg_catalog.uuid, VARIADIC parts pg_catalog.text[]) RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    subject_name pg_catalog.bytea := pg_catalog.decode('', 'hex');
    part pg_catalog.text;
    bytes pg_catalog.bytea;
    hash pg_catalog.bytea;
BEGIN
    IF namespace IS NULL THEN
        RAISE EXCEPTION 'idempotency: namespace must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF parts IS NULL THEN
        RAISE EXCEPTION 'idempotency: parts must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- The name: each part as <UTF-8 length>:<bytes>;
    FOREACH part IN ARRAY parts LOOP
        IF part IS NULL THEN
            RAISE EXCEPTION 'idempotency: part must not be NULL' USING ERRCODE = '22004';
        END IF;
        bytes := pg_catalog.convert_to(part, 'UTF8');
        subject_name := subject_name OPERATOR(pg_catalog.||) pg_catalog.convert_to(pg_catalog.length(bytes)::pg_catalog.text, 'UTF8')
                     OPERATOR(pg_catalog.||) pg_catalog.decode('3a', 'hex') OPERATOR(pg_catalog.||) bytes
                     OPERATOR(pg_catalog.||) pg_catalog.decode('3b', 'hex');
    END LOOP;
    IF pg_catalog.cardinality(parts) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'idempotency: idem_key needs at least one part' USING ERRCODE = '22023';
    END IF;
    -- RFC 4122 version 5: SHA-1 of the namespace's 16 bytes and the name, first 16 bytes, version 5 in
    -- the high nibble of byte 6, variant 10 in the high bits of byte 8.
    hash := @pgcrypto@.digest(pg_catalog.uuid_send(namespace) OPERATOR(pg_catalog.||) subject_name, 'sha1');
    hash := pg_catalog.set_byte(hash, 6, (pg_catalog.get_byte(hash, 6) OPERATOR(pg_catalog.&) 15) OPERATOR(pg_catalog.|) 80);
    hash := pg_catalog.set_byte(hash, 8, (pg_catalog.get_byte(hash, 8) OPERATOR(pg_catalog.&) 63) OPERATOR(pg_catalog.|) 128);
    RETURN pg_catalog.encode(pg_catalog.substr(hash, 1, 16), 'hex')::pg_catalog.uuid::pg_catalog.text;
END
$$
$fn$, '@pgcrypto@', pg_catalog.quote_ident(pgcrypto_schema));
END
$do$;

REVOKE ALL ON FUNCTION idem_key(pg_catalog.uuid, pg_catalog.text[]) FROM PUBLIC;

CREATE FUNCTION idem_fingerprint(document pg_catalog.jsonb, VARIADIC paths pg_catalog.text[] DEFAULT '{}')
RETURNS pg_catalog.text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET extra_float_digits = 1 AS $$
DECLARE
    subject pg_catalog.jsonb;
    path pg_catalog.text;
    tokens pg_catalog.text[];
    token pg_catalog.text;
    value pg_catalog.jsonb;
    canonical pg_catalog.text;
BEGIN
    IF document IS NULL THEN
        RAISE EXCEPTION 'idempotency: document must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- Within idempotency.max_payload_bytes before anything else, measured as the native extension measures it.
    PERFORM idempotency.check_document('document', document, idempotency.setting_int('max_payload_bytes')::integer);
    -- At most 100 levels of arrays and objects: is there a container at level 100 (the root is level 0)?
    IF pg_catalog.jsonb_path_exists(document,
           'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'idempotency: document is nested more than 100 levels deep'
            USING ERRCODE = '54000', HINT = 'Arrays and objects may nest at most 100 levels deep in a fingerprinted document.';
    END IF;
    IF paths IS NULL THEN
        RAISE EXCEPTION 'idempotency: paths must not be NULL' USING ERRCODE = '22004';
    END IF;
    FOREACH path IN ARRAY paths LOOP
        IF path IS NULL THEN
            RAISE EXCEPTION 'idempotency: path must not be NULL' USING ERRCODE = '22004';
        END IF;
    END LOOP;

    IF pg_catalog.cardinality(paths) OPERATOR(pg_catalog.=) 0 THEN
        subject := document;
    ELSE
        -- An object of each JSON Pointer (as written) to its value, JSON null where there is none.
        subject := '{}';
        FOREACH path IN ARRAY paths LOOP
            IF path OPERATOR(pg_catalog.<>) '' AND NOT pg_catalog.starts_with(path, '/') THEN
                RAISE EXCEPTION 'idempotency: path % is not a JSON Pointer (RFC 6901): it must be empty or start with ''/''',
                    -- Quoted as the native message quotes it (Rust's {:?}).
                    '"' OPERATOR(pg_catalog.||) pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                        pg_catalog.replace(path, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t')
                    OPERATOR(pg_catalog.||) '"'
                    USING ERRCODE = '22023';
            END IF;
            value := document;
            IF path OPERATOR(pg_catalog.<>) '' THEN
                tokens := pg_catalog.string_to_array(path, '/');
                FOR i IN 2 .. pg_catalog.cardinality(tokens) LOOP
                    -- ~1 is '/', then ~0 is '~'; an array index is 0 or digits without a leading 0.
                    token := pg_catalog.replace(pg_catalog.replace(tokens[i], '~1', '/'), '~0', '~');
                    CASE pg_catalog.jsonb_typeof(value)
                        WHEN 'object' THEN
                            value := value OPERATOR(pg_catalog.->) token;
                        WHEN 'array' THEN
                            IF token OPERATOR(pg_catalog.~) '^(0|[1-9][0-9]{0,8})$' THEN
                                value := value OPERATOR(pg_catalog.->) token::pg_catalog.int4;
                            ELSE
                                value := NULL;
                            END IF;
                        ELSE
                            value := NULL;
                    END CASE;
                    EXIT WHEN value IS NULL;
                END LOOP;
            END IF;
            subject := subject OPERATOR(pg_catalog.||)
                pg_catalog.jsonb_build_object(path, COALESCE(value, 'null'::pg_catalog.jsonb));
        END LOOP;
    END IF;

    canonical := idempotency.jcs_text(subject);
    IF canonical IS NULL THEN
        RAISE EXCEPTION 'idempotency: document holds a number beyond the range of an IEEE double'
            USING ERRCODE = '22003';
    END IF;
    RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(canonical, 'UTF8')), 'hex');
END
$$;

REVOKE ALL ON FUNCTION idem_fingerprint(pg_catalog.jsonb, pg_catalog.text[]) FROM PUBLIC;

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
-- Linear in the input: the work grows with the size of the arguments, never with its square (tested in
-- tests/torture/badinput_size.py; benches/input-size measures it). idem_key writes its name by appending
-- each part's piece to an array in place (up to 32 parts), or by one string_agg over the parts: adding each
-- part to a bytea copies the name so far (100,000 parts took 16 s). idem_fingerprint looks each distinct
-- path up once: a walk, level by level, over the distinct prefixes of the paths finds the values they reach
-- (an object's member by its key, an array's element by its index), each value on the way looked at once
-- however many paths pass through it; then #> fetches each path's value from the document, copying only
-- that value (-> step by step copies every container on the way, for every path); the object of the values
-- is built once, by jsonb_object_agg (|| in a loop copies it at every path). What stays is the contract's
-- own size: a path spelled n ways ('/~' and '/~0' name one member) puts its value n times into what is
-- hashed, here as in the native extension and the client libraries. The canonical JSON (45-canonical.sql)
-- is one walk of the document and one sort of its values.

-- Depth: a document nested more than 100 levels deep (arrays and objects; a scalar is level 0, [] and {}
-- are 1) is refused with 54000, as the native extension refuses it (its JSON parser recurses). Checked by
-- one jsonpath query that looks no deeper than level 100.

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
    utf8 pg_catalog.bool := pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) 'UTF8';
    part pg_catalog.text;
    pieces pg_catalog.text[] := '{}';
    seps pg_catalog.text[];
    first_part pg_catalog.text;
    has_null pg_catalog.bool;
    subject_name pg_catalog.text;
    hash pg_catalog.bytea;
BEGIN
    IF namespace IS NULL THEN
        RAISE EXCEPTION 'idempotency: namespace must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF parts IS NULL THEN
        RAISE EXCEPTION 'idempotency: parts must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.cardinality(parts) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION 'idempotency: idem_key needs at least one part' USING ERRCODE = '22023';
    END IF;
    -- The name: each part as <UTF-8 length>:<bytes>; (see "Linear in the input" above).
    IF pg_catalog.cardinality(parts) OPERATOR(pg_catalog.<=) 32 THEN
        -- A message's few parts: a loop costs least. Each piece is appended to an array in place, and the
        -- pieces joined once.
        FOREACH part IN ARRAY parts LOOP
            IF part IS NULL THEN
                RAISE EXCEPTION 'idempotency: part must not be NULL' USING ERRCODE = '22004';
            END IF;
            pieces := pg_catalog.array_append(pieces,
                CASE WHEN utf8 THEN pg_catalog.octet_length(part)
                     ELSE pg_catalog.octet_length(pg_catalog.convert_to(part, 'UTF8')) END::pg_catalog.text
                OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) part OPERATOR(pg_catalog.||) ';');
        END LOOP;
        subject_name := pg_catalog.array_to_string(pieces, '');
    ELSE
        IF pg_catalog.array_ndims(parts) OPERATOR(pg_catalog.=) 1 THEN
            has_null := pg_catalog.array_position(parts, NULL) IS NOT NULL;
            first_part := parts[pg_catalog.array_lower(parts, 1)];
        ELSE   -- VARIADIC ARRAY[[...]]: its parts in their order, as unnest gives them
            SELECT EXISTS (SELECT FROM (SELECT pg_catalog.unnest(parts) AS p) u WHERE u.p IS NULL),
                   (SELECT u.p FROM (SELECT pg_catalog.unnest(parts) AS p) u LIMIT 1)
              INTO has_null, first_part;
        END IF;
        IF has_null THEN
            RAISE EXCEPTION 'idempotency: part must not be NULL' USING ERRCODE = '22004';
        END IF;
        -- Many parts: one string_agg, whose delimiter before each part but the first is ';<its length>:',
        -- taken from seps when the part is shorter than 64 bytes (no number printed). The rows of unnest in
        -- a select list come in the array's order, and nothing between reorders them.
        seps := '{";0:",";1:",";2:",";3:",";4:",";5:",";6:",";7:",";8:",";9:",";10:",";11:",";12:",";13:",";14:",'
            '";15:",";16:",";17:",";18:",";19:",";20:",";21:",";22:",";23:",";24:",";25:",";26:",";27:",'
            '";28:",";29:",";30:",";31:",";32:",";33:",";34:",";35:",";36:",";37:",";38:",";39:",";40:",'
            '";41:",";42:",";43:",";44:",";45:",";46:",";47:",";48:",";49:",";50:",";51:",";52:",";53:",'
            '";54:",";55:",";56:",";57:",";58:",";59:",";60:",";61:",";62:",";63:"}';
        SELECT CASE WHEN utf8 THEN pg_catalog.octet_length(first_part)
                    ELSE pg_catalog.octet_length(pg_catalog.convert_to(first_part, 'UTF8')) END::pg_catalog.text
               OPERATOR(pg_catalog.||) ':'
               OPERATOR(pg_catalog.||) pg_catalog.string_agg(u.p, coalesce(seps[u.n OPERATOR(pg_catalog.+) 1],
                   ';' OPERATOR(pg_catalog.||) u.n::pg_catalog.text OPERATOR(pg_catalog.||) ':'))
               OPERATOR(pg_catalog.||) ';'
          INTO subject_name
          FROM (SELECT v.p, CASE WHEN utf8 THEN pg_catalog.octet_length(v.p)
                                 ELSE pg_catalog.octet_length(pg_catalog.convert_to(v.p, 'UTF8')) END AS n
                  FROM (SELECT pg_catalog.unnest(parts) AS p) v) u;
    END IF;
    -- RFC 4122 version 5: SHA-1 of the namespace's 16 bytes and the name, first 16 bytes, version 5 in
    -- the high nibble of byte 6, variant 10 in the high bits of byte 8.
    hash := @pgcrypto@.digest(pg_catalog.uuid_send(namespace) OPERATOR(pg_catalog.||) pg_catalog.convert_to(subject_name, 'UTF8'), 'sha1');
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
    doc pg_catalog.jsonb;
    subject pg_catalog.jsonb;
    bad pg_catalog.text;
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
    IF EXISTS (SELECT FROM (SELECT pg_catalog.unnest(paths) AS p) u WHERE u.p IS NULL) THEN
        RAISE EXCEPTION 'idempotency: path must not be NULL' USING ERRCODE = '22004';
    END IF;

    IF pg_catalog.cardinality(paths) OPERATOR(pg_catalog.=) 0 THEN
        subject := document;
    ELSE
        -- The first path (in the order given) that is not a JSON Pointer.
        SELECT u.p INTO bad
          FROM (SELECT pg_catalog.unnest(paths) AS p, pg_catalog.generate_series(1, pg_catalog.cardinality(paths)) AS i) u
         WHERE u.p OPERATOR(pg_catalog.<>) '' AND NOT pg_catalog.starts_with(u.p, '/')
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'idempotency: path % is not a JSON Pointer (RFC 6901): it must be empty or start with ''/''',
                -- Quoted as the native message quotes it (Rust's {:?}).
                '"' OPERATOR(pg_catalog.||) pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                    pg_catalog.replace(bad, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t')
                OPERATOR(pg_catalog.||) '"'
                USING ERRCODE = '22023';
        END IF;
        -- An object of each JSON Pointer (as written) to its value, JSON null where there is none, each path
        -- looked up once (see "Linear in the input" above).
        doc := document OPERATOR(pg_catalog.#>) '{}'::pg_catalog.text[];   -- detoasted once, not at each lookup
        WITH RECURSIVE
        given AS (   -- each path, with its reference tokens (~1 is '/', then ~0 is '~'): the first 101 only, as
                     -- no value lies deeper than level 100
            SELECT d.p, pg_catalog.array_agg(pg_catalog.replace(pg_catalog.replace(t.tok, '~1', '/'), '~0', '~')
                                             ORDER BY t.i) AS toks
              FROM (SELECT DISTINCT u.p FROM (SELECT pg_catalog.unnest(paths) AS p) u
                     WHERE u.p OPERATOR(pg_catalog.<>) '') d,
                   pg_catalog.unnest((pg_catalog.string_to_array(d.p, '/'))[2:102]) WITH ORDINALITY t(tok, i)
             GROUP BY d.p
        ),
        step AS (    -- each prefix of a path (its first i - 1 tokens), the next token, and the two together
            SELECT DISTINCT g.toks[1:i OPERATOR(pg_catalog.-) 1] AS parent, g.toks[i] AS tok, g.toks[1:i] AS child
              FROM given g, pg_catalog.generate_subscripts(g.toks, 1) i
        ),
        node(at, kind) AS (   -- the values the paths reach, level by level: an object's member by its key, an
                              -- array's element by an index that is 0 or digits without a leading 0
            SELECT '{}'::pg_catalog.text[], pg_catalog.jsonb_typeof(doc)
          UNION ALL
            SELECT s.child, pg_catalog.jsonb_typeof(doc OPERATOR(pg_catalog.#>) s.child)
              FROM node n JOIN step s ON s.parent OPERATOR(pg_catalog.=) n.at
             WHERE n.kind OPERATOR(pg_catalog.=) 'object'
                OR (n.kind OPERATOR(pg_catalog.=) 'array' AND s.tok OPERATOR(pg_catalog.~) '^(0|[1-9][0-9]{0,8})$')
        )
        SELECT pg_catalog.jsonb_object_agg(v.p, v.val) INTO subject
          FROM (SELECT g.p, CASE WHEN n.kind IS NULL THEN 'null'::pg_catalog.jsonb
                                 ELSE doc OPERATOR(pg_catalog.#>) g.toks END AS val
                  FROM given g LEFT JOIN node n ON n.at OPERATOR(pg_catalog.=) g.toks
                UNION ALL
                SELECT '', doc WHERE '' OPERATOR(pg_catalog.=) ANY (paths)) v;
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

"""A canonical text description of everything an extension consists of, for comparing two databases.

Two databases whose extension was made differently (created fresh at the new version, or created at an old
version and updated) must describe identically: that is what proves an upgrade script covers the schema.
Described, one line per fact, objects sorted by their pg_describe_object():
  * every member object (pg_depend deptype 'e');
  * functions: pg_get_functiondef (or, for aggregates, the signature), owner, ACL, comment, and which
    roles of the cluster (and PUBLIC) may EXECUTE it;
  * relations: kind, persistence, owner, columns in order (name, type, collation, not null, default,
    identity, generated, comment, ACL), indexes (pg_get_indexdef), constraints, triggers, policies, row
    security, partition key, reloptions, ACL, comment, view definition, sequence parameters;
  * schemas: owner, ACL, comment; other members: their description and comment;
  * the extension itself: version, schema, relocatable, extconfig (as names) with extcondition;
  * objects in the extension's schemas that are not members (an upgrade script that left something
    behind), except the partitions of idempotency.records and their indexes, which are data.
ACLs are compared as sorted aclexplode() items with NULL read as the default ACL, so the order in which
grants were made does not count.
"""


def _acl(acl, kind, owner):
    """SQL for the canonical text of an ACL column; kind is an SQL expression of acldefault's object type."""
    return f"""(SELECT coalesce(string_agg(x, ',' ORDER BY x), '(none)') FROM (
                  SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END || '=' ||
                         a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END ||
                         '/' || a.grantor::regrole::text AS x
                    FROM aclexplode(coalesce({acl}, acldefault({kind}, {owner}))) a) acl)"""


MEMBERS = """
SELECT d.classid::regclass::text, d.objid, d.objsubid, pg_describe_object(d.classid, d.objid, d.objsubid)
  FROM pg_depend d JOIN pg_extension e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
 WHERE e.extname = %s AND d.deptype = 'e'"""

EXTENSION = """
SELECT extversion, extnamespace::regnamespace::text, extrelocatable, extowner::regrole::text,
       coalesce((SELECT string_agg(c.oid::regclass::text || ' condition=' || quote_literal(coalesce(extcondition[i], 'NULL')),
                                   ', ' ORDER BY c.oid::regclass::text)
                   FROM generate_subscripts(extconfig, 1) i JOIN pg_class c ON c.oid = extconfig[i]), '(none)')
  FROM pg_extension WHERE extname = %s"""

# Roles whose EXECUTE right on the extension's functions is listed: every role that is not a predefined
# pg_* role, and PUBLIC.
ROLES = "SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_' UNION ALL SELECT 'public' ORDER BY 1"

FUNCTION = f"""
SELECT p.prokind,
       CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
            ELSE p.oid::regprocedure::text || ' returns ' || pg_get_function_result(p.oid) END,
       p.proowner::regrole::text,
       {_acl('p.proacl', "'f'", 'p.proowner')},
       coalesce(obj_description(p.oid, 'pg_proc'), '(none)'),
       (SELECT string_agg(r, ',' ORDER BY r) FROM unnest(%s::text[]) r
         WHERE has_function_privilege(r, p.oid, 'EXECUTE'))
  FROM pg_proc p WHERE p.oid = %s"""

_REL_KIND = "(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::\"char\""
RELATION = f"""
SELECT c.relkind, c.relpersistence, c.relowner::regrole::text, coalesce(c.reloptions::text, '(none)'),
       {_acl('c.relacl', _REL_KIND, 'c.relowner')},
       coalesce(obj_description(c.oid, 'pg_class'), '(none)'),
       c.relrowsecurity, c.relforcerowsecurity,
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END,
       CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid, true) END,
       (SELECT format('type %%s start %%s increment %%s min %%s max %%s cache %%s cycle %%s', format_type(s.seqtypid, NULL),
                      s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
          FROM pg_sequence s WHERE s.seqrelid = c.oid)
  FROM pg_class c WHERE c.oid = %s"""

COLUMNS = """
SELECT row_number() OVER (ORDER BY a.attnum), a.attname, format_type(a.atttypid, a.atttypmod),
       coalesce((SELECT quote_ident(co.collname) FROM pg_collation co WHERE co.oid = a.attcollation
                  AND a.attcollation <> (SELECT t.typcollation FROM pg_type t WHERE t.oid = a.atttypid)), 'default'),
       a.attnotnull, coalesce(pg_get_expr(ad.adbin, ad.adrelid), '(none)'), a.attidentity, a.attgenerated,
       coalesce(col_description(a.attrelid, a.attnum), '(none)'), coalesce(a.attacl::text, '(none)')
  FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum"""

INDEXES = """
SELECT pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisclustered THEN ' CLUSTERED' ELSE '' END
       || coalesce(' COMMENT ' || quote_literal(obj_description(i.indexrelid, 'pg_class')), '')
  FROM pg_index i WHERE i.indrelid = %s ORDER BY 1"""

CONSTRAINTS = """
SELECT conname || ' ' || pg_get_constraintdef(oid)
       || coalesce(' COMMENT ' || quote_literal(obj_description(oid, 'pg_constraint')), '')
  FROM pg_constraint WHERE conrelid = %s ORDER BY 1"""

TRIGGERS = "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal ORDER BY 1"

POLICIES = """
SELECT polname || ' ' || polcmd::text || ' permissive=' || polpermissive::text || ' roles=' || polroles::regrole[]::text
       || ' using=' || coalesce(pg_get_expr(polqual, polrelid), '') || ' check=' || coalesce(pg_get_expr(polwithcheck, polrelid), '')
  FROM pg_policy WHERE polrelid = %s ORDER BY 1"""

NAMESPACE = f"""
SELECT n.nspowner::regrole::text, {_acl('n.nspacl', "'n'", 'n.nspowner')},
       coalesce(obj_description(n.oid, 'pg_namespace'), '(none)')
  FROM pg_namespace n WHERE n.oid = %s"""

# Objects in the extension's schemas (its own and those of its member schemas) that are not members:
# relations other than the partitions of idempotency.records, their indexes and TOAST tables, and functions.
STRAYS = """
WITH ext AS (SELECT oid, extnamespace FROM pg_extension WHERE extname = %(ext)s),
     members AS (SELECT d.classid, d.objid FROM pg_depend d, ext
                  WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
     schemas AS (SELECT extnamespace AS oid FROM ext
                 UNION SELECT objid FROM members WHERE classid = 'pg_namespace'::regclass),
     parts AS (SELECT inhrelid AS oid FROM pg_inherits
                WHERE inhparent = (SELECT to_regclass('idempotency.records')))
SELECT 'relation ' || c.oid::regclass::text || ' (relkind ' || c.relkind::text || ')'
  FROM pg_class c
 WHERE c.relnamespace IN (SELECT oid FROM schemas) AND c.relkind NOT IN ('t')
   AND c.oid NOT IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass)
   AND c.oid NOT IN (SELECT oid FROM parts)
   AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indexrelid = c.oid
                   AND (i.indrelid IN (SELECT oid FROM parts)
                        OR i.indrelid IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass)))
   AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')
                                        AND d.refobjid IN (SELECT objid FROM members)))
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text
  FROM pg_proc p
 WHERE p.pronamespace IN (SELECT oid FROM schemas)
   AND p.oid NOT IN (SELECT objid FROM members WHERE classid = 'pg_proc'::regclass)
ORDER BY 1"""


def _describe_object(conn, roles, cls, objid):
    """The lines describing one object (cls: its catalog, as pg_depend.classid::regclass names it)."""
    lines = []
    if cls == "pg_proc":
        kind, definition, owner, acl, comment, execute = conn.execute(FUNCTION, (roles, objid)).fetchone()
        lines += [f"kind: {kind}", *(f"def: {line}" for line in definition.rstrip("\n").splitlines()),
                  f"owner: {owner}", f"acl: {acl}", f"comment: {comment}", f"execute: {execute or '(nobody)'}"]
    elif cls == "pg_class":
        (kind, persistence, owner, options, acl, comment, rls, force_rls, partkey, viewdef,
         seq) = conn.execute(RELATION, (objid,)).fetchone()
        lines += [f"relkind: {kind}", f"persistence: {persistence}", f"owner: {owner}", f"reloptions: {options}",
                  f"acl: {acl}", f"comment: {comment}", f"row security: {rls} force {force_rls}"]
        if partkey:
            lines.append(f"partition key: {partkey}")
        if viewdef is not None:
            lines += [f"view: {line}" for line in viewdef.splitlines()]
        if seq:
            lines.append(f"sequence: {seq}")
        for (pos, name, typ, coll, notnull, default, ident, gen, ccomment,
             cacl) in conn.execute(COLUMNS, (objid,)).fetchall():
            lines.append(f"column {pos}: {name} {typ} collate {coll} notnull={notnull} default={default} "
                         f"identity={ident!r} generated={gen!r} comment={ccomment} acl={cacl}")
        for query, label in ((INDEXES, "index"), (CONSTRAINTS, "constraint"), (TRIGGERS, "trigger"),
                             (POLICIES, "policy")):
            lines += [f"{label}: {r[0]}" for r in conn.execute(query, (objid,)).fetchall()]
    elif cls == "pg_namespace":
        owner, acl, comment = conn.execute(NAMESPACE, (objid,)).fetchone()
        lines += [f"owner: {owner}", f"acl: {acl}", f"comment: {comment}"]
    else:
        comment = conn.execute("SELECT obj_description(%s, %s)", (objid, cls)).fetchone()[0]
        lines.append(f"comment: {comment or '(none)'}")
    return lines


def describe(conn, ext="idempotency"):
    """The canonical description of extension `ext` in the database of `conn`, as a list of lines."""
    roles = [r[0] for r in conn.execute(ROLES).fetchall()]
    objects = [(descr, _describe_object(conn, roles, cls, objid))
               for cls, objid, objsubid, descr in conn.execute(MEMBERS, (ext,)).fetchall()]
    out = []
    ext_row = conn.execute(EXTENSION, (ext,)).fetchone()
    if ext_row is None:
        return [f"extension {ext} is not installed"]
    version, schema, relocatable, owner, config = ext_row
    out += [f"extension {ext} | version: {version}", f"extension {ext} | schema: {schema}",
            f"extension {ext} | relocatable: {relocatable}", f"extension {ext} | owner: {owner}",
            f"extension {ext} | extconfig: {config}"]
    for descr, lines in sorted(objects):
        out.append(f"{descr} | member")
        out += [f"{descr} | {line}" for line in lines]
    out += [f"not a member: {r[0]}" for r in conn.execute(STRAYS, {"ext": ext}).fetchall()]
    return out


# What a schema holds, for an install that is no extension (the SQL edition's plain script): the schema
# itself when it is `own` (its owner, ACL, comment), its functions, its relations other than indexes (shown
# with their table), TOAST tables, the partitions of idempotency.records and the row types of tables
# (composite types made by CREATE TYPE are relations of relkind c), and its other types (enums, domains,
# ranges; not arrays); not what another extension made there (pgcrypto's functions in public).
def _not_foreign(catalog, oid):
    return f"""NOT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                    WHERE d.classid = '{catalog}'::regclass AND d.objid = {oid} AND d.deptype = 'e'
                      AND d.refclassid = 'pg_extension'::regclass AND e.extname <> 'idempotency')"""


SCHEMA_OBJECTS = f"""
WITH parts AS (SELECT inhrelid AS oid FROM pg_inherits WHERE inhparent = (SELECT to_regclass('idempotency.records')))
SELECT 'pg_namespace', n.oid, pg_describe_object('pg_namespace'::regclass, n.oid, 0)
  FROM pg_namespace n WHERE n.nspname = ANY (%(own)s::name[])
UNION ALL
SELECT 'pg_proc', p.oid, pg_describe_object('pg_proc'::regclass, p.oid, 0)
  FROM pg_proc p WHERE p.pronamespace::regnamespace::name = ANY (%(schemas)s::name[])
   AND {_not_foreign('pg_proc', 'p.oid')}
UNION ALL
SELECT 'pg_class', c.oid, pg_describe_object('pg_class'::regclass, c.oid, 0)
  FROM pg_class c WHERE c.relnamespace::regnamespace::name = ANY (%(schemas)s::name[])
   AND c.relkind NOT IN ('i', 'I', 't') AND c.oid NOT IN (SELECT oid FROM parts)
   AND {_not_foreign('pg_class', 'c.oid')}
UNION ALL
SELECT 'pg_type', t.oid, pg_describe_object('pg_type'::regclass, t.oid, 0) || ' (' || t.typtype::text || ')'
  FROM pg_type t WHERE t.typnamespace::regnamespace::name = ANY (%(schemas)s::name[])
   AND t.typtype NOT IN ('c', 'b') AND t.typelem = 0 AND {_not_foreign('pg_type', 't.oid')}"""


def describe_schemas(conn, schemas, own=()):
    """The canonical description of what the schemas `schemas` hold (and of the schemas `own` themselves),
    as a list of lines, in the format of describe()."""
    roles = [r[0] for r in conn.execute(ROLES).fetchall()]
    objects = [(descr, _describe_object(conn, roles, cls, objid))
               for cls, objid, descr in conn.execute(SCHEMA_OBJECTS, {"schemas": list(schemas),
                                                                      "own": list(own)}).fetchall()]
    out = []
    for descr, lines in sorted(objects):
        out.append(f"{descr} | object")
        out += [f"{descr} | {line}" for line in lines]
    return out

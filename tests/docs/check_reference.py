#!/usr/bin/env python3
"""Checks the SQL reference in docs/ against the schema of the installed extension, so they cannot drift.

    tests/docs/check_reference.py      # after scripts/build; starts and stops its own cluster (tests/ports "docs")

Reads the catalog of a fresh `CREATE EXTENSION idempotency` and every signature row of the docs' tables (a
line starting with ``| `name(arg type, ...)` ``). Checks:
  * every function a role other than the owner can call (the `idem_*` functions, and the `idempotency.*`
    functions granted to a role) has a signature row, with the same argument names, types and order;
  * every signature row names a function that exists with those arguments;
  * every function of the extension has a comment (what `\\df+` shows);
  * the SQL edition (scripts/sql-edition, installed as a database owner that is not a superuser) has every
    such function of the native extension with the same arguments, defaults, result and volatility, the
    same grants to idempotency_consumer and idempotency_admin, and a comment; a function only one edition
    has must be named in NATIVE_ONLY / EDITION_ONLY below, which docs/managed.md explains. So the two
    editions' public surfaces cannot drift apart.
The last line is `docs: N passed, N failed`; the exit status is non-zero on any failure.
"""
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import pgtools  # noqa: E402

ROW = re.compile(r"^\| `((?:idempotency\.)?\w+)\(([^`]*)\)`")
# The spellings of a type in the docs and in pg_get_function_identity_arguments.
TYPES = {"timestamptz": "timestamp with time zone", "int": "integer", "int4": "integer", "int8": "bigint",
         "bool": "boolean"}

FUNCTIONS = """
SELECT n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid),
       pg_catalog.obj_description(p.oid, 'pg_proc') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) a
                WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid
                             AND d.deptype = 'e'
  JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
"""


# Functions of the native extension that the SQL edition does not have, and the reverse (docs/managed.md).
NATIVE_ONLY = {
    "idem_distribute": "Citus",
    "idem_move_records": "Citus",
    "idempotency.partition_range": "the edition keeps each partition's range in idempotency.partition_ranges",
}
EDITION_ONLY = {
    "idempotency.edition_version": "which version of the edition the plain script installed",
}

# Every function of a role other than the owner can call, in the schemas of the install: name, arguments with
# defaults, result, volatility, the roles granted EXECUTE, and whether it has a comment.
SURFACE = """
SELECT CASE WHEN n.nspname = 'idempotency' THEN 'idempotency.' ELSE '' END || p.proname,
       pg_catalog.pg_get_function_arguments(p.oid), pg_catalog.pg_get_function_result(p.oid), p.provolatile,
       ARRAY(SELECT r.rolname FROM pg_catalog.aclexplode(p.proacl) a
               JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
              WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner ORDER BY r.rolname),
       pg_catalog.obj_description(p.oid, 'pg_proc') IS NOT NULL
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname IN ('public', 'idempotency')
   AND (p.proname LIKE 'idem\\_%' OR EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) a
                                             WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner))
 ORDER BY 1, 2
"""


def surfaces(cluster):
    """{name: (arguments, result, volatility, grantees)} of each edition, and the edition's uncommented."""
    import subprocess
    import tempfile

    cluster.create_db("docs_native", partitions=False)
    with cluster.connect("docs_native") as conn:
        native = conn.execute(SURFACE).fetchall()
    out = tempfile.mkdtemp(prefix="idem-surface-")
    subprocess.run([str(ROOT / "scripts" / "sql-edition"), out], check=True, stdout=subprocess.DEVNULL)
    with cluster.connect() as conn:
        conn.execute("DROP DATABASE IF EXISTS docs_edition")
        conn.execute("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_owner') "
                     "THEN CREATE ROLE idem_owner LOGIN CREATEROLE; END IF; END$$")
        conn.execute("CREATE DATABASE docs_edition OWNER idem_owner")
    os.chmod(out, 0o755)
    os.chmod(os.path.join(out, "idempotency.sql"), 0o644)
    subprocess.run([str(cluster.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(cluster.sockdir), "-p", str(cluster.port),
                    "-U", "idem_owner", "-d", "docs_edition", "-c", "SET client_min_messages = warning",
                    "-f", os.path.join(out, "idempotency.sql")], check=True)
    with cluster.connect("docs_edition") as conn:
        edition = conn.execute(SURFACE).fetchall()
    return ({r[0]: r[1:5] for r in native}, {r[0]: r[1:5] for r in edition},
            [r[0] for r in edition if not r[5]])


def normalize(args):
    """`VARIADIC parts text[] DEFAULT '{}'` -> ('VARIADIC parts', 'text[]'): names and types, no defaults."""
    out = []
    for arg in filter(None, (a.strip() for a in split_args(args))):
        arg = re.split(r"\s+DEFAULT\s+", arg, maxsplit=1)[0].strip()
        words = arg.split()
        lead = 2 if words[0] == "VARIADIC" else 1
        name, typ = " ".join(words[:lead]), " ".join(words[lead:])
        out.append((name, TYPES.get(typ, typ)))
    return tuple(out)


def split_args(args):
    """Splits on the commas outside quotes and brackets."""
    depth, quote, start = 0, False, 0
    for i, ch in enumerate(args):
        if ch == "'":
            quote = not quote
        elif not quote and ch in "([":
            depth += 1
        elif not quote and ch in ")]":
            depth -= 1
        elif not quote and depth == 0 and ch == ",":
            yield args[start:i]
            start = i + 1
    yield args[start:]


def documented():
    """{qualified name: set of argument lists} from the signature rows of docs/*.md."""
    rows = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for line in page.read_text().splitlines():
            m = ROW.match(line)
            if m:
                rows.setdefault(m.group(1), set()).add((normalize(m.group(2)), page.name))
    return rows


def main():
    cluster = pgtools.Cluster(pgtools.port("docs"), [])
    cluster.init()
    cluster.start()
    try:
        cluster.create_db("docs", partitions=False)
        with cluster.connect("docs") as conn:
            functions = conn.execute(FUNCTIONS).fetchall()
        native, edition, uncommented = surfaces(cluster)
    finally:
        cluster.stop()
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        passed, failed = passed + ok, failed + (not ok)
        print(f"  {'ok  ' if ok else 'FAIL'}  {name}" + ("" if ok or not detail else f"\n          {detail}"))

    docs = documented()
    in_schema = {}
    for schema, name, args, commented, granted in functions:
        qualified = name if schema != "idempotency" else f"idempotency.{name}"
        in_schema.setdefault(qualified, set()).add(normalize(args))
        check(f"{qualified}({args}) has a comment", commented)
        if name.startswith("idem_") or granted:
            found = {a for a, _ in docs.get(qualified, set())}
            check(f"{qualified}({args}) is documented with its arguments", normalize(args) in found,
                  f"docs have {sorted(found) or 'no signature row'}; the schema has {normalize(args)}")
    for qualified, signatures in sorted(docs.items()):
        for args, page in sorted(signatures):
            check(f"docs/{page}: {qualified}{args} exists", args in in_schema.get(qualified, set()),
                  f"the schema has {sorted(in_schema.get(qualified, set())) or 'no such function'}")
    # The two editions' public surfaces.
    for name in sorted(set(native) | set(edition)):
        if name not in edition:
            check(f"SQL edition has {name}", name in NATIVE_ONLY, "add it to the edition, or to NATIVE_ONLY and docs/managed.md")
        elif name not in native:
            check(f"native extension has {name}", name in EDITION_ONLY, "add it to EDITION_ONLY and docs/managed.md")
        else:
            check(f"{name}: same signature, result, volatility and grants in both editions", native[name] == edition[name],
                  f"native {native[name]}; edition {edition[name]}")
    for name in uncommented:
        check(f"SQL edition: {name} has a comment", False)
    print(f"docs: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks the SQL reference in docs/ against the schema of the installed extension, so they cannot drift.

    tests/docs/check_reference.py      # after scripts/build; starts and stops its own cluster (tests/ports "docs")

Reads the catalog of a fresh `CREATE EXTENSION idempotency` and every signature row of the docs' tables (a
line starting with ``| `name(arg type, ...)` ``). Checks:
  * every function a role other than the owner can call (the `idem_*` functions, and the `idempotency.*`
    functions granted to a role) has a signature row, with the same argument names, types and order;
  * every signature row names a function that exists with those arguments;
  * every function of the extension has a comment (what `\\df+` shows).
The last line is `docs: N passed, N failed`; the exit status is non-zero on any failure.
"""
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
    print(f"docs: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compares the SQL edition's catalog in two databases of one cluster: what the schema idempotency and the
install's schema hold (functions with their definitions, owners, ACLs, comments and who may execute them;
tables, views, sequences and composite types with their columns, indexes, constraints and triggers; other
types), as tests/upgrade/catalog.py describes them.

    .venv/bin/python tests/sqledition/catalog_diff.py CONNINFO_A CONNINFO_B [--schema public | --extension]

Prints a unified diff and exits 1 when they differ, else prints that they are identical. What an install
cannot share with another is left out of the comparison: the body of idempotency.cached_state(), which is
data (idempotency.write_call_cache writes the state of that database's partitions, seals and settings into
it); the rest of its definition is compared. With --extension (the pg_tle edition), the members of the
extension idempotency are described instead (tests/upgrade/catalog.py's describe: its version, what it holds,
and what its schemas hold that is no member).
"""
import argparse
import difflib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "upgrade"))
import catalog  # noqa: E402
import psycopg  # noqa: E402

STATE = "function idempotency.cached_state() | def: "


def lines(conninfo, schema, extension=False):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if extension:
            out = catalog.describe(conn)
        else:
            out = catalog.describe_schemas(conn, ["idempotency", schema], own=["idempotency"])
    # cached_state()'s body (from "AS $function$" to the closing "$function$") is the database's state.
    kept, body = [], False
    for line in out:
        text = line[len(STATE):] if line.startswith(STATE) else None
        if text is not None and (body or text.startswith("AS $function$")):
            if not body:
                kept.append(STATE + "AS $function$(the state of this database)$function$")
            body = not text.endswith("$function$")
            continue
        kept.append(line)
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--schema", default="public", help="the schema the edition installed into (public)")
    ap.add_argument("--extension", action="store_true", help="the extension idempotency's members (pg_tle)")
    args = ap.parse_args()
    a, b = lines(args.a, args.schema, args.extension), lines(args.b, args.schema, args.extension)
    if a == b:
        print(f"identical catalogs ({len(a)} lines)")
        return 0
    sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in a], [x + "\n" for x in b], args.a, args.b, n=2))
    return 1


if __name__ == "__main__":
    sys.exit(main())

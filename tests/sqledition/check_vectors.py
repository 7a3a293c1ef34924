#!/usr/bin/env python3
"""Checks idem_key and idem_fingerprint of a database against the shared vectors (clients/vectors.json),
and the SQLSTATEs of their bad arguments. Runs against either edition (native or SQL): both must pass.

    .venv/bin/python tests/sqledition/check_vectors.py 'host=/tmp port=54990 dbname=x user=postgres'
    .venv/bin/python tests/sqledition/check_vectors.py CONNINFO --vectors path/to/vectors.json

Exit status 0 when every check passes, 1 otherwise (each failure is printed).
"""
import argparse
import json
import pathlib
import sys

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]

# (SQL, SQLSTATE): the documented errors of the derivation functions (docs/reference.md).
ERRORS = [
    ("SELECT idem_key(NULL, 'a')", "22004"),
    ("SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', 'a', NULL)", "22004"),
    ("SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC NULL::text[])", "22004"),
    ("SELECT idem_key('6ba7b810-9dad-11d1-80b4-00c04fd430c8', VARIADIC ARRAY[]::text[])", "22023"),
    ("SELECT idem_fingerprint(NULL)", "22004"),
    ("SELECT idem_fingerprint('{}', NULL::text)", "22004"),
    ("SELECT idem_fingerprint('{}', VARIADIC NULL::text[])", "22004"),
    ("SELECT idem_fingerprint('{}', 'a/b')", "22023"),
    ("SELECT idem_fingerprint('{}', '/a', 'b')", "22023"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("conninfo", help="libpq connection string of a database with idem_key and idem_fingerprint")
    parser.add_argument("--vectors", default=str(ROOT / "clients" / "vectors.json"))
    args = parser.parse_args()

    vectors = json.loads(pathlib.Path(args.vectors).read_text(encoding="utf-8"))
    failures = []
    checked = 0
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        for v in vectors["keys"]:
            checked += 1
            got = conn.execute("SELECT idem_key(%s::uuid, VARIADIC %s::text[])", (v["namespace"], v["parts"])).fetchone()[0]
            if got != v["key"]:
                failures.append(f"idem_key({v['namespace']}, {v['parts']!r}) = {got}, expected {v['key']}")
        for v in vectors["fingerprints"]:
            checked += 1
            # The document as JSON text: a number keeps its double value (Python's repr round-trips), which
            # is all a fingerprint depends on; non-ASCII characters travel as \u escapes.
            document = json.dumps(v["document"])
            got = conn.execute(
                "SELECT idem_fingerprint(%s::jsonb, VARIADIC %s::text[])", (document, v["paths"])
            ).fetchone()[0]
            if got != v["fingerprint"]:
                failures.append(
                    f"idem_fingerprint({document[:120]}, {v['paths']!r}) = {got}, expected {v['fingerprint']}"
                )
        for sql, state in ERRORS:
            checked += 1
            try:
                conn.execute(sql)
                failures.append(f"{sql}: no error, expected SQLSTATE {state}")
            except psycopg.Error as e:
                if e.sqlstate != state:
                    failures.append(f"{sql}: SQLSTATE {e.sqlstate}, expected {state} ({e})")

    for f in failures:
        print("FAIL", f)
    print(f"{checked - len(failures)}/{checked} checks passed "
          f"({len(vectors['keys'])} key vectors, {len(vectors['fingerprints'])} fingerprint vectors, {len(ERRORS)} errors)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

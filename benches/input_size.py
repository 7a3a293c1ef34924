"""The rows of benches/input-size: each function over arguments of growing size, in the database `native`
(the native extension) and the database `edition` (the SQL edition) of the cluster benches/input-size
started.

Each call is a statement with its arguments as parameters, as a client sends them (their parsing counted);
the rows "argument from a table" read the parts from a table instead, so they time the function alone (and
the table's read). Each cell: the median of 3 calls (1 when the first takes over 10 s), wall clock and, in
brackets, the CPU time of the backend (/proc/PID/schedstat), which a busy machine does not inflate. A call
still running after --timeout seconds is cancelled: "> N s".
"""
import argparse
import json
import os
import re
import time

import psycopg

NAMESPACE = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
RUNS = 3


def array(values):
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def parts(n):
    return array([f"part-{i}" for i in range(n)])


def document(n):
    return json.dumps({f"k{i}": {"id": i, "name": f"item {i}", "tags": ["a", "b"], "price": i * 1.25} for i in range(n)})


def paths(n):
    return [json.dumps({"a": {f"k{i}": i for i in range(n)}}), array([f"/a/k{i}" for i in range(n)])]


# (function, unit, sizes, size -> (sql, params))
ROWS = [
    ("idem_key, 2 parts, 10,000 calls in one statement", "calls", [10_000],
     lambda n: ("SELECT count(idem_key(%s::uuid, 'orders', g::text)) FROM generate_series(1, %s) g", [NAMESPACE, n])),
    ("idem_key", "parts", [10_000, 30_000, 100_000, 1_000_000, 3_000_000],
     lambda n: ("SELECT idem_key(%s::uuid, VARIADIC %s::text[])", [NAMESPACE, parts(n)])),
    ("idem_key, argument from a table", "parts", [1_000_000, 3_000_000],
     lambda n: ("SELECT idem_key(%s::uuid, VARIADIC a.parts) FROM input_size_parts a WHERE a.n = %s", [NAMESPACE, n])),
    ("idem_fingerprint, paths", "paths", [1_000, 10_000, 100_000],
     lambda n: ("SELECT idem_fingerprint(%s::jsonb, VARIADIC %s::text[])", paths(n))),
    ("idem_fingerprint, document", "members", [1_000, 10_000, 100_000],
     lambda n: ("SELECT idem_fingerprint(%s::jsonb)", [document(n)])),
]


def connect(db):
    conn = psycopg.connect(host=os.environ["IDEM_SOCKDIR"], port=int(os.environ["IDEM_PORT"]), user="postgres",
                           dbname=db, autocommit=True)
    conn.execute("SET idempotency.max_payload_bytes = '1GB'")
    return conn


def cpu(conn):
    with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def call(conn, sql, params, timeout):
    """(wall s, CPU s, answer) of the median call, or None when cancelled."""
    conn.execute(f"SET statement_timeout = '{timeout}s'")
    done = []
    for _ in range(RUNS):
        c0, w0 = cpu(conn), time.monotonic()
        try:
            answer = conn.execute(sql, params).fetchone()[0]
        except psycopg.errors.QueryCanceled:
            return None
        done.append((time.monotonic() - w0, cpu(conn) - c0, answer))
        if done[0][0] > 10:
            break
    done.sort()
    return done[len(done) // 2]


def fmt(t, timeout):
    if t is None:
        return f"> {timeout} s"
    wall, c = t[0], t[1]
    return f"{wall:.2f} s ({c:.2f} s)" if wall >= 1 else f"{wall * 1000:.0f} ms ({c * 1000:.0f} ms)"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--timeout", type=int, default=120)
    p.add_argument("--only")
    a = p.parse_args()
    conns = {db: connect(db) for db in ("native", "edition")}
    rows = [r for r in ROWS if not a.only or re.search(a.only, r[0])]
    if any(r[0].endswith("from a table") for r in rows):
        sizes = next(r[2] for r in rows if r[0].endswith("from a table"))
        for conn in conns.values():
            # Stored as it is (no compression), so that reading it costs little beside the function.
            conn.execute("CREATE TABLE input_size_parts (n integer PRIMARY KEY, parts text[])")
            conn.execute("ALTER TABLE input_size_parts ALTER parts SET STORAGE EXTERNAL")
            for n in sizes:
                conn.execute("INSERT INTO input_size_parts VALUES (%s, %s::text[])", [n, parts(n)])
    print("\n| function | input | native | SQL edition | edition / native (CPU) |\n|---|---:|---:|---:|---:|")
    for name, unit, sizes, make in rows:
        for n in sizes:
            sql, params = make(n)
            t = {db: call(conn, sql, params, a.timeout) for db, conn in conns.items()}
            if t["native"] and t["edition"] and t["native"][2] != t["edition"][2]:
                raise SystemExit(f"{name} over {n:,} {unit}: native {t['native'][2]}, edition {t['edition'][2]}")
            ratio = f"{t['edition'][1] / t['native'][1]:.1f}" if t["native"] and t["edition"] else ""
            print(f"| `{name}` | {n:,} {unit} | {fmt(t['native'], a.timeout)} | {fmt(t['edition'], a.timeout)} | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()

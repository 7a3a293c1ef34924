"""The rows of benches/input-size: each function over arguments of growing size, in the database `native`
(the native extension) and the database `edition` (the SQL edition) of the cluster benches/input-size
started.

Each call is a statement with its arguments as parameters, as a client sends them (their parsing counted);
the rows "argument from a table" read the parts from a table instead, so they time the function alone (and
the table's read). The batch rows raise idempotency.max_batch_keys to the batch's size and give each call keys
no call has used: `idem_once_batch` of new keys in one group (idempotency.key_locks_per_transaction raised too,
so all its keys are locked and written together; the cluster's lock table has room for them),
`idem_claim_batch` of keys an earlier `idem_once_batch` recorded (a batch delivered again), and
`idem_complete_batch` of keys an earlier transaction claimed (claimed before the clock starts; the keys, tokens
and payloads read from a temporary table), which goes 32 keys at a time (idempotency.key_locks_per_transaction
set to its default under the default max_locks_per_transaction). Before them, each session calls the three
batches on a small partition (100 keys, analyzed), as on a new day's partition or in a new database, and so plans
their statements there (until autovacuum analyzes the partition again). Each cell: the median of 3 calls (1
when the first takes over 10 s), wall clock and, in brackets, the CPU time of the backend
(/proc/PID/schedstat), which a busy machine does not inflate. A call still running after --timeout seconds is
cancelled: "> N s".
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


def new_keys(n, run):
    return array([f"k-{i}" for i in range(n)]), f"once-{n}-{run}-{time.time_ns()}"


def once_one_group(conn, n, run):
    conn.execute(f"SET idempotency.max_batch_keys = {n}")
    conn.execute(f"SET idempotency.key_locks_per_transaction = {n}")


def _kept_in(conn, n, run, table, columns):
    """New keys of a batch of n (their limits set for it) and their scope, and the temporary table that keeps them
    emptied."""
    conn.execute(f"SET idempotency.max_batch_keys = {n}")
    conn.execute("SET idempotency.key_locks_per_transaction = 32")
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table} ({columns})")
    conn.execute(f"TRUNCATE {table}")
    return new_keys(n, run)


def claimed_earlier(conn, n, run):
    """Claims n keys (committed) and keeps them, their tokens and payloads in the temporary table claimed."""
    keys, scope = _kept_in(conn, n, run, "claimed", "scope text, keys text[], tokens bigint[], payloads jsonb[]")
    conn.execute("INSERT INTO claimed SELECT %s, array_agg(c.key ORDER BY c.n), array_agg(c.token ORDER BY c.n), "
                 "array_agg(jsonb_build_object('n', c.n) ORDER BY c.n) "
                 "FROM idem_claim_batch(%s::text[], '1 hour', %s) WITH ORDINALITY AS c(key, outcome, token, attempts, "
                 "payload, expires_at, n)", [scope, keys, scope])


def settled_earlier(conn, n, run):
    """Records n keys as completed (idem_once_batch, committed) and keeps them in the temporary table settled."""
    keys, scope = _kept_in(conn, n, run, "settled", "scope text, keys text[]")
    conn.execute("SELECT count(*) FROM idem_once_batch(%s::text[], %s)", [keys, scope])
    conn.execute("INSERT INTO settled VALUES (%s, %s::text[])", [scope, keys])


# (function, unit, sizes, size, run -> (sql, params), optional: before each call (untimed): conn, size, run)
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
    ("idem_once_batch, new keys in one group", "keys", [1_000, 10_000, 100_000],
     lambda n, run: ("SELECT count(*) FROM idem_once_batch(%s::text[], %s)", list(new_keys(n, run))), once_one_group),
    ("idem_claim_batch, keys settled earlier (a batch delivered again)", "keys", [1_000, 10_000, 100_000],
     lambda n, run: ("SELECT count(*) FROM settled s, idem_claim_batch(s.keys, NULL::interval, s.scope)", []),
     settled_earlier),
    ("idem_complete_batch, keys claimed earlier", "keys", [1_000, 10_000, 100_000],
     lambda n, run: ("SELECT idem_complete_batch(c.keys, c.payloads, c.scope, c.tokens) FROM claimed c", []),
     claimed_earlier),
]


def connect(db):
    conn = psycopg.connect(host=os.environ["IDEM_SOCKDIR"], port=int(os.environ["IDEM_PORT"]), user="postgres",
                           dbname=db, autocommit=True)
    conn.execute("SET idempotency.max_payload_bytes = '1GB'")
    return conn


def cpu(conn):
    with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def call(conn, n, make, before, timeout):
    """(wall s, CPU s, answer) of the median call, or None when cancelled."""
    done = []
    for run in range(RUNS):
        conn.execute("RESET statement_timeout")
        if before:
            before(conn, n, run)
        sql, params = make(n, run) if before else make(n)
        conn.execute(f"SET statement_timeout = '{timeout}s'")
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
    if any("_batch" in r[0] for r in rows):
        # Each session plans its batches' statements while the write partition is small, as on a new day's
        # partition or in a new database (100 keys, analyzed), and keeps those plans for the rows below.
        for conn in conns.values():
            conn.execute("SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'warm-' || g FROM generate_series(1, 100) g), 'warm')")
            conn.execute("ANALYZE idempotency.records")
            conn.execute("SELECT count(*) FROM idem_claim_batch(ARRAY(SELECT 'warm-' || g FROM generate_series(1, 100) g), "
                         "NULL::interval, 'warm')")
            conn.execute("CREATE TEMP TABLE warm AS SELECT key, token FROM idem_claim_batch(ARRAY['w-1', 'w-2'], NULL::interval, 'w')")
            conn.execute("SELECT idem_complete_batch(ARRAY(SELECT key FROM warm ORDER BY key), NULL, 'w', "
                         "ARRAY(SELECT token FROM warm ORDER BY key))")
    print("\n| function | input | native | SQL edition | edition / native (CPU) |\n|---|---:|---:|---:|---:|")
    for name, unit, sizes, make, *before in rows:
        for n in sizes:
            t = {db: call(conn, n, make, before[0] if before else None, a.timeout) for db, conn in conns.items()}
            if t["native"] and t["edition"] and t["native"][2] != t["edition"][2]:
                raise SystemExit(f"{name} over {n:,} {unit}: native {t['native'][2]}, edition {t['edition'][2]}")
            ratio = f"{t['edition'][1] / t['native'][1]:.1f}" if t["native"] and t["edition"] else ""
            print(f"| `{name}` | {n:,} {unit} | {fmt(t['native'], a.timeout)} | {fmt(t['edition'], a.timeout)} | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()

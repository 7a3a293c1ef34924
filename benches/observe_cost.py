"""The body of benches/observe-cost: load a week of keys, time the observability queries, write the table."""
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import time

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS, DAYS = int(sys.argv[1]), int(sys.argv[2])
RUNS = 7
conn = psycopg.connect(f"host={os.environ['IDEM_SOCKDIR']} port={os.environ['IDEM_PORT']} user=postgres "
                       "dbname=postgres", autocommit=True)


def q(sql, *args):
    cur = conn.execute(sql, args)
    return cur.fetchall() if cur.description else []


def exporter_queries():
    """(section, SQL) of every section of the postgres_exporter file: the 'query: |' blocks."""
    text = open(os.path.join(ROOT, "monitoring/postgres_exporter/queries.yaml")).read()
    out = []
    for m in re.finditer(r"^(\w+):\n(?:  .*\n)*?  query: \|\n((?:    .*\n|\n)+)", text, re.M):
        out.append((m.group(1), "\n".join(line[4:] for line in m.group(2).splitlines())))
    return out


t0 = time.time()
q("CREATE EXTENSION idempotency")
q("SELECT sum(idempotency.premake_partitions(now() - make_interval(days => d))) "
  "FROM generate_series(%s, 0, -1) d", DAYS)
# g decides everything: the scope (10), the day (DAYS past days, then today for the live leases), the state.
q("""INSERT INTO idempotency.records (scope, key, status, token, attempts, error, created_at, updated_at, expires_at)
     SELECT 'tenant-' || (g %% 10), 'k' || g,
            CASE WHEN g %% 1000 = 7 THEN 'pending' WHEN g %% 2000 = 11 THEN 'failed' ELSE 'completed' END,
            CASE WHEN g %% 1000 = 7 THEN g END,
            CASE WHEN g %% 2000 = 11 THEN 5 ELSE 1 END,
            CASE WHEN g %% 2000 = 11 THEN '{"error": "poison"}'::jsonb END,
            CASE WHEN g %% 1000 = 7 THEN now() - interval '10 minutes'
                 ELSE date_trunc('day', now()) - make_interval(days => 1 + (g %% %s)::int) + interval '1 hour' END,
            now(),
            CASE WHEN g %% 1000 = 7
                 THEN now() + CASE WHEN (g / 1000) %% 2 = 0 THEN interval '1 hour' ELSE interval '-1 minute' END END
       FROM generate_series(1::bigint, %s::bigint) g""", DAYS, KEYS)
q("VACUUM ANALYZE idempotency.records")
q("SELECT FROM idem_maintenance()")
load_s = time.time() - t0
shape = q("SELECT count(*), count(sealed_at), sum(row_estimate)::bigint FROM idempotency.partitions")[0]
states = dict(q("SELECT status, count(*) FROM idempotency.records GROUP BY 1"))
# Some traffic, so that the statistics have rows.
for i in range(200):
    q("SELECT idem_once(%s, %s)", f"new-{i}", f"tenant-{i % 10}")

queries = [("idem_metrics()", "SELECT * FROM idem_metrics()"),
           ("idempotency.in_flight", "SELECT count(*) FROM idempotency.in_flight"),
           ("idempotency.dead_letters", "SELECT count(*) FROM idempotency.dead_letters"),
           ("idempotency.stats", "SELECT * FROM idempotency.stats"),
           ("idem_stats()", "SELECT * FROM idem_stats()"),
           ("idempotency.partitions", "SELECT * FROM idempotency.partitions")]
queries += [(f"postgres_exporter section {name}", sql) for name, sql in exporter_queries()]
rows = []
for label, sql in queries:
    q(sql)  # warm
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        n = len(q(sql))
        times.append((time.perf_counter() - t) * 1000)
    rows.append((label, n, statistics.median(times), max(times)))
    print(f"{label:55s} {n:6d} rows  median {statistics.median(times):9.1f} ms  max {max(times):9.1f} ms", flush=True)

git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
version = q("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")[0][0]
lines = [
    "# What the observability queries cost at production shape",
    "",
    f"* command: `benches/observe-cost {KEYS} {DAYS}`",
    f"* date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, extension {version}, git {git}",
    f"* data: {shape[2]:,} records (estimate) in {shape[0]} partitions, {shape[1]} sealed; states {states}; "
    f"10 scopes; loaded and sealed in {load_s:.0f} s",
    f"* each query run once to warm, then {RUNS} times; milliseconds",
    "",
    "| query | rows | median ms | slowest ms |",
    "|---|---:|---:|---:|",
]
lines += [f"| {label} | {n} | {med:,.1f} | {mx:,.1f} |" for label, n, med, mx in rows]
path = os.path.join(ROOT, "benches/results/observe.md")
open(path, "w").write("\n".join(lines) + "\n")
print(f"wrote {path}")

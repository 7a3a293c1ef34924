"""The benchmark's workloads: what each row of the table is (WORKLOADS, its group and the group's
reference row), the start state every measured run begins from, and how each workload is run and sampled
(pgbench scripts in benches/sql, the Python driver, redis-benchmark commands, the growth, partition and
retention procedures). benches/README.md describes them; runner.py runs them, report.py tabulates them.
"""
import os
import subprocess
import time

from runner import LOGDIR, ROOT, SQL, Admin, Job, Redis, log, psql_file, run_pgbench, run_pydriver

DUPKEYS = 10000  # preloaded keys 1..DUPKEYS; the dup20 variant draws 20% of its keys there
DUP_PCT = 20
PAYLOAD = '{"status":"ok","amount":42}'

# Redis, stated: both configurations keep RDB snapshots off (--save '') so nothing forks mid-run.
REDIS_CONFIGS = {
    "off": ("redis no-persist", ["--save", "", "--appendonly", "no"]),
    "on": ("redis aof=always", ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]),
}
PG_DURABILITY = {"on": "pg sync=on", "off": "pg sync=off"}

# The SQL edition (issue 28) runs in its own database of the same cluster (it and the native extension both
# use the schema idempotency), installed there by that database's owner, a non-superuser with CREATEROLE.
EDITION_DB = "bench_edition"
EDITION_OWNER = "bench_edition_owner"

# id -> (group, label, unit)
WORKLOADS = {
    "w1": ("dedup", "1 floor: INSERT .. ON CONFLICT DO NOTHING", "tx/s"),
    "w2a": ("dedup", "2a idem_once(key)", "tx/s"),
    "e_w2a": ("dedup", "2a SQL edition: idem_once(key)", "tx/s"),
    "w5c": ("dedup", "5c plain INSERT processed_events", "tx/s"),
    "r_nx_p1": ("dedup", "6 redis SET k v NX EX 30", "req/s"),
    "w5a_biz": ("business", "5a + business row (5 stmts)", "tx/s"),
    "w2b": ("business", "2b idem_once + business row (4 stmts)", "tx/s"),
    "e_w2b": ("business", "2b SQL edition: idem_once + business row (4 stmts)", "tx/s"),
    "w5a": ("message", "5a INSERT PENDING; UPDATE COMPLETED", "msg/s"),
    "m_w5a": ("message", "5a as a minimal SECURITY DEFINER PL/pgSQL pair (the SQL edition's own floor)", "msg/s"),
    "w5b": ("message", "5b SELECT FOR UPDATE; INSERT; UPDATE", "msg/s"),
    "w3": ("message", "3 idem_claim + idem_complete, 1 tx", "msg/s"),
    "e_w3": ("message", "3 SQL edition: idem_claim + idem_complete, 1 tx", "msg/s"),
    "w4": ("message", "4 claim; commit; complete(token); commit", "msg/s"),
    "r_pair_p1": ("message", "6 redis SET NX EX 30 then SET done (derived)", "msg/s"),
    "r_lua_p1": ("message", "6 redis same pair in one Lua EVAL", "msg/s"),
    "r_done_p1": ("inputs", "6 redis SET k done EX 86400 (input of derived)", "req/s"),
    "r_nx_p16": ("batch", "6 redis SET NX EX 30, pipeline 16", "keys/s"),
    "r_pair_p16": ("batch", "6 redis SET NX; SET done, pipeline 16 (derived)", "keys/s"),
    "r_lua_p16": ("batch", "6 redis Lua EVAL pair, pipeline 16", "keys/s"),
    "r_done_p16": ("inputs", "6 redis SET done, pipeline 16 (input of derived)", "req/s"),
    "b_once_10": ("batch", "7 idem_once_batch, 10 keys/call", "keys/s"),
    "b_once_100": ("batch", "7 idem_once_batch, 100 keys/call", "keys/s"),
    "b_once_1000": ("batch", "7 idem_once_batch, 1000 keys/call", "keys/s"),
    "b_claim_10": ("batch", "7 idem_claim_batch, 10 keys/call", "keys/s"),
    "b_claim_100": ("batch", "7 idem_claim_batch, 100 keys/call", "keys/s"),
    "b_claim_1000": ("batch", "7 idem_claim_batch, 1000 keys/call", "keys/s"),
    # Batches side by side with what users write by hand for a poll, per batch size (issue 21).
    "bf_100": ("batch100", "12 bare batch INSERT ... ON CONFLICT DO NOTHING, 100 keys", "keys/s"),
    "bo_100": ("batch100", "12 idem_once_batch, 100 keys", "keys/s"),
    "e_bo_100": ("batch100", "12 SQL edition: idem_once_batch, 100 keys", "keys/s"),
    "bh_100": ("batch100", "12 hand-written INSERT PENDING; UPDATE COMPLETED, 100 keys, 1 tx", "keys/s"),
    "bc_100": ("batch100", "12 idem_claim_batch + idem_complete_batch, 100 keys, 1 tx", "keys/s"),
    "e_bc_100": ("batch100", "12 SQL edition: idem_claim_batch + idem_complete_batch, 100 keys, 1 tx", "keys/s"),
    "bf_1000": ("batch1000", "12 bare batch INSERT ... ON CONFLICT DO NOTHING, 1000 keys", "keys/s"),
    "bo_1000": ("batch1000", "12 idem_once_batch, 1000 keys", "keys/s"),
    "e_bo_1000": ("batch1000", "12 SQL edition: idem_once_batch, 1000 keys", "keys/s"),
    "bh_1000": ("batch1000", "12 hand-written INSERT PENDING; UPDATE COMPLETED, 1000 keys, 1 tx", "keys/s"),
    "bc_1000": ("batch1000", "12 idem_claim_batch + idem_complete_batch, 1000 keys, 1 tx", "keys/s"),
    "e_bc_1000": ("batch1000", "12 SQL edition: idem_claim_batch + idem_complete_batch, 1000 keys, 1 tx", "keys/s"),
    "py_floor": ("pydriver", "1 floor, Python driver", "tx/s"),
    "py_5c": ("pydriver", "5c plain INSERT, Python driver (dup = caught error)", "tx/s"),
    "g_0": ("growth", "8 idem_claim, 0 retained keys (+10k baseline)", "tx/s"),
    "g_1": ("growth", "8 idem_claim, {n1} retained keys", "tx/s"),
    "g_2": ("growth", "8 idem_claim, {n2} retained keys", "tx/s"),
    "p_0": ("partitions", "8b idem_claim, {n} partitions (default)", "tx/s"),
    "p_1": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
    "p_2": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
    "p_3": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
    # Production shape: a week (then 30 days) of retained keys in daily partitions, every table holding them.
    "wk_w1": ("week", "10 floor, {n} keys retained", "tx/s"),
    "wk_w2a": ("week", "10 idem_once, {n} keys over 7 daily partitions", "tx/s"),
    "wk_w5a": ("week", "10 5a INSERT PENDING; UPDATE COMPLETED, {n} keys", "msg/s"),
    "wk_w3": ("week", "10 idem_claim + idem_complete, {n} keys over 7 daily partitions", "msg/s"),
    "wk_e_w3": ("week", "10 SQL edition: idem_claim + idem_complete, {n} keys over 7 daily partitions", "msg/s"),
    "wk_m_w5a": ("week", "10 5a as a minimal SECURITY DEFINER pair, {n} keys", "msg/s"),
    "wk_e_w2a": ("week", "10 SQL edition: idem_once, {n} keys over 7 daily partitions", "tx/s"),
    # The business row at a week of keys (issue 28): the hand-written pattern, the extension, the SQL edition.
    "wk_w5a_biz": ("weekbiz", "10 5a + business row (5 stmts), {n} keys", "tx/s"),
    "wk_w2b": ("weekbiz", "10 idem_once + business row (4 stmts), {n} keys over 7 daily partitions", "tx/s"),
    "wk_e_w2b": ("weekbiz", "10 SQL edition: idem_once + business row (4 stmts), {n} keys over 7 daily partitions", "tx/s"),
    # Issue 21's batches of 100 keys at a week of retained keys.
    "wk_bf_100": ("weekbatch", "10 bare batch INSERT ... ON CONFLICT DO NOTHING, 100 keys, {n} keys retained", "keys/s"),
    "wk_bo_100": ("weekbatch", "10 idem_once_batch, 100 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_e_bo_100": ("weekbatch", "10 SQL edition: idem_once_batch, 100 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_bh_100": ("weekbatch", "10 hand-written INSERT PENDING; UPDATE COMPLETED, 100 keys, {n} keys", "keys/s"),
    "wk_bc_100": ("weekbatch", "10 idem_claim_batch + idem_complete_batch, 100 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_e_bc_100": ("weekbatch", "10 SQL edition: idem_claim_batch + idem_complete_batch, 100 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_bf_1000": ("weekbatch1000", "10 bare batch INSERT ... ON CONFLICT DO NOTHING, 1000 keys, {n} keys retained", "keys/s"),
    "wk_bo_1000": ("weekbatch1000", "10 idem_once_batch, 1000 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_e_bo_1000": ("weekbatch1000", "10 SQL edition: idem_once_batch, 1000 keys, {n} keys over 7 daily partitions", "keys/s"),
    "wk_bh_1000": ("weekbatch1000", "10 hand-written INSERT PENDING; UPDATE COMPLETED, 1000 keys, {n} keys", "keys/s"),
    "wk_e_bc_1000": ("weekbatch1000", "10 SQL edition: idem_claim_batch + idem_complete_batch, 1000 keys, {n} keys over 7 daily partitions", "keys/s"),
    "mo_w1": ("month", "10 floor, {n} keys retained", "tx/s"),
    "mo_w2a": ("month", "10 idem_once, {n} keys over 30 daily partitions", "tx/s"),
    "mo_w5a": ("month", "10 5a INSERT PENDING; UPDATE COMPLETED, {n} keys", "msg/s"),
    "mo_w3": ("month", "10 idem_claim + idem_complete, {n} keys over 30 daily partitions", "msg/s"),
    # What the statistics cost: the same idem_once with idempotency.stats off, then on (the default).
    "st_off": ("stats", "11 idem_once, statistics off", "tx/s"),
    "st_on": ("stats", "11 idem_once, statistics on (default)", "tx/s"),
}
REFERENCE = {
    "dedup": "w1", "business": "w5a_biz", "message": "w5a", "batch": "r_nx_p16",
    "pydriver": "py_floor", "growth": "g_0", "partitions": "p_0", "week": "wk_w1", "weekbatch": "wk_bf_100",
    "weekbiz": "wk_w5a_biz", "weekbatch1000": "wk_bf_1000", "month": "mo_w1",
    "stats": "st_off", "batch100": "bf_100", "batch1000": "bf_1000",
}
GROUP_ORDER = ["dedup", "business", "message", "batch", "batch100", "batch1000", "pydriver", "growth", "partitions", "week", "weekbiz", "weekbatch",
               "weekbatch1000", "month", "stats"]
# Named selections for --only (bench.py): a name here stands for its regex on workload ids.
SELECTIONS = {
    # The SQL edition (issue 28) beside the native extension and the hand-written SQL it is measured against,
    # fresh and at a week of keys.
    "edition": r"^(wk_)?(e_|m_)?(w1|w2a|w5a|w3|w5a_biz|w2b|bf_100|bo_100|bf_1000|bo_1000|bh_100|bc_100|bh_1000|bc_1000)$",
    # Issue 29's floor: idem_once, claim + complete and idem_once_batch beside the bare insert and the
    # hand-written pair, fresh and at a week of keys.
    "floor29": r"^(wk_)?(w1|w2a|w5a|w3|bf_100|bo_100|bf_1000|bo_1000)$",
}
# In this order, so that the rows a ratio compares run back to back (noise hits them alike).
PGBENCH_SCRIPTS = {
    "w1": "w1_floor.sql", "w2a": "w2a_once.sql", "w5c": "w5c_plain_insert.sql",
    "w5a_biz": "w5a_pending_update_biz.sql", "w2b": "w2b_once_biz.sql",
    "w5a": "w5a_pending_update.sql", "m_w5a": "w5a_min_secdef.sql", "w5b": "w5b_select_for_update.sql",
    "w3": "w3_claim_complete.sql",
    "w4": "w4_claim_complete_2tx.sql",
}
# The SQL edition's rows: the same pgbench scripts in its database, each run right after the extension's row.
EDITION_SCRIPTS = {"w2a": ("e_w2a", "w2a_once.sql"), "w2b": ("e_w2b", "w2b_once_biz.sql"),
                   "w3": ("e_w3", "w3_claim_complete.sql")}
LUA_PAIR = ("if redis.call('SET', KEYS[1], 'v', 'NX', 'EX', 30) then "
            "redis.call('SET', KEYS[1], 'done', 'EX', 86400) return 1 end return 0")


def human(n):
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def job(wid, *args, **kw):
    """A row to sample (runner.Job) of workload `wid`."""
    return Job(wid, WORKLOADS[wid], *args, **kw)


def reset_tables(admin, script="reset.sql"):
    """benches/sql/reset.sql (what `psql -v dupkeys=N -f` would run), then a CHECKPOINT; reset_edition.sql
    in the SQL edition's database."""
    with open(os.path.join(SQL, script)) as f:
        admin.conn.execute(f.read().replace(":dupkeys", str(DUPKEYS)))
    admin.q("CHECKPOINT")


def edition_wanted(bench):
    return any(bench.wanted(w) for w in WORKLOADS if w.startswith(("e_", "wk_e_")))


def setup_edition(bench):
    """The SQL edition in its own database of this cluster, as a managed service's user installs it: the
    install script from scripts/sql-edition, run with `psql -v ON_ERROR_STOP=1 -f` by the database's owner,
    a non-superuser with CREATEROLE; then sql/edition_schema.sql as that owner. bench.edition_admin is a
    superuser connection to that database for the resets and the loads."""
    out = os.path.join(LOGDIR + "-edition")
    subprocess.run([os.path.join(ROOT, "scripts", "sql-edition"), out], check=True, stdout=subprocess.DEVNULL)
    bench.admin.q(f"CREATE ROLE {EDITION_OWNER} LOGIN CREATEROLE NOSUPERUSER")
    bench.admin.q(f"CREATE DATABASE {EDITION_DB} OWNER {EDITION_OWNER}")
    t0 = time.time()
    psql_file(os.path.join(out, "idempotency.sql"), user=EDITION_OWNER, dbname=EDITION_DB)
    psql_file(os.path.join(SQL, "edition_schema.sql"), user=EDITION_OWNER, dbname=EDITION_DB)
    bench.edition_admin = Admin(EDITION_DB)
    bench.edition_version = bench.edition_admin.one("SELECT idempotency.edition_version()")
    bench.edition_database = EDITION_DB
    log(f"SQL edition {bench.edition_version} installed in database {EDITION_DB} by {EDITION_OWNER} "
        f"(no superuser) in {time.time() - t0:.1f}s")


# ---- PostgreSQL workloads 1-5, 7 and the Python-driver rows
def pg_jobs(bench, sync):
    a = bench.args
    dur = PG_DURABILITY[sync]
    jobs = []

    def pgbench_fn(script, clients, variables, count_records=False, edition=False):
        admin, reset, db = ((bench.edition_admin, "reset_edition.sql", EDITION_DB) if edition
                            else (bench.admin, "reset.sql", "postgres"))

        def fn():
            reset_tables(admin, reset)
            r = run_pgbench(script, clients, a.duration, sync, variables, db)
            if count_records:
                r["rows_after"] = admin.one("SELECT count(*) FROM idempotency.records")
            return r
        return fn

    def pydriver_fn(workload, clients, dup):
        def fn():
            reset_tables(bench.admin)
            return run_pydriver(workload, clients, a.duration, sync, dup, DUPKEYS)
        return fn

    for clients in a.clients:
        top = clients == max(a.clients)
        for keys in (["new", "dup20"] if top else ["new"]):
            dup = DUP_PCT if keys == "dup20" else 0
            for wid, script in PGBENCH_SCRIPTS.items():
                if wid == "w5c" and dup:
                    continue  # 5c with duplicates: pgbench aborts on the error; see the pydriver rows
                if bench.wanted(wid):
                    fn = pgbench_fn(script, clients, {"dup": dup, "dupkeys": DUPKEYS}, wid in ("w2a", "w2b", "w3", "w4"))
                    jobs.append(job(wid, keys, sync, dur, clients, "pgbench", fn))
                if wid in EDITION_SCRIPTS and bench.wanted(EDITION_SCRIPTS[wid][0]):
                    eid, escript = EDITION_SCRIPTS[wid]
                    fn = pgbench_fn(escript, clients, {"dup": dup, "dupkeys": DUPKEYS}, True, edition=True)
                    jobs.append(job(eid, keys, sync, dur, clients, "pgbench", fn))
            if not top:
                continue
            for kind in ("once", "claim"):
                for n in (10, 100, 1000):
                    wid = f"b_{kind}_{n}"
                    if not bench.wanted(wid) or (a.quick and (n == 100 or (dup and n == 10))):
                        continue  # --quick: fewer sizes, to stay under 5 minutes
                    fn = pgbench_fn(f"w7_{kind}_batch.sql", clients, {"dup": dup, "dupkeys": DUPKEYS, "n": n})
                    jobs.append(job(wid, keys, sync, dur, clients, "pgbench", fn, unit_factor=n))
            # Issue 21's batches: each beside its hand-written counterpart, the same keys drawn the same way.
            for n in (100, 1000):
                for wid, script in ((f"bf_{n}", "w12_floor_batch.sql"), (f"bo_{n}", "w12_once_batch.sql"),
                                    (f"e_bo_{n}", "w12_once_batch.sql"),
                                    (f"bh_{n}", "w12_hand_batch.sql"), (f"bc_{n}", "w12_claim_complete_batch.sql"),
                                    (f"e_bc_{n}", "w12_claim_complete_batch.sql")):
                    if not bench.wanted(wid) or (a.quick and dup):
                        continue
                    fn = pgbench_fn(script, clients, {"dup": dup, "dupkeys": DUPKEYS, "n": n}, edition=wid.startswith("e_"))
                    jobs.append(job(wid, keys, sync, dur, clients, "pgbench", fn, unit_factor=n))
            for wid, w in (("py_floor", "floor"), ("py_5c", "plain_insert")):
                if not bench.wanted(wid) or (a.quick and dup and wid == "py_floor"):
                    continue
                jobs.append(job(wid, keys, sync, dur, clients, "pydriver", pydriver_fn(w, clients, dup)))
    # The statistics' cost: idem_once with idempotency.stats off, then on, back to back in each round
    # (set for the role, so every pgbench connection has it).
    top = max(a.clients)
    for wid, setting in (("st_off", "off"), ("st_on", "on")):
        if not bench.wanted(wid):
            continue

        def stats_fn(setting=setting):
            bench.admin.q(f"ALTER ROLE bench SET idempotency.stats = {setting}")
            try:
                return pgbench_fn("w2a_once.sql", top, {"dup": 0, "dupkeys": DUPKEYS}, True)()
            finally:
                bench.admin.q("ALTER ROLE bench RESET idempotency.stats")
        jobs.append(job(wid, "new", sync, dur, top, "pgbench", stats_fn))
    return jobs


# ---- Redis, workload 6
REDIS_COMMANDS = {
    "nx": ["SET", "idem:__rand_int__", "v", "NX", "EX", "30"],
    "done": ["SET", "idem:__rand_int__", "done", "EX", "86400"],
    "lua": ["EVAL", LUA_PAIR, "1", "idem:__rand_int__"],
}


def redis_jobs(bench, cls, holder):
    """Jobs for one Redis configuration; holder[0] is the running server."""
    a = bench.args
    jobs = []
    if not any(bench.wanted(w) for w in WORKLOADS if w.startswith("r_")):
        return jobs
    label = REDIS_CONFIGS[cls][0]
    for clients in a.clients:
        for keys in (["new", "dup20"] if clients == max(a.clients) else ["new"]):
            dup = keys == "dup20"
            for p in (1, 16):
                for name, command in REDIS_COMMANDS.items():
                    if name == "done" and dup:
                        continue  # overwriting a key costs the same whether it repeats or not
                    def fn(command=command, clients=clients, p=p, dup=dup):
                        return holder[0].timed_bench(command, clients, p, a.duration, dup)
                    jobs.append(job(f"r_{name}_p{p}", keys, cls, label, clients, "redis-benchmark", fn))
    return jobs


def derive_redis_pairs(bench):
    """A message is SET NX then (for a new key) SET done, one after the other on the same
    connection, so per client the two latencies add up and the closed-loop rate is
    1 / (1/rps_nx + share_new/rps_done); p50/p99 are the sums of the two rows' (medians)."""
    idx = {(r["id"], r["class"], r["clients"], r["keys"]): r for r in bench.rows}
    for r in list(bench.rows):
        if r["tool"] != "redis-benchmark" or not r["id"].startswith("r_nx_"):
            continue
        p = r["id"].split("_")[-1]
        done = idx.get((f"r_done_{p}", r["class"], r["clients"], "new"))
        if not done:
            continue
        share_new = 1 - DUP_PCT / 100 if r["keys"] == "dup20" else 1.0
        rate = 1 / (1 / r["throughput"] + share_new / done["throughput"])
        group, label, unit = WORKLOADS[f"r_pair_{p}"]
        bench.rows.append({"id": f"r_pair_{p}", "group": group, "workload": label, "keys": r["keys"],
                           "class": r["class"], "durability": r["durability"], "clients": r["clients"],
                           "throughput": rate, "unit": unit, "p50_ms": r["p50_ms"] + done["p50_ms"],
                           "p99_ms": r["p99_ms"] + done["p99_ms"], "tool": "derived", "calls_per_s": rate,
                           "cpu_busy_before": max(r["cpu_busy_before"], done["cpu_busy_before"])})


def main_matrix(bench):
    """Rows 1-7: every round runs each PostgreSQL row once per synchronous_commit setting, then
    each Redis row once per configuration (the server restarted fresh for each)."""
    pg = {sync: pg_jobs(bench, sync) for sync in bench.args.sync}
    holder = [None]
    rd = {} if bench.args.skip_redis else {cls: redis_jobs(bench, cls, holder) for cls in bench.args.sync}
    for rnd in range(bench.args.rounds):
        for sync in bench.args.sync:
            log(f"round {rnd + 1}/{bench.args.rounds}: PostgreSQL, synchronous_commit={sync}")
            for job in pg[sync]:
                bench.sample(job, rnd)
        for cls, jobs in rd.items():
            if not jobs:
                continue
            holder[0] = Redis(*REDIS_CONFIGS[cls])
            bench.redis_cmdlines[cls] = holder[0].cmdline
            try:
                for job in jobs:
                    bench.sample(job, rnd)
            finally:
                holder[0].stop()
    for jobs in list(pg.values()) + list(rd.values()):
        for job in jobs:
            bench.finish(job)
    derive_redis_pairs(bench)


# ---- workload 8: growth
def partitions(bench, admin=None):
    rows = (admin or bench.admin).q("""
        SELECT c.relname, m[1]::timestamptz, m[2]::timestamptz
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
               regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') m
         WHERE i.inhparent = 'idempotency.records'::regclass ORDER BY 2""")
    return rows


def interval(bench, admin=None):
    if admin is not None and admin is not bench.admin:  # the SQL edition: its settings table
        return admin.one("SELECT partition_interval::text FROM idempotency.settings")
    return bench.admin.one("SELECT coalesce(current_setting('idempotency.partition_interval', true), '1d')")


def past_partitions(bench, count, admin=None):
    """The `count` partitions ending with the current one (created for past days if needed). The SQL
    edition's idempotency.premake_partitions(as_of) makes them the same way."""
    admin = admin or bench.admin
    # premake_partitions makes its slot and `premake` ahead: one call per past slot leaves no gap.
    for k in range(count - 1, 0, -1):
        admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (interval(bench, admin), k))
    now = admin.one("SELECT now()")
    parts = [p for p in partitions(bench, admin) if p[1] <= now]
    return parts[-count:]


def load_retained(bench, parts, first, last, spread, admin=None):
    """Keys first..last (a permutation of 1..10^10, so they interleave with the benchmark's
    keys in the index), completed, created_at spread evenly over the given partitions."""
    values = ", ".join(f"({i}, '{lo.isoformat()}'::timestamptz, least('{hi.isoformat()}'::timestamptz, now()))"
                       for i, (_, lo, hi) in enumerate(parts))
    (admin or bench.admin).q(f"""
        INSERT INTO idempotency.records (scope, key, status, attempts, payload, created_at, updated_at)
        SELECT 'default', ((g * 999983) %% 10000000019)::text, 'completed', 1, %s::jsonb,
               p.lo + (p.hi - p.lo) * ((g %% 9973) / 9973.0), now()
          FROM generate_series(%s::bigint, %s::bigint) g
          JOIN (VALUES {values}) p(i, lo, hi) ON p.i = g %% {spread}""", (PAYLOAD, first, last))


def growth(bench):
    a = bench.args
    if not bench.wanted("g_"):
        return
    sizes = a.growth_sizes
    log(f"growth: retained keys {sizes} over the current and past partitions")
    reset_tables(bench.admin)
    parts = past_partitions(bench, 5)
    nparts = len(partitions(bench))
    loaded = 0
    for level, size in enumerate(sizes):
        if size > loaded:
            t0 = time.time()
            load_retained(bench, parts, loaded + 1, size, len(parts))
            bench.admin.q("VACUUM ANALYZE idempotency.records")
            log(f"growth: loaded {size - loaded:,} retained keys in {time.time() - t0:.0f}s")
            loaded = size
        jobs = []
        for sync in a.sync:
            for clients in a.clients:
                def fn(sync=sync, clients=clients):
                    # No reset here: the retained keys stay; the claims of earlier runs add a
                    # few tens of thousands of keys, nothing next to the levels measured.
                    bench.admin.q("CHECKPOINT")
                    return run_pgbench("w8_claim.sql", clients, a.duration, sync, {"dup": 0, "dupkeys": DUPKEYS})
                jobs.append(job(f"g_{level}", "new", sync, PG_DURABILITY[sync], clients, "pgbench", fn,
                                extra_label={"n1": human(sizes[1]), "n2": human(sizes[-1])},
                                extra={"retained": size, "partitions": nparts}))
        bench.run_jobs(jobs)


# ---- workload 8b: the number of partitions
def set_partition_count(bench, n):
    """Keeps the current and premade partitions and exactly n - (those) past ones."""
    now_slot = bench.admin.one("SELECT date_bin(%s::interval, now(), timestamptz '2000-01-01 00:00:00+00')", (interval(bench),))
    parts = partitions(bench)
    future = [p for p in parts if p[2] > now_slot]
    past = [p for p in parts if p[2] <= now_slot]
    want_past = max(0, n - len(future))
    for name, _, _ in past[:max(0, len(past) - want_past)]:
        bench.admin.q(f"DROP TABLE idempotency.{name}")
    k = 0
    while len(partitions(bench)) < n and k < 10000:
        k += 1
        bench.admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (interval(bench), k))
    return len(partitions(bench))


def partition_scaling(bench):
    """A key's lookup cannot be pruned to one partition (its created_at is not known), so
    every claim reads every partition: claim latency against the number of partitions, with
    the same ~10k keys, 1 client, synchronous_commit=off (the per-call cost, not the WAL
    flush, is what grows here)."""
    a = bench.args
    if not bench.wanted("p_"):
        return
    log(f"partitions: idem_claim with {a.partition_counts} partitions, 1 client")
    jobs = []
    for level, n in enumerate(a.partition_counts):
        def fn(n=n):
            set_partition_count(bench, n)
            bench.admin.q("SELECT FROM idem_maintenance()")  # seals the past partitions, as the worker would
            reset_tables(bench.admin)
            return run_pgbench("w8_claim.sql", 1, a.duration, "off", {"dup": 0, "dupkeys": DUPKEYS})
        jobs.append(job(f"p_{level}", "new", "off", PG_DURABILITY["off"], 1, "pgbench", fn,
                        extra_label={"n": n}, extra={"partitions": n}))
    bench.run_jobs(jobs)


# ---- workload 10: production shape
def production_shape(bench):
    """Default GUCs, `keys` completed keys spread over the past 7 (then 30) daily partitions, sealed by a
    maintenance round as the worker would; the floor table and the hand-written table hold the same
    number of keys. New keys only, synchronous_commit = on, the largest client count. Tables are not
    reset between runs: the runs add a few tens of thousands of keys to millions. At a week, the SQL
    edition's database gets the same keys the same way (its premake_partitions, then idem_maintenance(),
    which seals the past partitions)."""
    a = bench.args
    keys = a.retained_keys
    clients = max(a.clients)
    for group, prefix, days in (("week", "wk", 7), ("month", "mo", 30)):
        if not any(bench.wanted(w) for w in WORKLOADS if w.startswith(prefix + "_")):
            continue
        log(f"{group}: {keys:,} retained keys over {days} daily partitions")
        t0 = time.time()
        reset_tables(bench.admin)
        if days > 7:
            bench.admin.q("ALTER SYSTEM SET idempotency.retention = '%sd'" % (days + 1))
            bench.admin.q("SELECT pg_reload_conf()")
            time.sleep(0.5)
        parts = past_partitions(bench, days + 1)[:-1]  # the past days, not today's
        load_retained(bench, parts, 1, keys, len(parts))
        # ON CONFLICT: a few of these keys fall into 1..dupkeys, which reset_tables loaded already.
        bench.admin.q("INSERT INTO floor_keys (key) SELECT ((g * 999983) %% 10000000019)::text "
                      "FROM generate_series(1, %s::bigint) g ON CONFLICT DO NOTHING", (keys,))
        bench.admin.q("INSERT INTO idempotency_keys (idempotency_key, status, response_payload) "
                      "SELECT ((g * 999983) %% 10000000019)::text, 'COMPLETED', %s::jsonb "
                      "FROM generate_series(1, %s::bigint) g ON CONFLICT DO NOTHING", (PAYLOAD, keys))
        bench.admin.q("VACUUM ANALYZE floor_keys, idempotency_keys, idempotency.records")
        bench.admin.q("SELECT FROM idem_maintenance()")
        sealed = bench.admin.one("SELECT count(*) FROM idempotency.sealed WHERE blocks > 0")
        nparts = len(partitions(bench))
        log(f"{group}: loaded in {time.time() - t0:.0f}s; {nparts} partitions, {sealed} sealed with filters")
        edition = prefix == "wk" and any(bench.wanted(w) for w in WORKLOADS if w.startswith("wk_e_"))
        if edition:
            t0 = time.time()
            ed = bench.edition_admin
            reset_tables(ed, "reset_edition.sql")
            eparts = past_partitions(bench, days + 1, ed)[:-1]
            load_retained(bench, eparts, 1, keys, len(eparts), ed)
            ed.q("VACUUM ANALYZE business_rows, idempotency.records")
            ed.q("SELECT FROM idem_maintenance()")  # seals the past partitions
            ed.q("SELECT FROM idem_maintenance()")  # writes their key filters (the round after the seal)
            # (autovacuum's within a minute in production: sealed_keys' insert threshold is 1,000 rows)
            ed.q("VACUUM ANALYZE idempotency.sealed_keys")
            esealed = ed.one("SELECT count(*) FROM idempotency.sealed")
            enparts = len(partitions(bench, ed))
            log(f"{group}: SQL edition loaded in {time.time() - t0:.0f}s; {enparts} partitions, {esealed} sealed")
        jobs = []
        # (id, pgbench script, keys per call, in the SQL edition's database), in this order so that the rows a
        # ratio compares run back to back.
        rows = [("w1", "w1_floor.sql", 1, False), ("w2a", "w2a_once.sql", 1, False),
                ("w5a", "w5a_pending_update.sql", 1, False), ("w3", "w3_claim_complete.sql", 1, False)]
        if prefix == "wk":
            rows += [("e_w2a", "w2a_once.sql", 1, True), ("m_w5a", "w5a_min_secdef.sql", 1, False),
                     ("e_w3", "w3_claim_complete.sql", 1, True),
                     ("w5a_biz", "w5a_pending_update_biz.sql", 1, False), ("w2b", "w2b_once_biz.sql", 1, False),
                     ("e_w2b", "w2b_once_biz.sql", 1, True),
                     # Batches of 100 keys beside their hand-written counterparts, and 1000 for the edition's target.
                     ("bf_100", "w12_floor_batch.sql", 100, False), ("bo_100", "w12_once_batch.sql", 100, False),
                     ("e_bo_100", "w12_once_batch.sql", 100, True),
                     ("bh_100", "w12_hand_batch.sql", 100, False), ("bc_100", "w12_claim_complete_batch.sql", 100, False),
                     ("e_bc_100", "w12_claim_complete_batch.sql", 100, True),
                     ("bf_1000", "w12_floor_batch.sql", 1000, False), ("bo_1000", "w12_once_batch.sql", 1000, False),
                     ("e_bo_1000", "w12_once_batch.sql", 1000, True),
                     ("bh_1000", "w12_hand_batch.sql", 1000, False), ("e_bc_1000", "w12_claim_complete_batch.sql", 1000, True)]
        for wid, script, n, on_edition in rows:
            if not bench.wanted(f"{prefix}_{wid}"):
                continue
            admin, db = (bench.edition_admin, EDITION_DB) if on_edition else (bench.admin, "postgres")

            def fn(script=script, n=n, admin=admin, db=db):
                admin.q("CHECKPOINT")
                return run_pgbench(script, clients, a.duration, "on", {"dup": 0, "dupkeys": DUPKEYS, "n": n}, db)
            extra = ({"retained": keys, "partitions": enparts, "sealed": esealed, "edition": True} if on_edition
                     else {"retained": keys, "partitions": nparts, "sealed": sealed})
            jobs.append(job(f"{prefix}_{wid}", "new", "on", PG_DURABILITY["on"], clients, "pgbench", fn,
                            unit_factor=n, extra_label={"n": human(keys)}, extra=extra))
        bench.run_jobs(jobs)
        if days > 7:
            bench.admin.q("ALTER SYSTEM RESET idempotency.retention")
            bench.admin.q("SELECT pg_reload_conf()")


# ---- workload 9: retention
def rel_size(bench):
    return bench.admin.one("""SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                               FROM pg_partition_tree('idempotency.records') WHERE isleaf""")


def measure(bench, sql):
    bench.admin.q("CHECKPOINT")
    lsn0 = bench.admin.one("SELECT pg_current_wal_insert_lsn()")
    t0 = time.perf_counter()
    cur = bench.admin.conn.execute(sql)
    elapsed = time.perf_counter() - t0
    bench.last_rowcount = cur.rowcount
    wal = bench.admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
    return elapsed, int(wal)


def retention(bench):
    if not bench.wanted("ret"):
        return
    n = bench.args.retention_rows
    log(f"retention: one partition of {n:,} keys, dropped vs deleted")
    reset_tables(bench.admin)
    parts = past_partitions(bench, 5)
    oldest, kept = parts[0], parts[1:]
    # Rows that stay: n spread over the four newer partitions.
    load_retained(bench, kept, 20_000_000_001, 20_000_000_000 + n, len(kept))

    def fill_oldest():
        bench.admin.q("SELECT idempotency.premake_partitions(%s)", (oldest[1],))
        load_retained(bench, [oldest], 1, n, 1)
        # An old partition has been vacuumed by autovacuum long before retention reaches it.
        bench.admin.q(f"VACUUM ANALYZE idempotency.{oldest[0]}")
        return rel_size(bench)

    has_drop_fn = bench.admin.one("SELECT to_regprocedure('idempotency.drop_partition(regclass, integer)') IS NOT NULL")
    before = fill_oldest()
    if has_drop_fn:
        how, sql = "idempotency.drop_partition(part, 1000)", f"SELECT idempotency.drop_partition('idempotency.{oldest[0]}'::regclass, 1000)"
    else:
        how, sql = "DROP TABLE partition", f"DROP TABLE idempotency.{oldest[0]}"
    t, wal = measure(bench, sql)
    bench.retention_rows.append({"method": f"drop partition ({how})", "rows": n, "seconds": t, "wal_bytes": wal,
                            "size_before": before, "size_after": rel_size(bench)})
    before = fill_oldest()
    t, wal = measure(bench, f"DELETE FROM idempotency.records WHERE created_at < '{oldest[2].isoformat()}'")
    if bench.last_rowcount != n:
        raise RuntimeError(f"retention: DELETE removed {bench.last_rowcount} rows, expected {n}")
    after_delete = rel_size(bench)
    bench.retention_rows.append({"method": "DELETE ... WHERE created_at < partition end", "rows": n, "seconds": t,
                            "wal_bytes": wal, "size_before": before, "size_after": after_delete})
    tv, walv = measure(bench, f"VACUUM idempotency.{oldest[0]}")
    bench.retention_rows.append({"method": "DELETE, then VACUUM of that partition", "rows": n, "seconds": t + tv,
                            "wal_bytes": wal + walv, "size_before": before, "size_after": rel_size(bench)})
    for r in bench.retention_rows:
        log(f"retention: {r['method']:45s} {r['seconds']:8.3f}s  WAL {r['wal_bytes']:>13,} B  size after {r['size_after']:>13,} B")

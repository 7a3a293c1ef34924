"""The benchmark's workloads: what each row of the table is (WORKLOADS, its group and the group's
reference row), the start state every measured run begins from, and how each workload is run and sampled
(pgbench scripts in benches/sql, the Python driver, redis-benchmark commands; the growth, partition,
production-shape and retention procedures are in retained.py). benches/README.md describes them; runner.py
runs them, report.py tabulates them.
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
    "m_w1": ("dedup", "1 the floor's insert in a minimal SECURITY DEFINER PL/pgSQL function", "tx/s"),
    "w2a": ("dedup", "2a idem_once(key)", "tx/s"),
    "e_w2a": ("dedup", "2a SQL edition: idem_once(key)", "tx/s"),
    "f_w2a": ("dedup", "2a the SQL edition's floor on its storage: its insert alone, minimal SECURITY DEFINER", "tx/s"),
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
    "f_w3": ("message", "3 the SQL edition's floor on its storage: its two writes alone, minimal SECURITY DEFINER", "msg/s"),
    "f2_w3": ("message", "3 the same floor pair without the lease index (HOT completion)", "msg/s"),
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
    "edition": r"^(wk_)?(e_|m_|f_|f2_)?(w1|w2a|w5a|w3|w5a_biz|w2b|bf_100|bo_100|bf_1000|bo_1000|bh_100|bc_100|bh_1000|bc_1000)$",
    # Issue 29's floor: idem_once, claim + complete and idem_once_batch beside the bare insert and the
    # hand-written pair, fresh and at a week of keys.
    "floor29": r"^(wk_)?(w1|w2a|w5a|w3|bf_100|bo_100|bf_1000|bo_1000)$",
}
# In this order, so that the rows a ratio compares run back to back (noise hits them alike).
PGBENCH_SCRIPTS = {
    "w1": "w1_floor.sql", "m_w1": "w1_min_secdef.sql", "w2a": "w2a_once.sql", "w5c": "w5c_plain_insert.sql",
    "w5a_biz": "w5a_pending_update_biz.sql", "w2b": "w2b_once_biz.sql",
    "w5a": "w5a_pending_update.sql", "m_w5a": "w5a_min_secdef.sql", "w5b": "w5b_select_for_update.sql",
    "w3": "w3_claim_complete.sql",
    "w4": "w4_claim_complete_2tx.sql",
}
# The SQL edition's rows: the same pgbench scripts in its database, each run right after the extension's row,
# and (new keys only) its floor on its own storage (issue 32: edition_schema.sql's bench_floor* functions).
EDITION_SCRIPTS = {"w2a": [("e_w2a", "w2a_once.sql"), ("f_w2a", "w2a_floor_edition.sql")],
                   "w2b": [("e_w2b", "w2b_once_biz.sql")],
                   "w3": [("e_w3", "w3_claim_complete.sql"), ("f_w3", "w3_floor_edition.sql"),
                          ("f2_w3", "w3_floor_nolease.sql")]}
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


def updates(admin):
    """(updates, HOT updates) so far of the SQL edition's record partitions and bench_floor_records, as the
    statistics show them once the writing sessions ended."""
    admin.q("SELECT pg_stat_clear_snapshot()")
    return tuple(int(x) for x in admin.conn.execute(
        """SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables
            WHERE (schemaname = 'idempotency' AND relname LIKE 'records%')
               OR (schemaname = 'public' AND relname = 'bench_floor_records')""").fetchone())


def edition_wanted(bench):
    return any(bench.wanted(w) for w in WORKLOADS if w.startswith(("e_", "wk_e_", "f_", "f2_")))


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
            before = updates(admin) if edition else None
            r = run_pgbench(script, clients, a.duration, sync, variables, db)
            if count_records:
                r["rows_after"] = admin.one("SELECT count(*) FROM idempotency.records")
            if edition:
                # How many of the run's updates of records were HOT (f2_w3's completion should be; e_w3's and
                # f_w3's cannot be: the completion takes the row out of the lease index).
                (upd, hot) = [x - y for x, y in zip(updates(admin), before)]
                r["updates"], r["hot_updates"] = upd, hot
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
                for eid, escript in EDITION_SCRIPTS.get(wid, []):
                    if bench.wanted(eid) and not (dup and eid.startswith("f")):
                        fn = pgbench_fn(escript, clients, {"dup": dup, "dupkeys": DUPKEYS}, eid.startswith("e_"), edition=True)
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

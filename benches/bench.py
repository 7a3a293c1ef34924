"""The benchmark of issue 5: the extension against the hand-written patterns it replaces, Redis,
and the bare-insert floor, side by side in one run. Started by benches/run, which has already
started the throwaway PostgreSQL cluster (and stops it, and any Redis left, on exit).

Every figure of the final table comes from this run on this machine; ratios compare rows of the
same group, durability class, client count and key mix (see benches/README.md).
"""
import argparse
import datetime as dt
import glob
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import pgtools  # noqa: E402 - where PostgreSQL is (pg_config)

BENCH = os.path.join(ROOT, "benches")
SQL = os.path.join(BENCH, "sql")
PG_BIN = str(pgtools.pg().bindir)
PGBENCH = os.path.join(PG_BIN, "pgbench")
SO_PATH = str(pgtools.pg().pkglibdir / "idempotency.so")

PORT = os.environ["IDEM_PORT"]
SOCK = os.environ["IDEM_SOCKDIR"]
REDIS_PORT = os.environ.get("IDEM_REDIS_PORT") or str(pgtools.port("bench-redis"))
REDIS_DIR = os.environ.get("IDEM_REDIS_DIR", f"/tmp/idem-redis-{REDIS_PORT}")
REDIS_PIDFILE = os.environ.get("IDEM_REDIS_PIDFILE", f"/tmp/idem-redis-{REDIS_PORT}.pid")
LOGDIR = f"/tmp/idem-bench-logs-{PORT}"

DUPKEYS = 10000  # preloaded keys 1..DUPKEYS; the dup20 variant draws 20% of its keys there
DUP_PCT = 20
PAYLOAD = '{"status":"ok","amount":42}'

# Redis, stated: both configurations keep RDB snapshots off (--save '') so nothing forks mid-run.
REDIS_CONFIGS = {
    "off": ("redis no-persist", ["--save", "", "--appendonly", "no"]),
    "on": ("redis aof=always", ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]),
}
PG_DURABILITY = {"on": "pg sync=on", "off": "pg sync=off"}

# id -> (group, label, unit)
WORKLOADS = {
    "w1": ("dedup", "1 floor: INSERT .. ON CONFLICT DO NOTHING", "tx/s"),
    "w2a": ("dedup", "2a idem_once(key)", "tx/s"),
    "w5c": ("dedup", "5c plain INSERT processed_events", "tx/s"),
    "r_nx_p1": ("dedup", "6 redis SET k v NX EX 30", "req/s"),
    "w5a_biz": ("business", "5a + business row (5 stmts)", "tx/s"),
    "w2b": ("business", "2b idem_once + business row (4 stmts)", "tx/s"),
    "w5a": ("message", "5a INSERT PENDING; UPDATE COMPLETED", "msg/s"),
    "w5b": ("message", "5b SELECT FOR UPDATE; INSERT; UPDATE", "msg/s"),
    "w3": ("message", "3 idem_claim + idem_complete, 1 tx", "msg/s"),
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
    "py_floor": ("pydriver", "1 floor, Python driver", "tx/s"),
    "py_5c": ("pydriver", "5c plain INSERT, Python driver (dup = caught error)", "tx/s"),
    "g_0": ("growth", "8 idem_claim, 0 retained keys (+10k baseline)", "tx/s"),
    "g_1": ("growth", "8 idem_claim, {n1} retained keys", "tx/s"),
    "g_2": ("growth", "8 idem_claim, {n2} retained keys", "tx/s"),
    "p_0": ("partitions", "8b idem_claim, {n} partitions (default)", "tx/s"),
    "p_1": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
    "p_2": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
    "p_3": ("partitions", "8b idem_claim, {n} partitions", "tx/s"),
}
REFERENCE = {
    "dedup": "w1", "business": "w5a_biz", "message": "w5a", "batch": "r_nx_p16",
    "pydriver": "py_floor", "growth": "g_0", "partitions": "p_0",
}
GROUP_ORDER = ["dedup", "business", "message", "batch", "pydriver", "growth", "partitions"]
# In this order, so that the rows a ratio compares run back to back (noise hits them alike).
PGBENCH_SCRIPTS = {
    "w1": "w1_floor.sql", "w2a": "w2a_once.sql", "w5c": "w5c_plain_insert.sql",
    "w5a_biz": "w5a_pending_update_biz.sql", "w2b": "w2b_once_biz.sql",
    "w5a": "w5a_pending_update.sql", "w5b": "w5b_select_for_update.sql", "w3": "w3_claim_complete.sql",
    "w4": "w4_claim_complete_2tx.sql",
}
LUA_PAIR = ("if redis.call('SET', KEYS[1], 'v', 'NX', 'EX', 30) then "
            "redis.call('SET', KEYS[1], 'done', 'EX', 86400) return 1 end return 0")


T_START = time.time()


def log(msg):
    print(f"==> [{time.time() - T_START:5.0f}s] {msg}", file=sys.stderr, flush=True)


def human(n):
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


# ---------------------------------------------------------------- PostgreSQL helpers

def conninfo(user="postgres", sync="on"):
    opts = "" if sync == "on" else " options='-c synchronous_commit=off'"
    return f"host={SOCK} port={PORT} user={user} dbname=postgres{opts}"


class Admin:
    """One superuser connection in autocommit for setup, resets and measurements."""

    def __init__(self):
        self.conn = psycopg.connect(conninfo(), autocommit=True)

    def q(self, sql, args=None):
        cur = self.conn.execute(sql, args)
        return cur.fetchall() if cur.description else None

    def one(self, sql, args=None):
        return self.q(sql, args)[0][0]


def psql_file(path, **variables):
    cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", SOCK, "-p", PORT, "-U", "postgres", "-d", "postgres", "-f", path]
    for k, v in variables.items():
        cmd[1:1] = ["-v", f"{k}={v}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def cpu_busy(interval=0.2):
    """Fraction of the machine's CPU busy over a short interval, sampled while nothing of ours
    runs: anything well above 0 means another workload shares the machine (noise)."""
    def snap():
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        idle = vals[3] + vals[4]
        return idle, sum(vals)
    i0, t0 = snap()
    time.sleep(interval)
    i1, t1 = snap()
    return 0.0 if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


def percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


def reset_tables(admin):
    """benches/sql/reset.sql (what `psql -v dupkeys=N -f` would run), then a CHECKPOINT."""
    with open(os.path.join(SQL, "reset.sql")) as f:
        admin.conn.execute(f.read().replace(":dupkeys", str(DUPKEYS)))
    admin.q("CHECKPOINT")


def run_pgbench(script, clients, duration, sync, variables):
    shutil.rmtree(LOGDIR, ignore_errors=True)
    os.makedirs(LOGDIR)
    env = dict(os.environ)
    env.pop("PGOPTIONS", None)
    if sync == "off":
        env["PGOPTIONS"] = "-c synchronous_commit=off"
    cmd = [PGBENCH, "-h", SOCK, "-p", PORT, "-U", "bench", "-n", "-M", "prepared",
           "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(duration),
           "-l", "--log-prefix", os.path.join(LOGDIR, "tx"), "-f", os.path.join(SQL, script)]
    for k, v in variables.items():
        cmd += ["-D", f"{k}={v}"]
    cmd.append("postgres")
    p = subprocess.run(cmd, env=env, cwd=LOGDIR, capture_output=True, text=True, timeout=duration + 300)
    if p.returncode != 0 or "aborted" in p.stderr:
        raise RuntimeError(f"pgbench {script} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    tps = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", p.stdout).group(1))
    failed = int(re.search(r"number of failed transactions: (\d+)", p.stdout).group(1))
    lat = []
    for path in glob.glob(os.path.join(LOGDIR, "tx.*")):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]))
    lat.sort()
    return {"tps": tps, "transactions": len(lat), "failed": failed,
            "p50_ms": percentile(lat, 0.50) / 1000, "p99_ms": percentile(lat, 0.99) / 1000}


def run_pydriver(workload, clients, duration, sync, dup):
    cmd = [sys.executable, os.path.join(BENCH, "pydriver.py"), "--conninfo", conninfo("bench", sync),
           "--workload", workload, "--clients", str(clients), "--duration", str(duration),
           "--dup", str(dup), "--dupkeys", str(DUPKEYS)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 300)
    if p.returncode != 0:
        raise RuntimeError(f"pydriver {workload} failed:\n{p.stderr}")
    r = json.loads(p.stdout)
    lat = sorted(r["latencies_us"])
    return {"tps": r["transactions"] / r["duration_s"], "transactions": r["transactions"], "failed": 0,
            "duplicate_errors": r["duplicates"],
            "p50_ms": percentile(lat, 0.50) / 1000, "p99_ms": percentile(lat, 0.99) / 1000}


# ---------------------------------------------------------------- Redis helpers

class Redis:
    def __init__(self, cls):
        self.label, self.args = REDIS_CONFIGS[cls]
        shutil.rmtree(REDIS_DIR, ignore_errors=True)
        os.makedirs(REDIS_DIR)
        cmd = ["redis-server", "--port", REDIS_PORT, "--bind", "127.0.0.1", "--dir", REDIS_DIR,
               "--daemonize", "no", "--logfile", os.path.join(REDIS_DIR, "redis.log")] + self.args
        self.cmdline = " ".join(a if a else "''" for a in cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(REDIS_PIDFILE, "w") as f:
            f.write(str(self.proc.pid))
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", REDIS_PORT, "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        info = self.cli("CONFIG", "GET", "appendfsync") + " " + self.cli("CONFIG", "GET", "appendonly") + " " + self.cli("CONFIG", "GET", "save")
        log(f"redis up: {self.cmdline}  [{info.strip()}]")

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", REDIS_PORT] + list(args), capture_output=True, text=True, check=True).stdout.replace("\n", " ")

    def stop(self):
        subprocess.run(["redis-cli", "-p", REDIS_PORT, "shutdown", "nosave"], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(REDIS_PIDFILE):
            os.unlink(REDIS_PIDFILE)
        shutil.rmtree(REDIS_DIR, ignore_errors=True)

    def bench(self, command, clients, pipeline, n, keyspace):
        self.cli("FLUSHALL")
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", REDIS_PORT, "-c", str(clients), "-n", str(n),
               "-r", str(keyspace), "-P", str(pipeline), "--csv"] + command
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        line = p.stdout.strip().splitlines()[-1]
        fields = [x.strip('"') for x in line.split('","')]
        rps, p50, p99 = float(fields[1]), float(fields[4]), float(fields[6])
        return {"tps": rps, "transactions": n, "failed": 0, "p50_ms": p50, "p99_ms": p99}

    def timed_bench(self, command, clients, pipeline, duration, dup):
        """redis-benchmark runs a request count, not a time: a short calibration run sizes it.
        For the dup20 variant the key space is sized so that ~20% of SET NX find the key there
        (n/keyspace = 0.464 gives 1 - (1 - e^-x)/x = 0.20 repeated draws)."""
        n0 = 200 * clients * pipeline
        cal = self.bench(command, clients, pipeline, n0, 2_000_000_000)
        n = max(n0, int(cal["tps"] * duration))
        keyspace = max(1, int(n / 0.464)) if dup else 2_000_000_000
        r = self.bench(command, clients, pipeline, n, keyspace)
        r["requests"] = n
        r["keyspace"] = keyspace
        return r


# ---------------------------------------------------------------- the run

class Job:
    """One row of the table: how to take one sample of it, and what it is."""

    def __init__(self, wid, keys, cls, durability, clients, tool, fn, unit_factor=1, extra_label=None, extra=None):
        self.wid, self.keys, self.cls, self.durability, self.clients = wid, keys, cls, durability, clients
        self.tool, self.fn, self.unit_factor = tool, fn, unit_factor
        self.extra_label, self.extra = extra_label or {}, extra or {}
        self.samples = []

    @property
    def label(self):
        return WORKLOADS[self.wid][1].format(**self.extra_label)


class Bench:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.retention_rows = []
        self.admin = Admin()
        self.noisy = 0
        self.redis_cmdlines = {}

    # ---- sampling: every row is measured in `--rounds` separate runs, spread over the whole
    # benchmark (round 1 of every row, then round 2, ...), and the table shows the run with the
    # median throughput: a burst of other work on the machine spoils one run of a row, not the row.
    def wanted(self, wid):
        return self.args.only is None or re.search(self.args.only, wid)

    def quiet(self):
        """Before a run: wait (up to --max-wait seconds) for other work on the machine to calm
        down, and return how busy it was when the run started."""
        deadline = time.time() + self.args.max_wait
        busy = cpu_busy()
        while busy > 0.25 and time.time() < deadline:
            time.sleep(1)
            busy = cpu_busy()
        return busy

    def sample(self, job, rnd):
        busy = self.quiet()
        r = job.fn()
        r["busy"] = busy
        job.samples.append(r)
        log(f"round {rnd + 1}/{self.args.rounds}  {job.label:52s} {job.keys:5s} {job.durability:16s} c={job.clients:<2d} "
            f"{r['tps'] * job.unit_factor:11,.0f} {WORKLOADS[job.wid][2]:6s} p50={r['p50_ms']:.3f}ms"
            + (f"  (machine {busy:.0%} busy before)" if busy > 0.25 else ""))

    def finish(self, job):
        """The row of a job: its median run (by throughput)."""
        if not job.samples:
            return None
        ordered = sorted(job.samples, key=lambda s: s["tps"])
        med = ordered[(len(ordered) - 1) // 2]
        if med["busy"] > 0.25:
            self.noisy += 1
        group, label, unit = WORKLOADS[job.wid]
        row = {"id": job.wid, "group": group, "workload": job.label, "keys": job.keys, "class": job.cls,
               "durability": job.durability, "clients": job.clients, "throughput": med["tps"] * job.unit_factor,
               "unit": unit, "p50_ms": med["p50_ms"], "p99_ms": med["p99_ms"], "tool": job.tool,
               "calls_per_s": med["tps"], "cpu_busy_before": med["busy"],
               "runs_throughput": [s["tps"] * job.unit_factor for s in job.samples],
               "runs_cpu_busy_before": [s["busy"] for s in job.samples]}
        for k in ("transactions", "failed", "duplicate_errors", "requests", "keyspace", "rows_after"):
            if k in med:
                row[k] = med[k]
        row.update(job.extra)
        self.rows.append(row)
        return row

    def run_jobs(self, jobs):
        for rnd in range(self.args.rounds):
            for job in jobs:
                self.sample(job, rnd)
        return [self.finish(j) for j in jobs]

    # ---- PostgreSQL workloads 1-5, 7 and the Python-driver rows
    def pg_jobs(self, sync):
        a = self.args
        dur = PG_DURABILITY[sync]
        jobs = []

        def pgbench_fn(script, clients, variables, count_records=False):
            def fn():
                reset_tables(self.admin)
                r = run_pgbench(script, clients, a.duration, sync, variables)
                if count_records:
                    r["rows_after"] = self.admin.one("SELECT count(*) FROM idempotency.records")
                return r
            return fn

        def pydriver_fn(workload, clients, dup):
            def fn():
                reset_tables(self.admin)
                return run_pydriver(workload, clients, a.duration, sync, dup)
            return fn

        for clients in a.clients:
            top = clients == max(a.clients)
            for keys in (["new", "dup20"] if top else ["new"]):
                dup = DUP_PCT if keys == "dup20" else 0
                for wid, script in PGBENCH_SCRIPTS.items():
                    if not self.wanted(wid) or (wid == "w5c" and dup):
                        continue  # 5c with duplicates: pgbench aborts on the error; see the pydriver rows
                    fn = pgbench_fn(script, clients, {"dup": dup, "dupkeys": DUPKEYS}, wid in ("w2a", "w2b", "w3", "w4"))
                    jobs.append(Job(wid, keys, sync, dur, clients, "pgbench", fn))
                if not top:
                    continue
                for kind in ("once", "claim"):
                    for n in (10, 100, 1000):
                        wid = f"b_{kind}_{n}"
                        if not self.wanted(wid) or (a.quick and (n == 100 or (dup and n == 10))):
                            continue  # --quick: fewer sizes, to stay under 5 minutes
                        fn = pgbench_fn(f"w7_{kind}_batch.sql", clients, {"dup": dup, "dupkeys": DUPKEYS, "n": n})
                        jobs.append(Job(wid, keys, sync, dur, clients, "pgbench", fn, unit_factor=n))
                for wid, w in (("py_floor", "floor"), ("py_5c", "plain_insert")):
                    if not self.wanted(wid) or (a.quick and dup and wid == "py_floor"):
                        continue
                    jobs.append(Job(wid, keys, sync, dur, clients, "pydriver", pydriver_fn(w, clients, dup)))
        return jobs

    # ---- Redis, workload 6
    REDIS_COMMANDS = {
        "nx": ["SET", "idem:__rand_int__", "v", "NX", "EX", "30"],
        "done": ["SET", "idem:__rand_int__", "done", "EX", "86400"],
        "lua": ["EVAL", LUA_PAIR, "1", "idem:__rand_int__"],
    }

    def redis_jobs(self, cls, holder):
        """Jobs for one Redis configuration; holder[0] is the running server."""
        a = self.args
        jobs = []
        if not any(self.wanted(w) for w in WORKLOADS if w.startswith("r_")):
            return jobs
        label = REDIS_CONFIGS[cls][0]
        for clients in a.clients:
            for keys in (["new", "dup20"] if clients == max(a.clients) else ["new"]):
                dup = keys == "dup20"
                for p in (1, 16):
                    for name, command in self.REDIS_COMMANDS.items():
                        if name == "done" and dup:
                            continue  # overwriting a key costs the same whether it repeats or not
                        def fn(command=command, clients=clients, p=p, dup=dup):
                            return holder[0].timed_bench(command, clients, p, a.duration, dup)
                        jobs.append(Job(f"r_{name}_p{p}", keys, cls, label, clients, "redis-benchmark", fn))
        return jobs

    def derive_redis_pairs(self):
        """A message is SET NX then (for a new key) SET done, one after the other on the same
        connection, so per client the two latencies add up and the closed-loop rate is
        1 / (1/rps_nx + share_new/rps_done); p50/p99 are the sums of the two rows' (medians)."""
        idx = {(r["id"], r["class"], r["clients"], r["keys"]): r for r in self.rows}
        for r in list(self.rows):
            if r["tool"] != "redis-benchmark" or not r["id"].startswith("r_nx_"):
                continue
            p = r["id"].split("_")[-1]
            done = idx.get((f"r_done_{p}", r["class"], r["clients"], "new"))
            if not done:
                continue
            share_new = 1 - DUP_PCT / 100 if r["keys"] == "dup20" else 1.0
            rate = 1 / (1 / r["throughput"] + share_new / done["throughput"])
            group, label, unit = WORKLOADS[f"r_pair_{p}"]
            self.rows.append({"id": f"r_pair_{p}", "group": group, "workload": label, "keys": r["keys"],
                              "class": r["class"], "durability": r["durability"], "clients": r["clients"],
                              "throughput": rate, "unit": unit, "p50_ms": r["p50_ms"] + done["p50_ms"],
                              "p99_ms": r["p99_ms"] + done["p99_ms"], "tool": "derived", "calls_per_s": rate,
                              "cpu_busy_before": max(r["cpu_busy_before"], done["cpu_busy_before"])})

    def main_matrix(self):
        """Rows 1-7: every round runs each PostgreSQL row once per synchronous_commit setting, then
        each Redis row once per configuration (the server restarted fresh for each)."""
        pg = {sync: self.pg_jobs(sync) for sync in self.args.sync}
        holder = [None]
        rd = {} if self.args.skip_redis else {cls: self.redis_jobs(cls, holder) for cls in self.args.sync}
        for rnd in range(self.args.rounds):
            for sync in self.args.sync:
                log(f"round {rnd + 1}/{self.args.rounds}: PostgreSQL, synchronous_commit={sync}")
                for job in pg[sync]:
                    self.sample(job, rnd)
            for cls, jobs in rd.items():
                if not jobs:
                    continue
                holder[0] = Redis(cls)
                self.redis_cmdlines[cls] = holder[0].cmdline
                try:
                    for job in jobs:
                        self.sample(job, rnd)
                finally:
                    holder[0].stop()
        for jobs in list(pg.values()) + list(rd.values()):
            for job in jobs:
                self.finish(job)
        self.derive_redis_pairs()

    # ---- workload 8: growth
    def partitions(self):
        rows = self.admin.q("""
            SELECT c.relname, m[1]::timestamptz, m[2]::timestamptz
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
                   regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') m
             WHERE i.inhparent = 'idempotency.records'::regclass ORDER BY 2""")
        return rows

    def interval(self):
        return self.admin.one("SELECT coalesce(current_setting('idempotency.partition_interval', true), '1d')")

    def past_partitions(self, count):
        """The `count` partitions ending with the current one (created for past days if needed)."""
        self.admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (self.interval(), count - 1))
        now = self.admin.one("SELECT now()")
        parts = [p for p in self.partitions() if p[1] <= now]
        return parts[-count:]

    def load_retained(self, parts, first, last, spread):
        """Keys first..last (a permutation of 1..10^10, so they interleave with the benchmark's
        keys in the index), completed, created_at spread evenly over the given partitions."""
        values = ", ".join(f"({i}, '{lo.isoformat()}'::timestamptz, least('{hi.isoformat()}'::timestamptz, now()))"
                           for i, (_, lo, hi) in enumerate(parts))
        self.admin.q(f"""
            INSERT INTO idempotency.records (scope, key, status, attempts, payload, created_at, updated_at)
            SELECT 'default', ((g * 999983) %% 10000000019)::text, 'completed', 1, %s::jsonb,
                   p.lo + (p.hi - p.lo) * ((g %% 9973) / 9973.0), now()
              FROM generate_series(%s::bigint, %s::bigint) g
              JOIN (VALUES {values}) p(i, lo, hi) ON p.i = g %% {spread}""", (PAYLOAD, first, last))

    def growth(self):
        a = self.args
        if not self.wanted("g_"):
            return
        sizes = a.growth_sizes
        log(f"growth: retained keys {sizes} over the current and past partitions")
        reset_tables(self.admin)
        parts = self.past_partitions(5)
        nparts = len(self.partitions())
        loaded = 0
        for level, size in enumerate(sizes):
            if size > loaded:
                t0 = time.time()
                self.load_retained(parts, loaded + 1, size, len(parts))
                self.admin.q("VACUUM ANALYZE idempotency.records")
                log(f"growth: loaded {size - loaded:,} retained keys in {time.time() - t0:.0f}s")
                loaded = size
            jobs = []
            for sync in a.sync:
                for clients in a.clients:
                    def fn(sync=sync, clients=clients):
                        # No reset here: the retained keys stay; the claims of earlier runs add a
                        # few tens of thousands of keys, nothing next to the levels measured.
                        self.admin.q("CHECKPOINT")
                        return run_pgbench("w8_claim.sql", clients, a.duration, sync, {"dup": 0, "dupkeys": DUPKEYS})
                    jobs.append(Job(f"g_{level}", "new", sync, PG_DURABILITY[sync], clients, "pgbench", fn,
                                    extra_label={"n1": human(sizes[1]), "n2": human(sizes[-1])},
                                    extra={"retained": size, "partitions": nparts}))
            self.run_jobs(jobs)

    # ---- workload 8b: the number of partitions
    def set_partition_count(self, n):
        """Keeps the current and premade partitions and exactly n - (those) past ones."""
        now_slot = self.admin.one("SELECT date_bin(%s::interval, now(), timestamptz '2000-01-01 00:00:00+00')", (self.interval(),))
        parts = self.partitions()
        future = [p for p in parts if p[2] > now_slot]
        past = [p for p in parts if p[2] <= now_slot]
        want_past = max(0, n - len(future))
        for name, _, _ in past[:max(0, len(past) - want_past)]:
            self.admin.q(f"DROP TABLE idempotency.{name}")
        k = 0
        while len(self.partitions()) < n and k < 10000:
            k += 1
            self.admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (self.interval(), k))
        return len(self.partitions())

    def partition_scaling(self):
        """A key's lookup cannot be pruned to one partition (its created_at is not known), so
        every claim reads every partition: claim latency against the number of partitions, with
        the same ~10k keys, 1 client, synchronous_commit=off (the per-call cost, not the WAL
        flush, is what grows here)."""
        a = self.args
        if not self.wanted("p_"):
            return
        log(f"partitions: idem_claim with {a.partition_counts} partitions, 1 client")
        jobs = []
        for level, n in enumerate(a.partition_counts):
            def fn(n=n):
                self.set_partition_count(n)
                reset_tables(self.admin)
                return run_pgbench("w8_claim.sql", 1, a.duration, "off", {"dup": 0, "dupkeys": DUPKEYS})
            jobs.append(Job(f"p_{level}", "new", "off", PG_DURABILITY["off"], 1, "pgbench", fn,
                            extra_label={"n": n}, extra={"partitions": n}))
        self.run_jobs(jobs)

    # ---- workload 9: retention
    def rel_size(self):
        return self.admin.one("""SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                                   FROM pg_partition_tree('idempotency.records') WHERE isleaf""")

    def measure(self, sql):
        self.admin.q("CHECKPOINT")
        lsn0 = self.admin.one("SELECT pg_current_wal_insert_lsn()")
        t0 = time.perf_counter()
        cur = self.admin.conn.execute(sql)
        elapsed = time.perf_counter() - t0
        self.last_rowcount = cur.rowcount
        wal = self.admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
        return elapsed, int(wal)

    def retention(self):
        if not self.wanted("ret"):
            return
        n = self.args.retention_rows
        log(f"retention: one partition of {n:,} keys, dropped vs deleted")
        reset_tables(self.admin)
        parts = self.past_partitions(5)
        oldest, kept = parts[0], parts[1:]
        # Rows that stay: n spread over the four newer partitions.
        self.load_retained(kept, 20_000_000_001, 20_000_000_000 + n, len(kept))

        def fill_oldest():
            self.admin.q("SELECT idempotency.premake_partitions(%s)", (oldest[1],))
            self.load_retained([oldest], 1, n, 1)
            # An old partition has been vacuumed by autovacuum long before retention reaches it.
            self.admin.q(f"VACUUM ANALYZE idempotency.{oldest[0]}")
            return self.rel_size()

        has_drop_fn = self.admin.one("SELECT to_regprocedure('idempotency.drop_partition(regclass, integer)') IS NOT NULL")
        before = fill_oldest()
        if has_drop_fn:
            how, sql = "idempotency.drop_partition(part, 1000)", f"SELECT idempotency.drop_partition('idempotency.{oldest[0]}'::regclass, 1000)"
        else:
            how, sql = "DROP TABLE partition", f"DROP TABLE idempotency.{oldest[0]}"
        t, wal = self.measure(sql)
        self.retention_rows.append({"method": f"drop partition ({how})", "rows": n, "seconds": t, "wal_bytes": wal,
                               "size_before": before, "size_after": self.rel_size()})
        before = fill_oldest()
        t, wal = self.measure(f"DELETE FROM idempotency.records WHERE created_at < '{oldest[2].isoformat()}'")
        if self.last_rowcount != n:
            raise RuntimeError(f"retention: DELETE removed {self.last_rowcount} rows, expected {n}")
        after_delete = self.rel_size()
        self.retention_rows.append({"method": "DELETE ... WHERE created_at < partition end", "rows": n, "seconds": t,
                               "wal_bytes": wal, "size_before": before, "size_after": after_delete})
        tv, walv = self.measure(f"VACUUM idempotency.{oldest[0]}")
        self.retention_rows.append({"method": "DELETE, then VACUUM of that partition", "rows": n, "seconds": t + tv,
                               "wal_bytes": wal + walv, "size_before": before, "size_after": self.rel_size()})
        for r in self.retention_rows:
            log(f"retention: {r['method']:45s} {r['seconds']:8.3f}s  WAL {r['wal_bytes']:>13,} B  size after {r['size_after']:>13,} B")

    # ---- ratios, targets, output
    def ratios(self):
        index = {}
        for r in self.rows:
            index[(r["id"], r["class"], r["clients"], r["keys"])] = r
        for r in self.rows:
            ref_id = REFERENCE.get(r["group"])
            ref = index.get((ref_id, r["class"], r["clients"], r["keys"])) if ref_id else None
            r["reference"] = ref_id if ref else None
            r["ratio"] = r["throughput"] / ref["throughput"] if ref else None

    def targets(self):
        idx = {(r["id"], r["class"], r["clients"], r["keys"]): r for r in self.rows}
        top = max(self.args.clients)
        out = []

        def ratio(a, b, cls, clients=top, metric="throughput"):
            ra, rb = idx.get((a, cls, clients, "new")), idx.get((b, cls, clients, "new"))
            if not ra or not rb:
                return None
            return ra[metric] / rb[metric]

        def add(name, goal, value, ok_if, how):
            met = None if value is None else ok_if(value)
            out.append({"target": name, "goal": goal, "measured": value, "met": met, "how": how})

        for cls in ("on", "off"):
            lab = PG_DURABILITY[cls]
            add(f"idem_once alone >= 0.9x floor ({lab})", ">= 0.90", ratio("w2a", "w1", cls), lambda v: v >= 0.9,
                f"throughput w2a / w1, new keys, {top} clients")
            add(f"idem_once + business row >= 1.25x 5a + business row ({lab})", ">= 1.25", ratio("w2b", "w5a_biz", cls),
                lambda v: v >= 1.25, f"throughput w2b / w5a_biz, new keys, {top} clients")
            add(f"claim + complete (1 tx) >= 1.0x 5a ({lab})", ">= 1.00", ratio("w3", "w5a", cls), lambda v: v >= 1.0,
                f"throughput w3 / w5a, new keys, {top} clients")
            add(f"claim + complete (1 tx) >= 1.2x 5b ({lab})", ">= 1.20", ratio("w3", "w5b", cls), lambda v: v >= 1.2,
                f"throughput w3 / w5b, new keys, {top} clients")
            add(f"idem_once_batch(1000) keys/s >= pipelined redis SET NX ({lab} vs {REDIS_CONFIGS[cls][0]})", ">= 1.00",
                ratio("b_once_1000", "r_nx_p16", cls), lambda v: v >= 1.0, f"keys/s, new keys, {top} clients, pipeline 16")
        for cls in ("on", "off"):
            for clients in self.args.clients:
                add(f"claim latency at {human(self.args.growth_sizes[-1])} retained keys within 1.2x of empty ({PG_DURABILITY[cls]}, {clients} clients)",
                    "<= 1.20", ratio("g_2", "g_0", cls, clients, "p50_ms"), lambda v: v <= 1.2, "p50 latency g_2 / g_0")
        drop = next((r for r in self.retention_rows if r["method"].startswith("drop")), None)
        delete = next((r for r in self.retention_rows if r["method"].startswith("DELETE ...")), None)
        if drop and delete:
            add("retention: partition drop >= 100x less WAL than DELETE", ">= 100", delete["wal_bytes"] / max(1, drop["wal_bytes"]),
                lambda v: v >= 100, f"WAL bytes of DELETE / of drop, {drop['rows']:,} keys")
        return out

    def meta(self):
        def sh(cmd):
            try:
                return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
            except Exception:
                return ""
        with open(SO_PATH, "rb") as f:
            so_hash = hashlib.sha256(f.read()).hexdigest()
        return {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "benches/run" + (" --quick" if self.args.quick else "") + (f" {' '.join(self.args.passthrough)}" if self.args.passthrough else ""),
            "mode": "quick" if self.args.quick else "full",
            "duration_s": self.args.duration,
            "rounds": self.args.rounds,
            "clients": self.args.clients,
            "cpu": sh("lscpu | sed -n 's/^Model name: *//p'") + f", {os.cpu_count()} vCPU",
            "memory": sh("free -h | awk '/^Mem:/ {print $2}'"),
            "kernel": platform.release(),
            "virtualization": sh("lscpu | sed -n 's/^Hypervisor vendor: *//p'"),
            "postgres": self.admin.one("SELECT version()"),
            "postgres_settings": {k: self.admin.one(f"SHOW {k}") for k in (
                "shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_level", "fsync", "wal_sync_method",
                "max_connections", "max_locks_per_transaction", "shared_preload_libraries")},
            "extension_version": self.admin.one("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
            "extension_so_sha256": so_hash,
            "git_commit": sh(f"git -C {ROOT} rev-parse --short HEAD"),
            "git_worktree_dirty": bool(sh(f"git -C {ROOT} status --porcelain -- src sql Cargo.toml")),
            "redis": sh("redis-server --version"),
            "redis_command_lines": getattr(self, "redis_cmdlines", {}),
            "pgbench": "pgbench -n -M prepared -c C -j min(C,2) -T duration -l; latency from the per-transaction logs",
            "runs_with_busy_machine": self.noisy,
        }

    def output(self, meta, targets):
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        cls_order = {"on": 0, "off": 1}
        wid_order = {w: i for i, w in enumerate(WORKLOADS)}
        rows = [r for r in self.rows if r["group"] != "inputs"]
        rows.sort(key=lambda r: (cls_order[r["class"]], order[r["group"]], r["clients"], r["keys"] != "new", wid_order[r["id"]]))
        head = ["group", "workload", "keys", "durability", "clients", "throughput", "unit", "p50 ms", "p99 ms", "ratio", "vs"]
        table = []
        for r in rows:
            table.append([r["group"], r["workload"], r["keys"], r["durability"], str(r["clients"]),
                          f"{r['throughput']:,.0f}", r["unit"], f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
                          "" if r["ratio"] is None else f"{r['ratio']:.2f}", r["reference"] or ""])
        widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(head)]
        right = {4, 5, 7, 8, 9}

        def fmt(cells):
            return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        print()
        print(fmt(head))
        print("  ".join("-" * w for w in widths))
        prev = None
        for r, t in zip(rows, table):
            if prev is not None and (r["class"], r["group"]) != prev:
                print()
            prev = (r["class"], r["group"])
            print(fmt(t))
        if self.retention_rows:
            print("\nretention (workload 9), synchronous_commit=on:")
            for r in self.retention_rows:
                print(f"  {r['method']:50s} {r['seconds']:9.3f} s  WAL {r['wal_bytes']:>14,} B  size {r['size_before']:>13,} -> {r['size_after']:>13,} B")
        print("\ntargets of issue 5:")
        for t in targets:
            v = "n/a" if t["measured"] is None else f"{t['measured']:.3f}"
            verdict = {True: "MET", False: "MISSED", None: "not measured"}[t["met"]]
            print(f"  {verdict:12s} {t['target']}: {v} (goal {t['goal']}; {t['how']})")
        if meta["runs_with_busy_machine"]:
            print(f"\nWARNING: for {meta['runs_with_busy_machine']} rows the median run started while other work kept the machine >25% busy: noisy.")

        os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
        name = self.args.name or meta["mode"]
        base = os.path.join(BENCH, "results", name)
        with open(base + ".json.tmp", "w") as f:
            json.dump({"meta": meta, "rows": self.rows, "retention": self.retention_rows, "targets": targets}, f, indent=1, default=str)
        os.replace(base + ".json.tmp", base + ".json")
        md = [f"# Benchmark results ({meta['mode']} run)", "",
              f"* command: `{meta['command']}` (every row: median of {meta['rounds']} runs of {meta['duration_s']} s, spread over the benchmark; clients {', '.join(map(str, meta['clients']))})",
              f"* date: {meta['date']}",
              f"* machine: {meta['cpu']}, {meta['memory']} RAM, {meta['virtualization'] or 'bare metal'} VM, Linux {meta['kernel']}",
              f"* {meta['postgres']}",
              f"* PostgreSQL settings: " + ", ".join(f"{k}={v}" for k, v in meta["postgres_settings"].items()),
              f"* extension {meta['extension_version']}, git {meta['git_commit']}" + (" (with uncommitted changes in src/ or sql/)" if meta["git_worktree_dirty"] else "") + f", idempotency.so sha256 {meta['extension_so_sha256'][:16]}",
              f"* {meta['redis']}"]
        for cls, line in meta["redis_command_lines"].items():
            md.append(f"* redis ({REDIS_CONFIGS[cls][0]}): `{line}`")
        if meta["runs_with_busy_machine"]:
            md.append(f"* WARNING: for {meta['runs_with_busy_machine']} rows the median run started while other work kept the machine >25% busy (noisy)")
        md += ["", "| " + " | ".join(head) + " |", "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
        for t in table:
            md.append("| " + " | ".join(c.replace("|", "\\|") for c in t) + " |")
        if self.retention_rows:
            md += ["", "## Retention (workload 9), synchronous_commit=on", "",
                   "| method | keys | time s | WAL bytes | size before | size after |", "|---|---:|---:|---:|---:|---:|"]
            for r in self.retention_rows:
                md.append(f"| {r['method']} | {r['rows']:,} | {r['seconds']:.3f} | {r['wal_bytes']:,} | {r['size_before']:,} | {r['size_after']:,} |")
        md += ["", "## Targets of issue 5", "", "| target | goal | measured | verdict | how |", "|---|---|---:|---|---|"]
        for t in targets:
            v = "n/a" if t["measured"] is None else f"{t['measured']:.3f}"
            md.append(f"| {t['target']} | {t['goal']} | {v} | {({True: 'met', False: 'MISSED', None: 'not measured'})[t['met']]} | {t['how']} |")
        with open(base + ".md.tmp", "w") as f:
            f.write("\n".join(md) + "\n")
        os.replace(base + ".md.tmp", base + ".md")
        log(f"wrote {base}.md and {base}.json")

    def run(self):
        a = self.args
        t0 = time.time()
        so_before = hashlib.sha256(open(SO_PATH, "rb").read()).hexdigest()
        psql_file(os.path.join(SQL, "schema.sql"))
        self.main_matrix()
        if not a.skip_growth:
            self.growth()
        if not a.skip_retention:
            self.retention()
        if not a.skip_growth:
            self.partition_scaling()
        self.ratios()
        meta = self.meta()
        meta["elapsed_s"] = round(time.time() - t0)
        if meta["extension_so_sha256"] != so_before:
            meta["warning"] = "idempotency.so changed on disk during the run"
            log("WARNING: idempotency.so changed on disk during the run")
        self.output(meta, self.targets())
        log(f"done in {meta['elapsed_s']}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a few seconds per workload, scaled-down growth and retention (CI)")
    ap.add_argument("--duration", type=int, help="seconds per measured run (default 2)")
    ap.add_argument("--rounds", type=int, help="runs per row, the median is reported (default 3; quick 1)")
    ap.add_argument("--clients", help="client counts, comma-separated (default 8; quick 4); the dup20 variants and batches run at the largest")
    ap.add_argument("--sync", default="on,off", help="synchronous_commit settings to run (default on,off)")
    ap.add_argument("--only", help="regex on workload ids (w1, w2a, ..., r_nx_p16, b_once_1000, g_, ret)")
    ap.add_argument("--growth-sizes", help="retained keys for workload 8 (default 0,1000000,10000000; quick 0,100000,1000000)")
    ap.add_argument("--retention-rows", type=int, help="keys in the dropped partition (default 1000000; quick 100000)")
    ap.add_argument("--skip-redis", action="store_true")
    ap.add_argument("--skip-growth", action="store_true")
    ap.add_argument("--skip-retention", action="store_true")
    ap.add_argument("--name", help="results file name under benches/results/ (default: full or quick)")
    ap.add_argument("--max-wait", type=float, help="seconds to wait before a run for a busy machine to calm down (default 0)")
    args = ap.parse_args()
    args.passthrough = [x for x in sys.argv[1:] if x != "--quick"]
    args.duration = args.duration or 2
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.clients = [int(c) for c in (args.clients or ("4" if args.quick else "8")).split(",")]
    args.sync = args.sync.split(",")
    args.growth_sizes = [int(x) for x in (args.growth_sizes or ("0,100000,1000000" if args.quick else "0,1000000,10000000")).split(",")]
    if len(args.growth_sizes) != 3:
        ap.error("--growth-sizes takes three sizes")
    args.retention_rows = args.retention_rows or (100_000 if args.quick else 1_000_000)
    args.partition_counts = [5, 17] if args.quick else [5, 9, 17, 33]
    if args.max_wait is None:
        args.max_wait = 0
    Bench(args).run()


if __name__ == "__main__":
    main()

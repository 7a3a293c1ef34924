"""The benchmark's machinery: the cluster benches/run started, pgbench, the Python driver, redis-server and
redis-benchmark, and the sampling of every row in separate runs spread over the whole benchmark.

It knows nothing of the workloads themselves (workloads.py) or of the tables (report.py).
"""
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
import pgtools  # noqa: E402 - where PostgreSQL is (pg_config), the ports

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


T_START = time.time()


def log(msg):
    print(f"==> [{time.time() - T_START:5.0f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- PostgreSQL helpers

def conninfo(user="postgres", sync="on", dbname="postgres"):
    opts = "" if sync == "on" else " options='-c synchronous_commit=off'"
    return f"host={SOCK} port={PORT} user={user} dbname={dbname}{opts}"


class Admin:
    """One superuser connection in autocommit for setup, resets and measurements (to the database
    postgres, where the native extension is, or to another one: the SQL edition's)."""

    def __init__(self, dbname="postgres"):
        self.conn = psycopg.connect(conninfo(dbname=dbname), autocommit=True)

    def q(self, sql, args=None):
        cur = self.conn.execute(sql, args)
        return cur.fetchall() if cur.description else None

    def one(self, sql, args=None):
        return self.q(sql, args)[0][0]


def psql_file(path, user="postgres", dbname="postgres", **variables):
    cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", SOCK, "-p", PORT, "-U", user, "-d", dbname, "-f", path]
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


def so_sha256():
    with open(SO_PATH, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_pgbench(script, clients, duration, sync, variables, dbname="postgres"):
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
    cmd.append(dbname)
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


def run_pydriver(workload, clients, duration, sync, dup, dupkeys):
    cmd = [sys.executable, os.path.join(BENCH, "pydriver.py"), "--conninfo", conninfo("bench", sync),
           "--workload", workload, "--clients", str(clients), "--duration", str(duration),
           "--dup", str(dup), "--dupkeys", str(dupkeys)]
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
    """A fresh redis-server on loopback with the given persistence arguments, and redis-benchmark runs."""

    def __init__(self, label, args):
        self.label, self.args = label, args
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


# ---------------------------------------------------------------- sampling

class Job:
    """One row of the table: how to take one sample of it, and what it is. `spec` is the workload's
    (group, label, unit); the label may have {fields} filled from extra_label."""

    def __init__(self, wid, spec, keys, cls, durability, clients, tool, fn, unit_factor=1, extra_label=None,
                 extra=None):
        self.wid, self.keys, self.cls, self.durability, self.clients = wid, keys, cls, durability, clients
        self.group, self._label, self.unit = spec
        self.tool, self.fn, self.unit_factor = tool, fn, unit_factor
        self.extra_label, self.extra = extra_label or {}, extra or {}
        self.samples = []

    @property
    def label(self):
        return self._label.format(**self.extra_label)


class Bench:
    """The state of one benchmark run: its arguments, the superuser connection, the rows measured so far."""

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
            f"{r['tps'] * job.unit_factor:11,.0f} {job.unit:6s} p50={r['p50_ms']:.3f}ms"
            + (f"  (machine {busy:.0%} busy before)" if busy > 0.25 else ""))

    def finish(self, job):
        """The row of a job: its median run (by throughput)."""
        if not job.samples:
            return None
        ordered = sorted(job.samples, key=lambda s: s["tps"])
        med = ordered[(len(ordered) - 1) // 2]
        if med["busy"] > 0.25:
            self.noisy += 1
        row = {"id": job.wid, "group": job.group, "workload": job.label, "keys": job.keys, "class": job.cls,
               "durability": job.durability, "clients": job.clients, "throughput": med["tps"] * job.unit_factor,
               "unit": job.unit, "p50_ms": med["p50_ms"], "p99_ms": med["p99_ms"], "tool": job.tool,
               "calls_per_s": med["tps"], "cpu_busy_before": med["busy"],
               "runs_throughput": [s["tps"] * job.unit_factor for s in job.samples],
               "runs_cpu_busy_before": [s["busy"] for s in job.samples]}
        for k in ("transactions", "failed", "duplicate_errors", "requests", "keyspace", "rows_after", "updates", "hot_updates"):
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

    # ---- what the run was made on
    def meta(self):
        def sh(cmd):
            try:
                return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
            except Exception:
                return ""
        so_hash = so_sha256()
        return {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "benches/run" + (f" --pg {os.environ['IDEM_BENCH_PG']}" if os.environ.get("IDEM_BENCH_PG") else "")
                       + (" --quick" if self.args.quick else "") + (f" {' '.join(self.args.passthrough)}" if self.args.passthrough else ""),
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
            "edition_version": getattr(self, "edition_version", None),
            "edition_database": getattr(self, "edition_database", None),
            "extension_so_sha256": so_hash,
            "git_commit": sh(f"git -C {ROOT} rev-parse --short HEAD"),
            "git_worktree_dirty": bool(sh(f"git -C {ROOT} status --porcelain -- src sql Cargo.toml")),
            "redis": sh("redis-server --version"),
            "redis_command_lines": getattr(self, "redis_cmdlines", {}),
            "pgbench": "pgbench -n -M prepared -c C -j min(C,2) -T duration -l; latency from the per-transaction logs",
            "runs_with_busy_machine": self.noisy,
        }

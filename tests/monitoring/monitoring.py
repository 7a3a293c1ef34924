#!/usr/bin/env python3
"""The monitoring/ folder against the real exporters: a cluster, a known workload, Debian's
prometheus-postgres-exporter and prometheus-sql-exporter with monitoring/'s files, a real Prometheus with
monitoring/prometheus/prometheus.example.yml and the alert rules, and promtool. Started by
tests/monitoring/run (see monitoring/README.md).

Everything runs on 127.0.0.1, on the range "monitoring" of tests/ports:
    +0 PostgreSQL   +1 prometheus-postgres-exporter   +2 prometheus-sql-exporter   +3 Prometheus
The exporters and Prometheus run as the `prometheus` OS user (that Debian's prometheus package creates;
`nobody` when it does not exist), with their files under RUN_DIR; all are stopped at the end, also on
failure. Every expected number comes from the workload this script runs (or, for the partitions, from
the catalog), never from the extension's own monitoring functions. Prints one line per failed check and
ends with "monitoring: N passed, M failed"; exit status 1 on any failure.
"""
import json
import math
import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import urllib.request

import psycopg

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from pgtools import Cluster, ports  # noqa: E402

MON = ROOT / "monitoring"
QUERIES_YAML = MON / "postgres_exporter" / "queries.yaml"
COLLECTOR_YML = MON / "sql_exporter" / "idempotency.collector.yml"
RULES_YML = MON / "prometheus" / "idempotency.rules.yml"
RULES_TEST_YML = MON / "prometheus" / "idempotency.rules.test.yml"
PROM_EXAMPLE_YML = MON / "prometheus" / "prometheus.example.yml"

RANGE = ports("monitoring")
PG_PORT, PGX_PORT, SQLX_PORT, PROM_PORT = RANGE[0], RANGE[1], RANGE[2], RANGE[3]
RUN_DIR = pathlib.Path(f"/tmp/idem-monitoring-{PG_PORT}")
DB = "idem"
ROLE = "idem_exporter"
DSN = f"postgres://{ROLE}@127.0.0.1:{PG_PORT}/{DB}?sslmode=disable"

PG_EXPORTER = "prometheus-postgres-exporter"
SQL_EXPORTER = "prometheus-sql-exporter"
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"

# The workload, per scope (each item a count):
#   n   keys claimed and completed              m   duplicate claims of them (answered completed)
#   k   keys failed with retryable => true      r   of them claimed again (retries) and completed
#   o   idem_once keys                          od  idem_once repeats (false)
#   dl  keys failed with retryable => false     af  claims of them (answered failed)
#   mm  claims of a fingerprinted key with another fingerprint (answered mismatch)
#   inf leases left in flight (1 hour)          ip  claims of them (answered in_progress), h heartbeats
#   x   leases left expired (1 second)          t   expired leases taken over, then completed
#   s   completions with a taken-over key's old token (refused, 55006)
#   lw  a claim that waits for another session's key lock (0 or 1)
#   p   a key poisoned by idempotency.max_attempts (0 or 1)
# The numbers are chosen so that within a scope every counter (but the ones that stay 0) and every key
# gauge differs from the others, and each differs between the scopes: a query file that swaps two columns
# or two scopes cannot pass.
SCOPES = {
    "orders": dict(n=3, m=9, k=12, r=10, o=2, od=2, dl=8, af=4, mm=6, inf=1, ip=5, h=7, x=3, t=2, s=3, lw=1, p=0),
    "payments": dict(n=2, m=12, k=11, r=11, o=3, od=2, dl=2, af=5, mm=8, inf=2, ip=7, h=9, x=1, t=4, s=5, lw=0, p=1),
}
MAINTENANCE_ROUNDS = 3  # idem_maintenance() calls: create_db's and the workload's
SHORT_TTL = "1 second"
LOCK_HOLD_S = 0.6

PER_SCOPE_COUNTERS = ["claims", "claimed_new", "takeovers", "retries", "answered_completed",
                      "answered_in_progress", "answered_failed", "answered_mismatch", "poisoned", "dead_lettered",
                      "stale_refused", "serialization_failures", "lock_waits", "completes", "fails", "heartbeats"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------------
# Checks


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}{': ' + detail if detail else ''}", flush=True)
        return ok


CHECKS = Checks()


# ---------------------------------------------------------------------------------------------------
# The workload, and what it must show


class Expect:
    """What the workload did: counters per scope, final key states per scope, and the times the
    time-dependent values are bounded by."""

    def __init__(self):
        self.counters = {s: dict.fromkeys(PER_SCOPE_COUNTERS, 0) for s in SCOPES}
        self.lock_wait_s = {s: (0.0, 0.0) for s in SCOPES}
        self.keys = {s: {} for s in SCOPES}  # key -> completed | inflight | expired | released | failed
        self.inflight_claimed = {}  # scope -> (t0, t1) around the claim of the key left in flight
        self.dead_letter_at = {}  # scope -> (t0, t1) around the newest dead letter
        self.rounds = 0
        self.last_round = None  # (t0, t1) around the last idem_maintenance()
        self.surprises = []  # calls that did not answer what the workload meant them to
        self.started = None
        self.workload_end = None


class Workload:
    def __init__(self, conn, expect):
        self.c = conn
        self.e = expect

    def claim(self, scope, key, expect_outcome, kind=None, ttl=None, fingerprint=None):
        """idem_claim; counts it by the outcome the workload expects (and checks it got that outcome)."""
        row = self.c.execute("SELECT outcome, token FROM idem_claim(%s, ttl => %s::interval, scope => %s, "
                             "fingerprint => %s)", (key, ttl, scope, fingerprint)).fetchone()
        outcome, token = row
        if outcome != expect_outcome:
            self.e.surprises.append(f"idem_claim({key!r}, scope {scope!r}) answered {outcome!r}, not {expect_outcome!r}")
        n = self.e.counters[scope]
        n["claims"] += 1
        if expect_outcome == "claimed":
            n[{"new": "claimed_new", "takeover": "takeovers", "retry": "retries"}[kind]] += 1
        else:
            n[f"answered_{expect_outcome}"] += 1
        return token

    def complete(self, scope, key, token):
        self.c.execute("SELECT idem_complete(%s, %s::jsonb, scope => %s, token => %s)",
                       (key, '{"ok": true}', scope, token))
        self.e.counters[scope]["completes"] += 1
        self.e.keys[scope][key] = "completed"

    def fail(self, scope, key, token, retryable):
        t0 = time.time()
        got = self.c.execute("SELECT idem_fail(%s, %s::jsonb, retryable => %s, scope => %s, token => %s)",
                             (key, '{"error": "test"}', retryable, scope, token)).fetchone()[0]
        t1 = time.time()
        want = "released" if retryable else "failed"
        if got != want:
            self.e.surprises.append(f"idem_fail({key!r}, retryable => {retryable}) answered {got!r}")
        n = self.e.counters[scope]
        n["fails"] += 1
        if retryable:
            self.e.keys[scope][key] = "released"
        else:
            n["dead_lettered"] += 1
            self.e.keys[scope][key] = "failed"
            self.e.dead_letter_at[scope] = (t0, t1)

    def once(self, scope, key, expect_new):
        got = self.c.execute("SELECT idem_once(%s, scope => %s)", (key, scope)).fetchone()[0]
        if got is not expect_new:
            self.e.surprises.append(f"idem_once({key!r}) answered {got!r}")
        n = self.e.counters[scope]
        n["claims"] += 1
        n["claimed_new" if expect_new else "answered_completed"] += 1
        self.e.keys[scope][key] = "completed"

    def maintenance(self):
        t0 = time.time()
        self.c.execute("SELECT FROM idem_maintenance()")
        t1 = time.time()
        self.e.rounds += 1
        self.e.last_round = (t0, t1)

    def lock_wait(self, scope, dsn_kw):
        """A second session waits for the key lock the first one holds for LOCK_HOLD_S seconds."""
        key = f"{scope}-lockwait"
        holder = psycopg.connect(**dsn_kw, autocommit=False)
        waiter_result = {}
        try:
            got = holder.execute("SELECT outcome FROM idem_claim(%s, scope => %s)", (key, scope)).fetchone()[0]
            if got != "claimed":
                self.e.surprises.append(f"idem_claim({key!r}) in the lock holder answered {got!r}")
            n = self.e.counters[scope]
            n["claims"] += 1
            n["claimed_new"] += 1

            def wait():
                with psycopg.connect(**dsn_kw, autocommit=True) as w:
                    t0 = time.time()
                    waiter_result["outcome"] = w.execute("SELECT outcome FROM idem_claim(%s, scope => %s)",
                                                         (key, scope)).fetchone()[0]
                    waiter_result["waited"] = time.time() - t0

            th = threading.Thread(target=wait)
            th.start()
            time.sleep(LOCK_HOLD_S)
            holder.execute("SELECT idem_complete(%s, %s::jsonb, scope => %s)", (key, '{"ok": true}', scope))
            holder.commit()
            th.join(30)
        finally:
            holder.close()
        if waiter_result.get("outcome") != "completed":
            self.e.surprises.append(f"the claim waiting for the lock: {waiter_result!r}")
        n = self.e.counters[scope]
        n["completes"] += 1
        n["claims"] += 1
        n["answered_completed"] += 1
        n["lock_waits"] += 1
        # The wait lasted at least until the holder committed, at most as long as the waiter's call.
        self.e.lock_wait_s[scope] = (LOCK_HOLD_S * 0.5, waiter_result.get("waited", 0.0) + 0.05)
        self.e.keys[scope][key] = "completed"


def run_workload(cluster, expect):
    dsn_kw = dict(host=cluster.sockdir, port=cluster.port, user="postgres", dbname=DB)
    with psycopg.connect(**dsn_kw, autocommit=True) as c:
        w = Workload(c, expect)
        # Short leases first, so that they have expired by the time the rest is done.
        old_tokens = {}
        t_short = time.time()
        for scope, p in SCOPES.items():
            for i in range(p["x"]):
                key = f"{scope}-expired-{i}"
                w.claim(scope, key, "claimed", "new", ttl=SHORT_TTL)
                expect.keys[scope][key] = "expired"
            for i in range(p["t"]):
                key = f"{scope}-taken-{i}"
                old_tokens[key] = w.claim(scope, key, "claimed", "new", ttl=SHORT_TTL)
                expect.keys[scope][key] = "expired"
            if p["p"]:
                key = f"{scope}-poison"
                c.execute("SET idempotency.max_attempts = 1")
                w.claim(scope, key, "claimed", "new", ttl=SHORT_TTL)
                c.execute("RESET idempotency.max_attempts")
                expect.keys[scope][key] = "expired"
        for scope, p in SCOPES.items():
            for i in range(p["n"]):
                key = f"{scope}-done-{i}"
                w.complete(scope, key, w.claim(scope, key, "claimed", "new"))
            for i in range(p["m"]):
                w.claim(scope, f"{scope}-done-{i % p['n']}", "completed")
            for i in range(p["k"]):
                key = f"{scope}-retry-{i}"
                w.fail(scope, key, w.claim(scope, key, "claimed", "new"), retryable=True)
            for i in range(p["r"]):
                key = f"{scope}-retry-{i}"
                w.complete(scope, key, w.claim(scope, key, "claimed", "retry"))
            for i in range(p["o"]):
                w.once(scope, f"{scope}-once-{i}", True)
            for i in range(p["od"]):
                w.once(scope, f"{scope}-once-{i % p['o']}", False)
            for i in range(p["dl"]):
                key = f"{scope}-dead-{i}"
                w.fail(scope, key, w.claim(scope, key, "claimed", "new"), retryable=False)
            for i in range(p["af"]):
                w.claim(scope, f"{scope}-dead-{i % p['dl']}", "failed")
            key = f"{scope}-fp"
            w.complete(scope, key, w.claim(scope, key, "claimed", "new", fingerprint="fp-a"))
            for i in range(p["mm"]):
                w.claim(scope, key, "mismatch", fingerprint=f"fp-other-{i}")
            tokens = []
            for i in range(p["inf"]):
                key = f"{scope}-inflight-{i}"
                t0 = time.time()
                tokens.append(w.claim(scope, key, "claimed", "new", ttl="1 hour"))
                if i == 0:
                    expect.inflight_claimed[scope] = (t0, time.time())
                expect.keys[scope][key] = "inflight"
            for i in range(p["h"]):
                j = i % p["inf"]
                c.execute("SELECT idem_heartbeat(%s, ttl => '1 hour', scope => %s, token => %s)",
                          (f"{scope}-inflight-{j}", scope, tokens[j]))
                expect.counters[scope]["heartbeats"] += 1
            for i in range(p["ip"]):
                w.claim(scope, f"{scope}-inflight-{i % p['inf']}", "in_progress")
            if p["lw"]:
                w.lock_wait(scope, dsn_kw)
        # The short leases have expired now.
        time.sleep(max(0.0, t_short + 1.5 - time.time()))
        for scope, p in SCOPES.items():
            # takeovers, the old holders' completions refused (55006), the new holders' completions
            new_tokens = {}
            for i in range(p["t"]):
                key = f"{scope}-taken-{i}"
                new_tokens[key] = w.claim(scope, key, "claimed", "takeover")
            for i in range(p["s"]):
                key = f"{scope}-taken-{i % p['t']}"
                try:
                    c.execute("SELECT idem_complete(%s, NULL, scope => %s, token => %s)", (key, scope, old_tokens[key]))
                    expect.surprises.append(f"a completion of {key} with its old token succeeded (55006 expected)")
                except psycopg.errors.ObjectInUse:
                    expect.counters[scope]["stale_refused"] += 1
            for key, token in new_tokens.items():
                w.complete(scope, key, token)
            if p["p"]:
                # a second claim of a key that had max_attempts (1) claims: terminal (poisoned)
                c.execute("SET idempotency.max_attempts = 1")
                t0 = time.time()
                w.claim(scope, f"{scope}-poison", "failed")
                expect.dead_letter_at[scope] = (t0, time.time())
                c.execute("RESET idempotency.max_attempts")
                expect.counters[scope]["poisoned"] += 1
                expect.counters[scope]["dead_lettered"] += 1
                expect.keys[scope][f"{scope}-poison"] = "failed"
        while expect.rounds < MAINTENANCE_ROUNDS:
            w.maintenance()
    expect.workload_end = time.time()


def check_workload_design(expect):
    """The workload's numbers tell the columns and the scopes apart (see SCOPES)."""
    for scope in SCOPES:
        nonzero = [v for v in expect.counters[scope].values() if v]
        CHECKS.check(len(nonzero) == len(set(nonzero)), f"workload design: the counters of {scope} differ",
                     repr(expect.counters[scope]))
        states = list(expect.keys[scope].values())
        gauges = [len(states)] + [states.count(st) for st in ("completed", "inflight", "expired", "released", "failed")]
        CHECKS.check(len(gauges) == len(set(gauges)), f"workload design: the key gauges of {scope} differ", repr(gauges))
    for name in PER_SCOPE_COUNTERS:
        vals = [expect.counters[scope][name] for scope in SCOPES]
        CHECKS.check(len(set(vals)) == len(vals) or name == "serialization_failures",
                     f"workload design: {name} differs between the scopes", repr(vals))


def expected_series(expect, catalog, window, preloaded=True):
    """{(metric, scope or None): value or (low, high)} for every series both exporters must show, given
    the window of wall-clock times in which their queries ran. Without the library preloaded there are
    no counters (the view has no row) and no maintenance figures (they live in shared memory)."""
    t_lo, t_hi = window
    exp = {}
    for scope in SCOPES:
        if preloaded:
            n = expect.counters[scope]
            for name in PER_SCOPE_COUNTERS:
                exp[(f"idempotency_{name}_total", scope)] = n[name]
            exp[("idempotency_lock_wait_seconds_total", scope)] = expect.lock_wait_s[scope]
            exp[("idempotency_stats_reset_timestamp_seconds", scope)] = (expect.started - 1, expect.workload_end + 1)
        states = list(expect.keys[scope].values())
        exp[("idempotency_keys_retained", scope)] = len(states)
        exp[("idempotency_keys_completed", scope)] = states.count("completed")
        exp[("idempotency_keys_in_flight", scope)] = states.count("inflight")
        exp[("idempotency_keys_expired_leases", scope)] = states.count("expired")
        exp[("idempotency_keys_awaiting_retry", scope)] = states.count("released")
        exp[("idempotency_keys_dead_letters", scope)] = states.count("failed")
        c0, c1 = expect.inflight_claimed[scope]
        exp[("idempotency_keys_oldest_lease_age_seconds", scope)] = (t_lo - c1 - 1, t_hi - c0 + 1)
        d0, d1 = expect.dead_letter_at[scope]
        exp[("idempotency_keys_last_dead_letter_timestamp_seconds", scope)] = (d0 - 1, d1 + 1)
    exp[("idempotency_stats_enabled", None)] = 1
    exp[("idempotency_stats_scopes", None)] = len(SCOPES)
    r0, r1 = expect.last_round
    exp[("idempotency_maintenance_partitions", None)] = catalog["partitions"]
    exp[("idempotency_maintenance_sealed_partitions", None)] = catalog["sealed"]
    exp[("idempotency_maintenance_premade_ahead_seconds", None)] = (catalog["premade_until"] - t_hi - 1,
                                                                    catalog["premade_until"] - t_lo + 1)
    exp[("idempotency_maintenance_last_round_timestamp_seconds", None)] = (r0 - 1, r1 + 1)
    exp[("idempotency_maintenance_last_round_age_seconds", None)] = (t_lo - r1 - 1, t_hi - r0 + 1)
    exp[("idempotency_maintenance_last_round_duration_seconds", None)] = (0.0, r1 - r0 + 0.1)
    exp[("idempotency_maintenance_rounds_total", None)] = expect.rounds
    exp[("idempotency_maintenance_failed_rounds_total", None)] = 0
    exp[("idempotency_maintenance_last_error_timestamp_seconds", None)] = 0
    exp[("idempotency_maintenance_worker_running", None)] = catalog["worker_running"]
    if not preloaded:
        exp[("idempotency_stats_enabled", None)] = 0
        exp[("idempotency_stats_scopes", None)] = 0
        exp[("idempotency_maintenance_last_round_timestamp_seconds", None)] = 0
        exp[("idempotency_maintenance_last_round_age_seconds", None)] = (t_lo - 1, t_hi + 1)  # since 1970
        exp[("idempotency_maintenance_last_round_duration_seconds", None)] = 0
        exp[("idempotency_maintenance_rounds_total", None)] = 0
    return exp


def read_catalog(cluster):
    """What the catalog says, independently of the extension's monitoring functions."""
    with cluster.connect(DB) as c:
        parts, until = c.execute("""
            SELECT count(*), max((regexp_match(pg_get_expr(k.relpartbound, k.oid), 'TO \\(''([^'']+)''\\)'))[1]::timestamptz)
              FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
             WHERE i.inhparent = 'idempotency.records'::regclass""").fetchone()
        sealed = c.execute("SELECT count(*) FROM idempotency.sealed").fetchone()[0]
        workers = c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'").fetchone()[0]
    return {"partitions": parts, "sealed": sealed, "premade_until": until.timestamp(),
            "worker_running": 1 if workers else 0}


# ---------------------------------------------------------------------------------------------------
# The exposition format and the comparisons

LINE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """[(name, {label: value}, float)] of a /metrics page."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE_RE.match(line)
        if not m:
            raise ValueError(f"unparsable line in /metrics: {line!r}")
        labels = {k: v.encode().decode("unicode_escape") for k, v in LABEL_RE.findall(m.group(2) or "")}
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def canonical_sql_exporter(samples):
    """The sql_exporter series named as monitoring/README.md says (sql_<query>{col=<column>} ->
    <query>_<column>); only the idempotency ones."""
    out = []
    for name, labels, value in samples:
        if name.startswith("sql_idempotency") and "col" in labels:
            labels = dict(labels)
            out.append((f"{name[4:]}_{labels.pop('col')}", labels, value))
    return out


def matches(want, got):
    if got is None or math.isnan(got):
        return False
    if isinstance(want, tuple):
        return want[0] <= got <= want[1]
    return abs(got - want) < 1e-9


def compare(source, samples, expected, extra_labels):
    """Checks that `samples` (canonical names) hold exactly the expected idempotency series, each with
    the expected value and labels."""
    got = {}
    for name, labels, value in samples:
        if not name.startswith("idempotency_"):
            continue
        scope = labels.get("scope")
        key = (name, scope)
        if key in got:
            CHECKS.check(False, f"{source}: one series per metric and scope", f"{name} scope={scope!r} twice")
        got[key] = value
        for k, v in extra_labels.items():
            if labels.get(k) != v:
                CHECKS.check(False, f"{source}: label {k} of {name}", f"{labels.get(k)!r}, expected {v!r}")
    for key, want in sorted(expected.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        name, scope = key
        where = f"{name}" + (f"{{scope={scope!r}}}" if scope else "")
        CHECKS.check(matches(want, got.get(key)), f"{source}: {where}",
                     f"got {got.get(key)!r}, expected {want!r}" if key in got else "missing")
    extra = sorted(set(got) - set(expected), key=lambda k: (k[0], k[1] or ""))
    CHECKS.check(not extra, f"{source}: no unexpected idempotency series", repr(extra))


# ---------------------------------------------------------------------------------------------------
# Processes

PROCS = []


def run_as():
    """The unprivileged user the exporters and Prometheus run as."""
    for user in ("prometheus", "nobody"):
        try:
            pwd.getpwnam(user)
            return user
        except KeyError:
            pass
    raise RuntimeError("neither a prometheus nor a nobody user")


def spawn(name, args, env=None):
    """Starts a process as the unprivileged user (root drops to it with setpriv), output to RUN_DIR/name.log."""
    user = run_as()
    cmd = [str(a) for a in args]
    if os.geteuid() == 0:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] + cmd
    logf = open(RUN_DIR / f"{name}.log", "wb")
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(RUN_DIR), **(env or {})}
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env, cwd=RUN_DIR,
                         start_new_session=True)
    p.name = name
    PROCS.append(p)
    log(f"started {name} (pid {p.pid}) as {user}")
    return p


def stop_all():
    for p in reversed(PROCS):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(PROCS):
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    PROCS.clear()


def port_free(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def wait_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.returncode} (log: {RUN_DIR / (proc.name + '.log')})")
        if not port_free(port):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} does not listen on {port} after {timeout} s")


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def prom_api(path, **params):
    url = f"http://127.0.0.1:{PROM_PORT}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    body = json.loads(http_get(url))
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus {path}: {body}")
    return body["data"]


def wait_for(what, fn, timeout):
    """Polls fn() until it returns something true; returns it, or None after the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            log(f"gave up waiting for {what} after {timeout} s")
            return None
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------------
# The run


def start_exporters():
    pgx = spawn("postgres_exporter", [
        PG_EXPORTER, f"--web.listen-address=127.0.0.1:{PGX_PORT}", f"--extend.query-path={RUN_DIR / 'queries.yaml'}",
        "--disable-default-metrics", "--disable-settings-metrics", "--no-collector.database",
        "--no-collector.bgwriter", "--log.level=info"], env={"DATA_SOURCE_NAME": DSN})
    sqlx = spawn("sql_exporter", [
        SQL_EXPORTER, "-config.file", RUN_DIR / "idempotency.collector.yml",
        "-web.listen-address", f"127.0.0.1:{SQLX_PORT}"], env={"IDEMPOTENCY_DSN": DSN, "LOGLEVEL": "info"})
    wait_port(PGX_PORT, pgx)
    wait_port(SQLX_PORT, sqlx)


def scrape_exporters(expect, catalog, t_started, preloaded=True):
    how = "" if preloaded else " (library not preloaded)"
    # postgres_exporter queries on each scrape (idem_metrics() sections: at most once a minute).
    pgx_text = http_get(f"http://127.0.0.1:{PGX_PORT}/metrics")
    pgx = parse_metrics(pgx_text)
    # sql_exporter runs each job when it starts: wait until each of its 4 queries reported how it went.
    queries = {"idempotency", "idempotency_stats", "idempotency_keys", "idempotency_maintenance"}

    def sqlx_ran():
        samples = parse_metrics(http_get(f"http://127.0.0.1:{SQLX_PORT}/metrics"))
        ran = {lbl.get("query") for n, lbl, _ in samples if n == "sql_exporter_last_scrape_failed"}
        return samples if queries <= ran else None

    sqlx = wait_for("sql_exporter's first runs of its three jobs", sqlx_ran, 20)
    if sqlx is None:
        sqlx = parse_metrics(http_get(f"http://127.0.0.1:{SQLX_PORT}/metrics"))
    window = (t_started, time.time())
    expected = expected_series(expect, catalog, window, preloaded)
    (RUN_DIR / f"postgres_exporter{'' if preloaded else '-nopreload'}.metrics").write_text(pgx_text)

    compare(f"postgres_exporter /metrics{how}", pgx, expected, {"database": DB, "server": f"127.0.0.1:{PG_PORT}"})
    compare(f"sql_exporter /metrics{how}", canonical_sql_exporter(sqlx), expected,
            {"database": DB, "host": f"127.0.0.1:{PG_PORT}", "user": ROLE})

    def value(samples, name):
        vals = [v for n, _, v in samples if n == name]
        return vals

    CHECKS.check(value(pgx, "pg_up") == [1.0], f"postgres_exporter{how}: pg_up 1", repr(value(pgx, "pg_up")))
    CHECKS.check(value(pgx, "pg_exporter_user_queries_load_error") == [0.0],
                 f"postgres_exporter{how}: queries.yaml loaded", repr(value(pgx, "pg_exporter_user_queries_load_error")))
    CHECKS.check(value(pgx, "pg_exporter_last_scrape_error") == [0.0], f"postgres_exporter{how}: no scrape error",
                 repr(value(pgx, "pg_exporter_last_scrape_error")))
    failed = [(lbl.get("query"), v) for n, lbl, v in sqlx if n == "sql_exporter_last_scrape_failed"]
    CHECKS.check(len(failed) == 4 and all(v == 0 for _, v in failed), f"sql_exporter{how}: its 4 queries ran (zero rows allowed where expected)", repr(failed))
    # Every *_total of sql_exporter is a gauge; postgres_exporter declares the counters as counters.
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", pgx_text, re.M))
    wrong = [n for n, _ in expected if n.endswith("_total") and types.get(n) != "counter"]
    CHECKS.check(not wrong, f"postgres_exporter{how}: the *_total series are counters", repr(wrong))
    return expected


def prometheus_config():
    """monitoring/prometheus/prometheus.example.yml with this run's targets and 1 s intervals."""
    text = PROM_EXAMPLE_YML.read_text()
    for old, new in (("scrape_interval: 30s", "scrape_interval: 1s"), ("evaluation_interval: 30s", "evaluation_interval: 1s"),
                     ("'localhost:9187'", f"'127.0.0.1:{PGX_PORT}'"), ("'localhost:9237'", f"'127.0.0.1:{SQLX_PORT}'")):
        if text.count(old) != 1:
            raise RuntimeError(f"{PROM_EXAMPLE_YML} should hold {old!r} once (this test edits it)")
        text = text.replace(old, new)
    return text


PG_JOB = "idempotency_postgres_exporter"
SQL_JOB = "idempotency_sql_exporter"


def prometheus_samples(job):
    res = prom_api("query", query=f'{{__name__=~"idempotency_.+|sql_idempotency.*",job="{job}"}}')["result"]
    return [(r["metric"].get("__name__"), r["metric"], float(r["value"][1])) for r in res]


def check_prometheus(expect, catalog, t_started):
    (RUN_DIR / "prometheus.yml").write_text(prometheus_config())
    shutil.copy(RULES_YML, RUN_DIR / RULES_YML.name)
    tsdb = RUN_DIR / "tsdb"
    tsdb.mkdir()
    user = run_as()
    subprocess.run(["chown", "-R", f"{user}:", str(tsdb)], check=True)
    prom = spawn("prometheus", [
        PROMETHEUS, f"--config.file={RUN_DIR / 'prometheus.yml'}", f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--storage.tsdb.retention.time=1h"])
    wait_port(PROM_PORT, prom, timeout=60)
    wait_for("Prometheus ready", lambda: _ready(), 60)

    def both_jobs_scraped():
        pg_s, sql_s = prometheus_samples(PG_JOB), prometheus_samples(SQL_JOB)
        names = {"idempotency_keys_in_flight", "idempotency_maintenance_partitions", "idempotency_claims_total",
                 "idempotency_stats_enabled"}
        ok = all(names <= {n for n, _, _ in s} for s in (pg_s, sql_s))
        return (pg_s, sql_s) if ok else None

    got = wait_for("both exporters' series in Prometheus", both_jobs_scraped, 30)
    pg_s, sql_s = got if got else ([], [])
    expected = expected_series(expect, catalog, (t_started, time.time()))
    compare(f"Prometheus, job {PG_JOB}", pg_s, expected, {"database": DB, "job": PG_JOB})
    compare(f"Prometheus, job {SQL_JOB} (relabeled)", sql_s, expected, {"database": DB, "job": SQL_JOB})
    leftovers = sorted({n for n, lbl, _ in sql_s if n.startswith("sql_") or "col" in lbl})
    CHECKS.check(not leftovers, "Prometheus: the example config renamed every sql_idempotency* series, without col",
                 repr(leftovers))

    # The rules: loaded, evaluated without error.
    def evaluated():
        groups = prom_api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") and
                                      not r["lastEvaluation"].startswith("0001") for r in rules) else None

    rules = wait_for("the rules evaluated once", evaluated, 20) or []
    names = sorted(r["name"] for r in rules)
    want_names = sorted(re.findall(r"^\s+- alert: (\S+)$", RULES_YML.read_text(), re.M))
    CHECKS.check(names == want_names and len(names) == 7, "Prometheus: the 7 alert rules loaded", repr(names))
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    CHECKS.check(not bad, "Prometheus: every rule evaluates without error", repr(bad))

    # Alerts on the workload's data: the expired leases pending (for: 15m), nothing else.
    def alerts():
        return {(a["labels"]["alertname"], a["labels"].get("job"), a["labels"].get("scope"), a["state"])
                for a in prom_api("alerts")["alerts"]}

    time.sleep(2)  # a few more evaluations
    want = {("IdempotencyLeasesExpired", job, scope, "pending") for job in (PG_JOB, SQL_JOB) for scope in SCOPES
            if list(expect.keys[scope].values()).count("expired") > 0}
    CHECKS.check(len(want) == 4 and alerts() == want, "Prometheus: the expired leases' alert pending, no other alert",
                 f"got {sorted(alerts(), key=str)}, expected {sorted(want, key=str)}")

    # A new dead letter in one scope: IdempotencyDeadLettersGrowing fires for it, from both exporters
    # (the counters job of sql_exporter runs every 15 s).
    scope = "payments"
    with cluster_conn() as c:
        w = Workload(c, expect)
        w.fail(scope, f"{scope}-dead-late", w.claim(scope, f"{scope}-dead-late", "claimed", "new"), retryable=False)
    CHECKS.check(not expect.surprises, "workload: a new dead letter in payments", "; ".join(expect.surprises))

    def growing():
        a = alerts()
        found = {(n, j, s) for n, j, s, st in a if n == "IdempotencyDeadLettersGrowing" and st == "firing"}
        return found if found == {("IdempotencyDeadLettersGrowing", j, scope) for j in (PG_JOB, SQL_JOB)} else None

    got = wait_for("IdempotencyDeadLettersGrowing for payments from both jobs", growing, 40)
    CHECKS.check(got is not None, f"Prometheus: IdempotencyDeadLettersGrowing fires for scope {scope} only, from both jobs",
                 f"alerts now: {sorted(alerts(), key=str)}")
    for job in (PG_JOB, SQL_JOB):
        v = [float(r["value"][1]) for r in prom_api("query", query=f'idempotency_dead_lettered_total{{job="{job}",scope="{scope}"}}')["result"]]
        want_v = expect.counters[scope]["dead_lettered"]
        CHECKS.check(v == [want_v], f"Prometheus, job {job}: idempotency_dead_lettered_total{{scope={scope!r}}} after the new dead letter",
                     f"got {v}, expected {want_v}")


def check_without_preload(cluster, expect):
    """The same files on the same data, the server restarted without the library preloaded: no counters,
    counting off, no maintenance figures, and both exporters still run every query without error."""
    stop_all()
    cluster.stop()
    cluster.append_conf(["shared_preload_libraries = ''"])
    cluster.start()
    catalog = read_catalog(cluster)
    CHECKS.check(catalog["worker_running"] == 0, "no preload: no idempotency launcher", repr(catalog))
    t_started = time.time()
    start_exporters()
    scrape_exporters(expect, catalog, t_started, preloaded=False)


def _ready():
    try:
        return "Ready" in http_get(f"http://127.0.0.1:{PROM_PORT}/-/ready", timeout=2)
    except OSError:
        return False


CLUSTER = None


def cluster_conn():
    return CLUSTER.connect(DB)


def promtool():
    for args in (["check", "rules", RULES_YML.name], ["test", "rules", RULES_TEST_YML.name],
                 ["check", "config", PROM_EXAMPLE_YML.name]):
        r = subprocess.run([PROMTOOL, *args], cwd=RULES_YML.parent, capture_output=True, text=True)
        CHECKS.check(r.returncode == 0 and "SUCCESS" in r.stdout, f"promtool {' '.join(args)}",
                     (r.stdout + r.stderr).strip()[-2000:])


def main():
    global CLUSTER
    for tool in (PG_EXPORTER, SQL_EXPORTER, PROMETHEUS, PROMTOOL):
        if not shutil.which(tool):
            print(f"missing: {tool}; install with: scripts/install-monitoring-deps", file=sys.stderr)
            print("monitoring: 0 passed, 1 failed")
            return 2
    busy = [p for p in (PGX_PORT, SQLX_PORT, PROM_PORT) if not port_free(p)]
    if busy:
        print(f"ports in use: {busy} (a run left over? see {RUN_DIR})", file=sys.stderr)
        print("monitoring: 0 passed, 1 failed")
        return 1

    t_begin = time.monotonic()
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    RUN_DIR.mkdir(parents=True)
    RUN_DIR.chmod(0o755)
    shutil.copy(QUERIES_YAML, RUN_DIR / "queries.yaml")
    shutil.copy(COLLECTOR_YML, RUN_DIR / "idempotency.collector.yml")

    expect = Expect()
    expect.started = time.time()
    # maintenance_interval 1h: the worker runs (worker_running) but no round of its own during the test,
    # so the rounds are the test's idem_maintenance() calls.
    CLUSTER = cluster = Cluster(PG_PORT, ["shared_preload_libraries = 'idempotency'", f"idempotency.database = '{DB}'",
                                          "idempotency.maintenance_interval = '1h'"],
                                max_connections=50, fsync="off")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        log(f"cluster on {PG_PORT}")
        cluster.init()
        cluster.start()
        cluster.create_db(DB)  # CREATE EXTENSION, and one idem_maintenance() round
        expect.rounds += 1
        with cluster.connect(DB) as c:
            c.execute(f"CREATE ROLE {ROLE} LOGIN")
            c.execute(f"GRANT pg_monitor TO {ROLE}")
        log("workload")
        run_workload(cluster, expect)
        CHECKS.check(not expect.surprises, "workload: every call answered what the workload meant it to",
                     "; ".join(expect.surprises[:10]))
        check_workload_design(expect)
        catalog = read_catalog(cluster)
        log(f"catalog: {catalog}; exporters on {PGX_PORT}, {SQLX_PORT}")
        t_started = time.time()
        start_exporters()
        scrape_exporters(expect, catalog, t_started)
        log(f"Prometheus on {PROM_PORT}")
        check_prometheus(expect, catalog, t_started)
        log("the library not preloaded")
        check_without_preload(cluster, expect)
        log("promtool")
        promtool()
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # the harness failed, or was stopped: a failure
        CHECKS.check(False, "the run", f"{type(e).__name__}: {e}")
        if isinstance(e, Exception):
            traceback.print_exc()
    finally:
        stop_all()
        cluster.stop()
    log(f"took {time.monotonic() - t_begin:.1f} s; logs in {RUN_DIR}, server log {cluster.logfile}")
    print(f"monitoring: {CHECKS.passed} passed, {CHECKS.failed} failed")
    return 0 if CHECKS.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

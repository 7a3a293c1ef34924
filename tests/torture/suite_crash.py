"""Suite 2: crash and restart under the torture load.

The consumers of workload.py (half in one-transaction mode, half in two-transaction mode, at the three
isolation levels) run against a cluster with the library preloaded (the maintenance launcher runs a
round every second) while a chaos thread, at evenly spaced points of the load's progress:
  * kill -9 a random client backend (SIGKILL from the OS, not pg_terminate_backend: the postmaster then
    kills every other backend and runs crash recovery),
  * kill -9 the maintenance launcher (a background worker: same crash recovery),
  * pg_ctl stop -m immediate, then start (crash recovery at startup).
Consumers reconnect, check that the stored position of their partition is the one they were told was
committed (or the one of a COMMIT whose answer was lost with the connection), and resume from
idem_offsets(). At the end: the checks of suite 1, plus every acknowledged completion, claim and offset
is still there, the launcher came back after every crash, and the server log shows no crash that the
chaos thread did not cause.

Against the SQL edition (IDEM_EDITION=sql) there is no library, launcher or maintenance worker: the chaos
thread kills backends and stops the server, and a client's idem_maintenance() runs the rounds.
"""
import re
import signal
import threading
import time

import pgtools
from harness import Cluster, close_quietly, crash_lines, kill9, log, port, seeded
from workload import BUSINESS_DDL, Run, Settings, build_stream

PORT = port(1)
DB = "crash"
LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
KINDS = ("kill -9 backend", "immediate stop + start", "kill -9 launcher", "kill -9 maintenance worker")
# The SQL edition has no background worker: no launcher or maintenance worker to kill.
if pgtools.sql_edition():
    KINDS = KINDS[:2]


def run(install, opts, result):
    cluster = Cluster(install, PORT, conf=[
        "shared_preload_libraries = 'idempotency'",
        f"idempotency.database = '{DB}'",
        "idempotency.maintenance_interval = '1s'",
        # A round waits this long for the lock a partition drop needs: the window in which the chaos
        # thread kills the maintenance worker in the middle of its round.
        "idempotency.drop_lock_timeout = '5s'",
        "max_locks_per_transaction = 256",
        "restart_after_crash = on",
    ])
    cluster.start()
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as c:
            c.execute(BUSINESS_DDL)
        if not pgtools.sql_edition() and not _wait(lambda: cluster.launcher_pid(), 30):
            result.violation("no idempotency launcher after start")
        log_start = 0
        rng = seeded(opts.seed, "crash")
        stream = build_stream(rng, opts.crash_messages, opts.crash_consumers, "crash")

        def settings(i):
            return Settings(iso=LEVELS[i % 3], mode="1tx" if i % 2 == 0 else "2tx", lease_ms=opts.lease_ms, slow_rate=opts.slow_permille / 1000,
                            crash_tolerant=True, only_one_tx=False)

        r = Run(cluster, DB, stream, "crash", settings, rng, result)
        r.crashes_expected = True
        chaos = Chaos(cluster, r, opts, seeded(opts.seed, "chaos"))
        t0 = time.monotonic()
        ct = threading.Thread(target=chaos.loop, daemon=True, name="chaos")
        ct.start()
        r.run()
        chaos.done.set()
        ct.join(600)
        took = time.monotonic() - t0
        cluster.wait_ready(DB)
        with cluster.connect(DB) as c:
            violations = r.violations + chaos.violations + r.check(c)
            acked = len(r.clog.applied)
            verified_claims = len(r.clog.claims)
        # The server log: every crash was one of ours.
        text = cluster.log_since(log_start)
        recoveries = len(re.findall(r"automatic recovery in progress", text))
        killed = set(chaos.killed)
        for line in crash_lines(text):
            m = re.search(r"\(PID (\d+)\) was terminated by signal (\d+)", line)
            if m:
                if int(m.group(1)) not in killed or int(m.group(2)) != signal.SIGKILL:
                    violations.append(f"server log: a crash the chaos thread did not cause: {line.strip()}")
            elif "PANIC" in line or "TRAP" in line:
                violations.append(f"server log: {line.strip()}")
        # Maintenance resumed after the crashes: the expired partitions the chaos thread made are gone.
        if pgtools.sql_edition():  # no worker: a round as a scheduler would call it
            _one(cluster, "SELECT count(*) FROM idem_maintenance()")
        if not _wait(lambda: _one(cluster, "SELECT count(*) = 0 FROM idempotency.partitions "
                                           "WHERE range_to < now() - interval '8 days'"), 30):
            violations.append("maintenance did not drop the expired partitions after the crashes")
        if chaos.count < opts.crash_cycles:
            violations.append(f"only {chaos.count} of {opts.crash_cycles} crash cycles happened during the load")
        for v in violations[:40]:
            result.violation(v)
        if len(violations) > 40:
            result.violation(f"... and {len(violations) - 40} more")
        figs = r.figures()
        result.figures.update({
            "consumers": opts.crash_consumers,
            "modes": "one-transaction (even consumers) and two-transaction (odd), RC/RR/SERIALIZABLE",
            "messages": figs["messages"],
            "deliveries": figs["deliveries"],
            "deliveries handled (incl. replays after crashes)": figs["deliveries handled (incl. replays)"],
            "crashes survived": chaos.count,
            **{f"  {k}": chaos.by_kind.get(k, 0) for k in KINDS},
            "crash recoveries in the server log": recoveries,
            "launcher restarts verified": "no launcher (SQL edition)" if pgtools.sql_edition() else chaos.launcher_back,
            "reconnects": figs["reconnects"],
            "commits in doubt (connection lost during COMMIT)": figs["commits in doubt"],
            "acknowledged completions verified": acked,
            "acknowledged claims verified": verified_claims,
            "duplicates suppressed": figs["duplicates suppressed"],
            "takeovers": figs["takeovers"],
            "stale holders rejected": figs["stale holders rejected (55006)"]
            + figs["stale holders rejected (55000, taker already done)"],
            "aborts injected": figs["aborts injected"],
            "40001/40P01 retried": figs["40001 retried"] + figs["40P01 retried"],
            "zombie offsets fenced": figs["zombie offsets fenced"],
            "monitor samples": figs["monitor samples"],
            "seconds under load": round(took, 1),
            "violations": len(violations),
        })
    finally:
        cluster.stop()


def _one(cluster, sql):
    with cluster.connect(DB) as c:
        return c.execute(sql).fetchone()[0]


def _wait(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return None


class Chaos:
    def __init__(self, cluster, run, opts, rng):
        self.cluster = cluster
        self.run = run
        self.opts = opts
        self.rng = rng
        self.done = threading.Event()
        self.count = 0
        self.by_kind = {}
        self.killed = []
        self.launcher_back = 0
        self.violations = []

    def loop(self):
        n = self.opts.crash_cycles
        kinds = [KINDS[i % len(KINDS)] for i in range(n)]
        self.rng.shuffle(kinds)
        total = self.run.stream.deliveries
        for j, kind in enumerate(kinds):
            milestone = total * (j + 1) / (n + 1)
            while self.run.entries_done() < milestone:
                if self.done.wait(0.05):
                    return
            time.sleep(self.rng.random() * 0.3)  # not always at the same phase of a transaction
            try:
                self._crash(kind)
            except Exception as e:  # noqa: BLE001
                self.violations.append(f"chaos: {kind} failed: {type(e).__name__}: {e}")
                return

    def _catch_maintenance_worker(self):
        """Makes an expired partition, blocks its drop with a lock on the parent, and returns the pid of
        the maintenance worker once it waits for that lock (in the middle of its round)."""
        holder = self.cluster.connect(DB, timeout_ms=30000)
        try:
            for _ in range(20):
                days = 30 + self.rng.randrange(0, 300)
                holder.execute("SELECT idempotency.premake_partitions(now() - make_interval(days => %s))", (days,))
                holder.execute("BEGIN")
                holder.execute("LOCK TABLE idempotency.records IN ACCESS SHARE MODE")
                expired = holder.execute("SELECT count(*) FROM idempotency.partitions "
                                         "WHERE range_to < now() - interval '8 days'").fetchone()[0]
                if expired:
                    break
                holder.execute("COMMIT")  # the worker was quicker: again
            else:
                self.violations.append("chaos: could not make an expired partition for the maintenance worker")
                return None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                found = self.cluster.children("idempotency maintenance")
                if found:
                    time.sleep(0.05)  # let it reach the DROP and wait there
                    return found[0]
                time.sleep(0.005)
            self.violations.append("chaos: no maintenance worker showed up within 10 s")
            return None
        finally:
            # The crash will end this session; keep it open until then so the worker keeps waiting.
            self._holder = holder

    def _crash(self, kind):
        self._holder = None
        old_launcher = self.cluster.launcher_pid()
        if kind == "kill -9 backend":
            with self.cluster.connect(DB, timeout_ms=10000) as c:
                pids = [p for (p,) in c.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid() ORDER BY state = 'idle' , random()", (DB,))]
            for victim in pids:
                try:
                    self.killed.append(victim)
                    kill9(victim)
                    break
                except ProcessLookupError:
                    continue  # it ended meanwhile: the next one
            else:
                self.violations.append("chaos: no backend to kill")
                return
        elif kind == "kill -9 maintenance worker":
            victim = self._catch_maintenance_worker()
            if victim is None:
                self._holder.close()
                return
            self.killed.append(victim)
            kill9(victim)
        elif kind == "kill -9 launcher":
            if old_launcher is None:
                self.violations.append("chaos: no launcher to kill")
                return
            self.killed.append(old_launcher)
            kill9(old_launcher)
        else:
            self.cluster.stop_immediate()
            time.sleep(self.rng.random() * 0.5)
            self.cluster.start_again()
        self.count += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        close_quietly(self._holder)
        log(f"chaos: {kind} at {self.run.entries_done()} deliveries")
        self.cluster.wait_ready(DB)
        if pgtools.sql_edition():
            return
        # The postmaster restarts the launcher after crash recovery (and at startup).
        back = _wait(lambda: (lambda p: p if p and p != old_launcher else None)(self.cluster.launcher_pid()), 60)
        if back:
            self.launcher_back += 1
        else:
            self.violations.append(f"chaos: the launcher did not come back after {kind}")

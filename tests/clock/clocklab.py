"""What the clock layer's cases share: a case on its own database of the faked-clock cluster (its clock set,
its retention settings for either edition), maintenance running (the native worker, or idem_maintenance()
every minute of the fake clock for the SQL edition), a watcher of the maintenance rounds' lock waits, and
the checks that close every case.
"""
import contextlib
import datetime
import re
import threading
import time

import psycopg

import pgtools
from consumers import Gate

UTC = datetime.timezone.utc
DB = "clock_case"
MAINT_APP = "clock-maintenance"
CONSUMER_APPS = ("clock-consumer", "clock-held")
# A maintenance round's lock wait is bounded by drop_lock_timeout (lock_timeout, a deadline on the wall
# clock). The watcher polls; it reports a relation-lock wait seen for longer than drop_lock_timeout plus
# this much (polling and a busy 2-core machine), and any other wait on a consumer at once: a row, a
# transaction id or an advisory lock is held until the consumer's transaction ends.
WATCH_SLACK_S = 2.0
ERROR_LINE = re.compile(r"\] (23514|XX000) (?:ERROR|FATAL|PANIC):.*")


def interval_s(text):
    """Seconds of a simple interval text: '60 s', '1 day', '30 days', '1 hour'."""
    number, unit = text.split()
    scale = {"s": 1, "min": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}[unit]
    return int(number) * scale


class Case:
    """One case: a fresh database, the server's clock at `start` running `rate` times as fast, and the
    retention settings given (both editions: GUCs reloaded for the native one, the settings row for the SQL
    edition)."""

    def __init__(self, server, name, *, start, rate=1.0, interval="1 day", retention="7 days", premake=4,
                 drop_lock_timeout_ms=100, maint_tz=None):
        self.server, self.name = server, name
        self.start_at, self.rate = start, rate
        self.interval, self.retention, self.premake = interval, retention, premake
        self.drop_lock_timeout_ms = drop_lock_timeout_ms
        self.maint_tz = maint_tz
        self.worker_s = None  # the native worker's maintenance_interval; default about a fake minute
        self.sql = pgtools.sql_edition()
        self.stop = threading.Event()
        self.gate = Gate()  # passed by the consumers made with gate=case.gate (see quiet)
        self.scheduling = threading.Lock()  # held by the SQL edition's scheduler during its round
        self.threads = []
        self.watcher = None
        self.log_from = 0

    # ---- sessions

    def connect(self, application_name=None, dbname=DB):
        kw = {"application_name": application_name} if application_name else {}
        return self.server.cluster.connect(dbname, **kw)

    def now(self, conn=None):
        if conn is not None:
            return conn.execute("SELECT clock_timestamp()").fetchone()[0]
        with self.server.cluster.connect() as c:
            return c.execute("SELECT clock_timestamp()").fetchone()[0]

    # ---- set-up

    def __enter__(self):
        cluster, clock = self.server.cluster, self.server.clock
        self.log_from = cluster.log_size()
        with cluster.connect() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            if not self.sql:
                # The worker runs a round about every minute of the fake clock.
                worker_s = self.worker_s or max(1, round(60 / self.rate))
                for name, value in (("partition_interval", _guc_text(self.interval)), ("retention", _guc_text(self.retention)),
                                    ("premake", self.premake), ("maintenance_interval", f"{worker_s}s"),
                                    ("drop_lock_timeout", f"{self.drop_lock_timeout_ms}ms")):
                    v = value if isinstance(value, int) else f"'{value}'"
                    admin.execute(f"ALTER SYSTEM SET idempotency.{name} = {v}")
                admin.execute("SELECT pg_reload_conf()")
            admin.execute(f"CREATE DATABASE {DB}")
        with self.connect() as c:
            pgtools.install_extension(c)
            if self.sql:
                c.execute("UPDATE idempotency.settings SET partition_interval = %s::interval, retention = %s::interval,"
                          " premake = %s, drop_lock_timeout = %s::interval",
                          (self.interval, self.retention, self.premake, f"{self.drop_lock_timeout_ms} ms"))
            else:
                # The reload reached this backend: the first round must use the case's settings.
                assert c.execute("SHOW idempotency.partition_interval").fetchone()[0] == _guc_text(self.interval)
            c.execute("CREATE TABLE business (key text NOT NULL, consumer int NOT NULL,"
                      " at timestamptz NOT NULL DEFAULT now())")
            c.execute("CREATE INDEX ON business (key)")
            # The clock is set once the database is ready (the install takes seconds, minutes of a fast
            # clock), then the first round makes the partitions, as of the case's start.
            clock.server_now = lambda: c.execute("SELECT clock_timestamp()").fetchone()[0]
            clock.start(self.start_at, self.rate)
            c.execute("SELECT FROM idem_maintenance()")
        self.watcher = Watcher(self)
        self.watcher.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)
        if self.watcher:
            self.watcher.halt()

    def spawn(self, thread):
        self.threads.append(thread)
        thread.start()
        return thread

    def run_maintenance(self):
        """The SQL edition's scheduler: idem_maintenance() once every minute of the fake clock, until the
        case stops (the native extension has its worker)."""
        if self.sql:
            self.spawn(threading.Thread(target=self._maintain_every_minute, daemon=True, name="maintenance"))

    def _maintain_every_minute(self):
        with self.connect(MAINT_APP) as m:
            if self.maint_tz:
                m.execute(f"SET TimeZone = '{self.maint_tz}'")
            while not self.stop.is_set():
                with self.scheduling:
                    self.round(m)
                now = self.now(m)
                nxt = now.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
                self.stop.wait(max(0.0, (nxt - now).total_seconds() / self.rate))

    def round(self, conn=None):
        """One maintenance round now (idem_maintenance()), in `conn` or a session of its own."""
        if conn is None:
            with self.connect(MAINT_APP) as m:
                return self.round(m)
        return conn.execute("SELECT * FROM idem_maintenance()").fetchone()

    @contextlib.contextmanager
    def quiet(self):
        """No consumer of the case's gate in a transaction and no scheduled round running, for the block: a
        round made there has no writer to wait for and no other round to find under way (a SQL edition's
        round then does nothing; the native one waits for the worker's)."""
        consumers = [t for t in self.threads if getattr(t, "gate", None) is self.gate]
        try:
            if consumers:
                self.gate.close(consumers)
            with self.scheduling:
                yield
        finally:
            if consumers:
                self.gate.open()

    def sleep_fake(self, seconds):
        """Waits while the fake clock runs `seconds` (real time: seconds / rate)."""
        self.stop.wait(seconds / self.rate)

    def run_until(self, conn, until):
        """Waits until the server's clock reaches `until`."""
        while True:
            left = (until - self.now(conn)).total_seconds()
            if left <= 0:
                return
            time.sleep(min(left / self.rate, 1.0))


def _guc_text(interval):
    s = interval_s(interval)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


class Watcher(threading.Thread):
    """Polls pg_locks for maintenance sessions (the worker's rounds, or MAINT_APP sessions) waiting on a
    consumer; keeps the waits that break the rule (see WATCH_SLACK_S)."""

    def __init__(self, case):
        super().__init__(daemon=True, name="watcher")
        self.case = case
        self.halted = threading.Event()
        self.seen = {}  # (pid, locktype, what) -> first seen (monotonic)
        self.violations = []
        self.waits = 0
        self.limit = case.drop_lock_timeout_ms / 1000 + WATCH_SLACK_S

    def run(self):
        with self.case.server.cluster.connect() as w:
            while not self.halted.is_set():
                rows = w.execute(
                    "SELECT l.pid, l.locktype, coalesce(l.relation::regclass::text, l.transactionid::text,"
                    "       l.classid || ':' || l.objid || ':' || l.objsubid, ''),"
                    "       EXISTS (SELECT FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(l.pid))"
                    "                                         AND b.application_name = ANY (%s))"
                    "  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND a.datname = %s"
                    "   AND (a.backend_type = 'idempotency maintenance' OR a.application_name = %s)",
                    (list(CONSUMER_APPS), DB, MAINT_APP)).fetchall()
                now = time.monotonic()
                current = set()
                for pid, locktype, what, on_consumer in rows:
                    if not on_consumer:
                        continue
                    key = (pid, locktype, what)
                    current.add(key)
                    if key not in self.seen:
                        self.seen[key] = now
                        self.waits += 1
                        if locktype != "relation":
                            self.violations.append(f"a maintenance round waits for a consumer's {locktype} lock ({what})")
                    elif locktype == "relation" and now - self.seen[key] > self.limit:
                        self.violations.append(f"a maintenance round waited {now - self.seen[key]:.1f} s for {what}")
                        self.seen[key] = float("inf")
                self.seen = {k: v for k, v in self.seen.items() if k in current}
                self.halted.wait(0.05)

    def halt(self):
        self.halted.set()
        self.join(timeout=10)


def check_case(case, ledger, report, *, retained_since=None):
    """The checks after every case. Every message whose first processing committed has exactly one
    business row and, when it is younger than the retention (created at or after `retained_since`, the
    server's now() - retention when not given), exactly one record; no 23514 or XX000 in any session or in
    the server log; no maintenance round waited on a consumer past drop_lock_timeout; no re-delivery answered
    as new; every offset advanced and the stored ones are the last committed."""
    case.stop.set()
    for t in case.threads:
        t.join(timeout=120)
    case.watcher.halt()
    problems = []
    with case.connect() as c:
        now = c.execute("SELECT now()").fetchone()[0]
        since = retained_since or now - datetime.timedelta(seconds=interval_s(case.retention))
        rows = c.execute(
            "WITH k AS (SELECT unnest(%s::text[]) AS key)"
            " SELECT k.key, (SELECT count(*) FROM business b WHERE b.key = k.key),"
            "        (SELECT min(b.at) FROM business b WHERE b.key = k.key),"
            "        (SELECT count(*) FROM idempotency.records r WHERE r.key = k.key AND r.scope = 'default')"
            "   FROM k", (ledger.done,)).fetchall()
        for key, effects, at, records in rows:
            if effects != 1:
                problems.append(f"{key}: {effects} business rows")
            elif records > 1 or (records != 1 and at >= since):
                problems.append(f"{key} (processed at {at}): {records} records")
        for n, last in sorted(ledger.last_offset.items()):
            stored = c.execute("SELECT idem_next_offset(%s, %s, %s)", ("clock", "messages", n)).fetchone()[0]
            if stored != last + 1:
                problems.append(f"offset of consumer {n}: stored next {stored}, last committed {last}")
    problems += [f"error {s}: {m} ({w})" for s, m, w in ledger.errors]
    problems += [f"re-delivery of {k} ({mode}) answered as new" for k, mode in ledger.answered_new]
    problems += [f"offset {o} of consumer {n} did not advance" for n, o in ledger.offsets_stuck]
    problems += case.watcher.violations
    log = case.server.cluster.log_since(case.log_from)
    problems += [f"server log: {m.group(0)[:200]}" for m in ERROR_LINE.finditer(log)]
    problems += [f"server log: {line[:200]}" for line in pgtools.crash_lines(log)]
    report(f"{len(ledger.done)} messages in {ledger.tx} transactions, {ledger.redelivered} re-deliveries, "
           f"{ledger.lost_leases} leases taken over, {ledger.reclaimed_leases} reclaimed, {case.watcher.waits} round waits on consumers, "
           f"{len(problems)} violations")
    assert not problems, "\n".join(problems[:40])


def partitions(conn):
    """(name, range_from, range_to, sealed, sealed_at) of every partition, oldest first."""
    return conn.execute("SELECT partition::text, range_from, range_to, sealed_at IS NOT NULL, sealed_at"
                        "  FROM idempotency.partitions ORDER BY range_from").fetchall()


def round_waits_for(case, consumer):
    """Runs a maintenance round in a session of its own while `consumer` (a session) keeps its transaction
    open, then commits the consumer's transaction; returns whether the round waited for the consumer on
    anything but a relation lock (a row, a transaction or an advisory lock: held until the consumer's
    transaction ends; a relation lock it waits for at most drop_lock_timeout). Polled until the round ends
    or is seen waiting: no time bound decides."""
    consumer_pid = consumer.execute("SELECT pg_backend_pid()").fetchone()[0]
    blocked = False
    with case.connect(MAINT_APP) as m:
        round_pid = m.execute("SELECT pg_backend_pid()").fetchone()[0]
        t = threading.Thread(target=lambda: case.round(m), daemon=True)
        try:
            with case.server.cluster.connect() as watch:
                t.start()
                while t.is_alive() and not blocked:
                    blocked = watch.execute(
                        "SELECT %s::int = ANY (pg_blocking_pids(%s::int)) AND EXISTS (SELECT FROM pg_locks"
                        " WHERE pid = %s::int AND NOT granted AND locktype <> 'relation')",
                        (consumer_pid, round_pid, round_pid)).fetchone()[0]
        finally:
            consumer.execute("COMMIT")
            t.join()
    return blocked

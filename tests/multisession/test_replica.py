"""The extension on a streaming-replication pair: reads on a hot standby, writes refused there and in
read-only transactions, promotion after load, and the maintenance worker on the primary only.

Clusters of its own (tests/ports: "replica", sockets and data under /tmp/idem-replica-<port>), not the
session `cluster` of conftest.py: the primary preloads the library and a standby streams from it.
The module's tests share one pair; the promotion test, last in the file, ends it (its old primary is
stopped with -m immediate, its standby becomes the primary). Every wait has a deadline and fails
when it passes.
"""
import os
import pathlib
import random
import re
import shutil
import subprocess
import threading
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

import pgtools

PG_BIN = pgtools.pg().bindir
PRIMARY_PORT = pgtools.port("replica", 0)
STANDBY_PORT = pgtools.port("replica", 1)
DB = "idem_replica"
SCOPE = "seed"

# The standby premakes more partitions than the primary: the partitions it gains after promotion
# can only come from a maintenance round on the new primary (a standby writes nothing).
PRIMARY_PREMAKE = 4
STANDBY_PREMAKE = 7

PRIMARY_CONF = [
    "shared_preload_libraries = 'idempotency'",
    f"idempotency.database = '{DB}'",
    "idempotency.maintenance_interval = '1s'",
    f"idempotency.premake = {PRIMARY_PREMAKE}",
    "wal_level = replica",
    "max_wal_senders = 5",
    "synchronous_commit = on",
    "hot_standby = on",
    "fsync = on",
    "max_connections = 50",
]

# Local connections only (unix sockets), trusted, including replication connections.
HBA = """\
local all         all trust
local replication all trust
"""

# Anything that would betray Rust internals in an error a user sees.
RUST_MARKERS = ("pgrx", "panic", "backtrace", ".rs:", "rust_begin_unwind", "std::")


def as_postgres(*cmd, check=True):
    return pgtools.as_postgres(cmd, check=check, capture_output=True, text=True)


class Node(pgtools.Cluster):
    """One cluster: data directory, socket directory, server log outside the data directory (so
    pg_basebackup does not copy it). Its postgresql.conf is written by setup_pair, not by init()."""

    def __init__(self, port):
        self.base = pathlib.Path(f"/tmp/idem-replica-{port}")
        # Socket files live in the base directory. No RUST_BACKTRACE for these servers.
        super().__init__(port, sockdir=self.base, pgdata=self.base / "data", logfile=self.base / "server.log",
                         server_env={})
        self.pgdata = pathlib.Path(self.pgdata)
        self.started = False

    def prepare(self):
        if (self.pgdata / "postmaster.pid").exists():
            self.pg_ctl("stop", "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.base, ignore_errors=True)
        subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", "-m", "700", str(self.base)],
                       check=True)

    def start(self):
        self.started = True  # before pg_ctl: a start that fails half-way is still stopped
        super().start(timeout=60)

    def stop(self, mode="fast"):
        if self.started:
            super().stop(mode)
            self.started = False

    def connect(self, dbname=DB, autocommit=True, statement_timeout_ms=30000):
        return super().connect(dbname, autocommit=autocommit, statement_timeout_ms=statement_timeout_ms)

    def worker_processes(self):
        """Children of this postmaster whose process title mentions idempotency (launcher or
        maintenance), whether or not they show in pg_stat_activity."""
        out = subprocess.run(["pgrep", "-a", "-P", str(self.postmaster_pid())],
                             capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if "idempotency" in line]

    def log_text(self):
        return self.log_since()

    def log_tail(self, n=30):
        return "\n".join(self.log_text().splitlines()[-n:])


def one(conn, sql, *args):
    row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


def wait_for(what, predicate, timeout=20.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(interval)


def wait_replayed(primary_conn, standby_conn, timeout=30.0):
    """Wait until the standby replayed everything the primary has written so far."""
    lsn = one(primary_conn, "SELECT pg_current_wal_lsn()::text")
    wait_for(f"standby replay to reach {lsn}",
             lambda: one(standby_conn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn),
             timeout=timeout, interval=0.05)
    return lsn


STATUS_COLUMNS = ("status", "attempts", "token", "payload", "error", "created_at", "updated_at",
                  "expires_at")


def status(conn, key, scope=SCOPE):
    rows = conn.execute(f"SELECT {', '.join(STATUS_COLUMNS)} FROM idem_status(%s, scope => %s)",
                        (key, scope)).fetchall()
    assert len(rows) <= 1, f"idem_status({key!r}) returned {len(rows)} rows"
    return dict(zip(STATUS_COLUMNS, rows[0])) if rows else None


def claim_committed(conn, key, scope=SCOPE, ttl="1 hour"):
    """Two-transaction mode, step 1: claim and commit; returns the token."""
    conn.execute("BEGIN")
    outcome, token = conn.execute(
        "SELECT outcome, token FROM idem_claim(%s, ttl => %s::interval, scope => %s)",
        (key, ttl, scope)).fetchone()
    conn.execute("COMMIT")
    assert outcome == "claimed", f"claim of {key!r}: {outcome}"
    return token


def partitions(conn):
    return conn.execute("SELECT partition::text, range_from, range_to FROM idempotency.partitions "
                        "ORDER BY range_from NULLS LAST, partition::text").fetchall()


def offsets(conn, group):
    return conn.execute("SELECT topic, partition, next_offset, generation, updated_at "
                        "FROM idem_offsets(%s)", (group,)).fetchall()


def token_seq(conn):
    return conn.execute("SELECT last_value, is_called FROM idempotency.token_seq").fetchone()


def rust_leaks(err):
    """Fields of a server error that contain a Rust internal, as (field, marker, text)."""
    leaks = []
    for field in ("message_primary", "message_detail", "message_hint", "context"):
        text = getattr(err.diag, field) or ""
        for marker in RUST_MARKERS:
            if marker in text.lower():
                leaks.append((field, marker, text))
    return leaks


class Pair:
    """The primary, the standby, and what the seed data looked like when it was committed."""

    def __init__(self):
        self.primary = Node(PRIMARY_PORT)
        self.standby = Node(STANDBY_PORT)
        self.held_token = None
        self.batch_tokens = None
        self.seed_tokens = []


def setup_pair(pair):
    primary, standby = pair.primary, pair.standby
    primary.prepare()
    standby.prepare()
    as_postgres(PG_BIN / "initdb", "-D", primary.pgdata, "-A", "trust", "-U", "postgres", "--no-sync")
    primary.append_conf([f"port = {primary.port}", "listen_addresses = ''",
                         f"unix_socket_directories = '{primary.sockdir}'", *PRIMARY_CONF])
    (primary.pgdata / "pg_hba.conf").write_text(HBA)
    primary.start()
    with primary.connect("postgres") as admin:
        admin.execute(f"CREATE DATABASE {DB}")
    with primary.connect() as conn:
        pgtools.install_extension(conn)
        # The business table of the load: no unique constraint, so a duplicate shows as a second row.
        conn.execute("CREATE TABLE replica_effects (key text NOT NULL, worker int NOT NULL)")

    as_postgres(PG_BIN / "pg_basebackup", "-D", standby.pgdata, "-h", primary.sockdir, "-p", primary.port,
                "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
    # The copied postgresql.conf is the primary's: the later lines override it.
    standby.append_conf([f"port = {standby.port}", f"unix_socket_directories = '{standby.sockdir}'",
                         "hot_standby = on", f"idempotency.premake = {STANDBY_PREMAKE}"])
    standby.start()

    # Seed data, committed on the primary after the standby started: it reaches the standby only
    # by streaming.
    with primary.connect() as conn:
        t = claim_committed(conn, "done")
        conn.execute("SELECT idem_complete('done', '{\"seed\": \"done\"}', scope => %s, token => %s)",
                     (SCOPE, t))
        pair.seed_tokens.append(t)
        pair.held_token = claim_committed(conn, "held")
        pair.seed_tokens.append(pair.held_token)
        conn.execute("BEGIN")
        rows = conn.execute("SELECT key, outcome, token FROM idem_claim_batch(ARRAY['hb1', 'hb2'], "
                            "ttl => '1 hour', scope => %s)", (SCOPE,)).fetchall()
        conn.execute("COMMIT")
        assert [r[1] for r in rows] == ["claimed", "claimed"], rows
        pair.batch_tokens = [r[2] for r in rows]
        pair.seed_tokens += pair.batch_tokens
        t = claim_committed(conn, "failed")
        pair.seed_tokens.append(t)
        assert one(conn, "SELECT idem_fail('failed', '{\"seed\": \"failed\"}', retryable => false, "
                         "scope => %s, token => %s)", SCOPE, t) == "failed"
        assert one(conn, "SELECT idem_once('once', scope => %s)", SCOPE) is True
        for topic, part, off, gen in (("orders", 0, 41, 1), ("orders", 1, 7, 1), ("refunds", 0, 3, 2)):
            assert one(conn, "SELECT idem_record_offset('seed-group', %s, %s, %s, generation => %s)",
                       topic, part, off, gen) is True
        with standby.connect() as sconn:
            wait_replayed(conn, sconn)


@pytest.fixture(scope="module")
def pair():
    if os.geteuid() == 0 and shutil.which("sudo") is None:
        pytest.fail("running as root needs sudo to run initdb and pg_ctl as postgres")
    p = Pair()
    try:
        setup_pair(p)
        yield p
    finally:
        p.standby.stop()
        p.primary.stop()


# --- 5. the launcher and the maintenance worker in pg_stat_activity (on the primary) ----------

@pytest.mark.native_only("the background worker")
def test_launcher_and_maintenance_worker_show_in_pg_stat_activity(pair, report):
    seen = {}
    samples = 0
    started = time.monotonic()
    with pair.primary.connect() as conn:
        deadline = started + 20.0
        # From PostgreSQL 18 a starting backend is in pg_stat_activity before it has connected to its
        # database (datname NULL until then): a maintenance worker counts once its database shows.
        while time.monotonic() < deadline and not ("idempotency launcher" in seen
                                                    and seen.get("idempotency maintenance", set()) - {None}):
            for backend_type, datname in conn.execute(
                    "SELECT backend_type, datname FROM pg_stat_activity "
                    "WHERE backend_type IN ('idempotency launcher', 'idempotency maintenance')"):
                seen.setdefault(backend_type, set()).add(datname)
            samples += 1
            time.sleep(0.002)
    elapsed = time.monotonic() - started
    assert "idempotency launcher" in seen, (
        f"no 'idempotency launcher' row in pg_stat_activity in {samples} samples over {elapsed:.1f}s; "
        f"processes: {pair.primary.worker_processes()}")
    assert seen["idempotency launcher"] == {None}, \
        f"the launcher connects to no database, but pg_stat_activity shows datname {seen['idempotency launcher']}"
    assert "idempotency maintenance" in seen, (
        f"no 'idempotency maintenance' row in pg_stat_activity in {samples} samples over {elapsed:.1f}s")
    assert seen["idempotency maintenance"] - {None} == {DB}, \
        f"maintenance worker datname {seen['idempotency maintenance']}, expected {{{DB!r}}}"
    report(f"launcher and a maintenance round seen after {samples} samples, {elapsed:.2f}s")


# --- 1. reads on the hot standby ---------------------------------------------------------------

def test_standby_reads_what_the_primary_committed(pair):
    with pair.primary.connect() as p, pair.standby.connect() as s:
        wait_replayed(p, s)
        assert one(s, "SELECT pg_is_in_recovery()") is True
        for key in ("done", "held", "hb1", "hb2", "failed", "once"):
            on_primary = status(p, key)
            assert on_primary is not None, f"seed key {key!r} missing on the primary"
            assert status(s, key) == on_primary, f"idem_status({key!r}) differs on the standby"
        # Spot checks of the values themselves, not only of their agreement.
        done = status(s, "done")
        assert (done["status"], done["payload"]) == ("completed", {"seed": "done"})
        held = status(s, "held")
        assert (held["status"], held["token"]) == ("pending", pair.held_token)
        failed = status(s, "failed")
        assert (failed["status"], failed["error"]) == ("failed", {"seed": "failed"})
        assert status(s, "once")["status"] == "completed"
        assert status(s, "never-claimed") is None

        assert offsets(s, "seed-group") == offsets(p, "seed-group")
        assert [(t, part, n, g) for t, part, n, g, _ in offsets(s, "seed-group")] == \
            [("orders", 0, 42, 1), ("orders", 1, 8, 1), ("refunds", 0, 4, 2)]
        assert s.execute("SELECT topic, partition, next_offset FROM idem_offsets('seed-group', "
                         "topic => 'refunds')").fetchall() == [("refunds", 0, 4)]
        assert one(s, "SELECT idem_next_offset('seed-group', 'orders', 0)") == 42
        assert one(s, "SELECT idem_next_offset('seed-group', 'orders', 9)") is None
        assert offsets(s, "no-such-group") == []

        # The health snapshot and the dead letters are the primary's (computed from the replayed rows).
        health = "SELECT scope, retained_keys, completed_keys, in_flight, dead_letters, partitions FROM idem_metrics()"
        assert s.execute(health).fetchall() == p.execute(health).fetchall()
        letters = "SELECT scope, key, error, attempts FROM idempotency.dead_letters ORDER BY 1, 2"
        assert s.execute(letters).fetchall() == p.execute(letters).fetchall() != []
        assert one(s, "SELECT enabled FROM idem_stats()") in (True, False)

        # Every view of the storage schema answers on the standby, with the primary's columns;
        # the partitions (names and ranges) are the primary's.
        views = [r[0] for r in p.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n "
                                         "ON n.oid = c.relnamespace WHERE n.nspname = 'idempotency' "
                                         "AND c.relkind IN ('v', 'm') ORDER BY 1")]
        assert "partitions" in views
        for view in views:
            cur_p = p.execute(f"SELECT * FROM idempotency.{view}")
            cur_s = s.execute(f"SELECT * FROM idempotency.{view}")
            assert [d.name for d in cur_s.description] == [d.name for d in cur_p.description], view
            cur_s.fetchall()
        on_standby = partitions(s)
        assert on_standby == partitions(p)
        assert one(s, "SELECT count(*) FROM idempotency.partitions "
                      "WHERE range_from <= now() AND range_to > now()") == 1, \
            f"no partition holds the present on the standby: {on_standby}"


# --- 2. writing functions refused on the standby and in read-only transactions -----------------

def writing_calls(pair):
    """(function name, SQL) for every writing function, each a call that would succeed on a
    writable primary (real tokens of held keys, new keys, future as_of)."""
    t = pair.held_token
    b1, b2 = pair.batch_tokens
    return [
        ("idem_claim", f"SELECT * FROM idem_claim('fresh-1', scope => '{SCOPE}')"),
        ("idem_complete", f"SELECT idem_complete('held', '{{\"x\": 1}}', scope => '{SCOPE}', token => {t})"),
        ("idem_fail", f"SELECT idem_fail('held', '{{\"x\": 1}}', scope => '{SCOPE}', token => {t})"),
        ("idem_heartbeat", f"SELECT idem_heartbeat('held', ttl => '2 hours', scope => '{SCOPE}', token => {t})"),
        ("idem_once", f"SELECT idem_once('fresh-2', scope => '{SCOPE}')"),
        ("idem_claim_batch", f"SELECT * FROM idem_claim_batch(ARRAY['fresh-3', 'fresh-4'], scope => '{SCOPE}')"),
        ("idem_complete_batch", "SELECT idem_complete_batch(ARRAY['hb1', 'hb2'], "
                                "ARRAY['{\"b\": 1}', '{\"b\": 2}']::jsonb[], "
                                f"scope => '{SCOPE}', tokens => ARRAY[{b1}, {b2}]::bigint[])"),
        ("idem_once_batch", f"SELECT * FROM idem_once_batch(ARRAY['fresh-5', 'fresh-6'], scope => '{SCOPE}')"),
        ("idem_record_offset", "SELECT idem_record_offset('seed-group', 'orders', 0, 100)"),
        ("idem_reset_offset", "SELECT idem_reset_offset('seed-group', 'orders', 1, 0)"),
        ("idem_maintenance", "SELECT * FROM idem_maintenance(now() + interval '30 days')"),
        ("idem_partman_handover", "SELECT idem_partman_handover()"),
        ("idempotency.premake_partitions", "SELECT idempotency.premake_partitions(now() + interval '60 days')"),
        ("idempotency.seal_partition", "SELECT idempotency.seal_partition("
                                       "(SELECT partition::oid FROM idempotency.partitions ORDER BY range_from LIMIT 1))"),
        ("idem_redrive", f"SELECT idem_redrive('failed', scope => '{SCOPE}')"),
        ("idem_redrive_scope", f"SELECT idem_redrive_scope('{SCOPE}')"),
        ("idem_forget", f"SELECT idem_forget('done', scope => '{SCOPE}')"),
    ]


# The reading functions, which work on a standby (test_standby_reads_what_the_primary_committed), and the
# pure key and fingerprint helpers.
READING = {"idem_status", "idem_offsets", "idem_next_offset", "idem_key", "idem_fingerprint", "idem_metrics",
           "idempotency.partition_range", "idempotency.delegated_functions"}
# The statistics are each server's own shared memory: they work on a standby too, where they count
# nothing (it writes nothing) and their reset touches only the standby's.
STATISTICS = {"idem_stats", "idem_stats_reset", "idempotency.scope_stats", "idempotency.stats_totals",
              "idempotency.maintenance_state"}
# Writes nothing: maintenance's helper that takes a seal's SHARE lock (the seal itself, seal_partition, is a
# writing function above).
LOCKING = {"idempotency.seal_lock"}
# Citus only (tests/citus): they refuse to run without a Citus coordinator before writing anything.
CITUS = {"idem_distribute", "idem_move_records", "idempotency.refuse_undelegated"}
# The statement trigger of idempotency.scope_grants: it runs only after a write to that table, which a
# standby refuses (the grant functions below).
TRIGGERS = {"idempotency.scope_grants_changed"}


def helper_calls(conn):
    """(name, SQL) for the PL/pgSQL helpers that maintenance uses. They write too, and must be refused
    with 25006 as well; their message is PostgreSQL's own (it names the statement, not the function)."""
    newest, current = conn.execute(
        "SELECT (SELECT partition::text FROM idempotency.partitions ORDER BY range_from DESC LIMIT 1), "
        "(SELECT partition::text FROM idempotency.partitions WHERE range_from <= now() AND range_to > now())"
    ).fetchone()
    assert newest and current, f"no partitions to pass to the helpers: newest {newest}, current {current}"
    return [
        ("idempotency.drop_partition", f"SELECT idempotency.drop_partition('{newest}', 100)"),
        ("idempotency.index_partition", f"SELECT idempotency.index_partition('{current}')"),
        # idem_move_records' half on the target worker (it runs anywhere: a standby refuses its writes).
        ("idempotency.adopt_records", "SELECT idempotency.adopt_records('[]')"),
        # Scope grants write idempotency.scope_grants (SQL functions: PostgreSQL's own message).
        ("idem_grant_scope", "SELECT idem_grant_scope('postgres', 'x')"),
        ("idem_revoke_scope", "SELECT idem_revoke_scope('postgres', 'x')"),
        ("idem_grant_group", "SELECT idem_grant_group('postgres', 'x')"),
        ("idem_revoke_group", "SELECT idem_revoke_group('postgres', 'x')"),
        ("idempotency.grant_pattern", "SELECT idempotency.grant_pattern('postgres', 'scope', 'x', false)"),
    ]


def extension_functions(conn):
    return {r[0] for r in conn.execute(
        "SELECT CASE WHEN n.nspname = 'idempotency' THEN 'idempotency.' ELSE '' END || p.proname "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e' "
        "JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'")}


def footprint(conn):
    """What a writing call could change: the seed keys, new keys, offsets, partitions, tokens."""
    keys = ("done", "held", "hb1", "hb2", "failed", "once") + tuple(f"fresh-{i}" for i in range(1, 7))
    return {
        "keys": {k: status(conn, k) for k in keys},
        "offsets": offsets(conn, "seed-group"),
        "partitions": partitions(conn),
        "token_seq": token_seq(conn),
        "records": one(conn, "SELECT count(*) FROM idempotency.records"),
    }


def check_refused(conn, name, sql, in_transaction, named=True):
    """Run one writing call; return a list of problems (empty when it was refused as it must be:
    25006 at once, with the function's name first in the message unless named is false)."""
    problems = []
    if in_transaction:
        conn.execute("BEGIN READ ONLY")
    started = time.monotonic()
    try:
        conn.execute(sql).fetchall()
    except psycopg.Error as e:
        elapsed = time.monotonic() - started
        msg = e.diag.message_primary or ""
        if e.sqlstate != "25006":
            problems.append(f"{name}: SQLSTATE {e.sqlstate} ({msg!r}), expected 25006")
        names = (name, name.split(".")[-1])
        if named and not msg.startswith(names):
            problems.append(f"{name}: message {msg!r} does not start with the function's name")
        if "read-only" not in msg:
            problems.append(f"{name}: message {msg!r} does not say read-only")
        for field, marker, text in rust_leaks(e):
            problems.append(f"{name}: {field} contains {marker!r}: {text!r}")
        if elapsed > 2.0:
            problems.append(f"{name}: refused only after {elapsed:.1f}s")
    else:
        problems.append(f"{name}: succeeded, expected SQLSTATE 25006")
    finally:
        if in_transaction:
            conn.execute("ROLLBACK")
    # The session stays usable.
    assert one(conn, "SELECT 1") == 1
    return problems


@pytest.mark.native_only("the list of functions read from the extension's pg_depend entries")
def test_standby_refuses_every_writing_function(pair):
    with pair.primary.connect() as p, pair.standby.connect() as s:
        wait_replayed(p, s)
        before_s, before_p = footprint(s), footprint(p)
        # (The sequence is not compared across servers: its WAL runs ahead of its value.)
        assert before_s["keys"] == before_p["keys"] and before_s["offsets"] == before_p["offsets"]
        # Every function of the extension is covered here or by the reading test: a new one must
        # be added to one of the lists.
        covered = READING | STATISTICS | LOCKING | CITUS | TRIGGERS | {n for n, _ in writing_calls(pair)} | {n for n, _ in helper_calls(s)}
        assert extension_functions(s) == covered
        problems = []
        for name, sql in writing_calls(pair):
            problems += check_refused(s, name, sql, in_transaction=False)
        for name, sql in helper_calls(s):
            problems += check_refused(s, name, sql, in_transaction=False, named=False)
        assert not problems, "\n".join(problems)
        assert footprint(s) == before_s
        # The primary did not change either (nothing was forwarded there).
        assert footprint(p) == before_p


@pytest.mark.native_only("the list of functions read from the extension's pg_depend entries (adopt_records)")
def test_read_only_transaction_on_the_primary_refuses_every_writing_function(pair):
    with pair.primary.connect() as p:
        before = footprint(p)
        assert before["keys"]["held"]["status"] == "pending"
        assert all(before["keys"][f"fresh-{i}"] is None for i in range(1, 7))
        problems = []
        for name, sql in writing_calls(pair):
            problems += check_refused(p, name, sql, in_transaction=True)
        for name, sql in helper_calls(p):
            problems += check_refused(p, name, sql, in_transaction=True, named=False)
        assert not problems, "\n".join(problems)
        assert footprint(p) == before, "a refused call in a read-only transaction wrote something"
        # The same session can still write in a read-write transaction.
        p.execute("BEGIN")
        assert one(p, "SELECT outcome FROM idem_claim('fresh-1', scope => %s)", SCOPE) == "claimed"
        p.execute("ROLLBACK")
        assert status(p, "fresh-1") is None


# --- 4, before promotion: no maintenance on the standby ------------------------------------------

def standby_has_no_worker(pair):
    with pair.standby.connect() as s:
        rows = s.execute("SELECT backend_type, datname FROM pg_stat_activity "
                         "WHERE backend_type LIKE 'idempotency%'").fetchall()
    assert rows == [], f"maintenance processes in the standby's pg_stat_activity: {rows}"
    procs = pair.standby.worker_processes()
    assert procs == [], f"maintenance processes running on the standby: {procs}"
    assert "idempotency launcher started" not in pair.standby.log_text()


@pytest.mark.native_only("the background worker")
def test_standby_runs_no_maintenance_worker(pair):
    # Time for several rounds had the worker been running there (interval 1s).
    time.sleep(2.5)
    standby_has_no_worker(pair)
    with pair.primary.connect() as p, pair.standby.connect() as s:
        wait_replayed(p, s)
        # The standby is configured to premake more partitions than the primary, and has not.
        assert one(s, "SHOW idempotency.premake") == str(STANDBY_PREMAKE)
        assert partitions(s) == partitions(p)


# --- 3 and 4: promotion after load ---------------------------------------------------------------

LOAD_SESSIONS = 4
LOAD_SECONDS = 4.0


class Acked:
    """What one load session's primary acknowledged (COMMIT returned)."""

    def __init__(self):
        self.keys = {}       # key -> (status, token, payload) as acknowledged
        self.once = []       # idem_once keys whose business row committed
        self.offsets = {}    # (group, topic, partition) -> highest acknowledged processed offset
        self.tokens = []     # every token a claim returned
        self.calls = 0


def load_session(node, w, stop, acked):
    rnd = random.Random(1000 + w)
    group = f"load-group-{w}"
    next_offset = {p: 0 for p in range(3)}
    with node.connect(statement_timeout_ms=20000) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            op = i % 5
            key = f"w{w}-{i}"
            if op in (0, 1):
                # Two-transaction mode: claim, commit; (op 0) complete with a payload, commit.
                conn.execute("BEGIN")
                outcome, token = conn.execute(
                    "SELECT outcome, token FROM idem_claim(%s, ttl => '10 minutes', scope => 'load')",
                    (key,)).fetchone()
                conn.execute("COMMIT")
                assert outcome == "claimed", (key, outcome)
                acked.keys[key] = ("pending", token, None)
                acked.tokens.append(token)
                if op == 0:
                    payload = {"worker": w, "i": i, "pad": "x" * rnd.randrange(0, 200)}
                    conn.execute("BEGIN")
                    conn.execute("SELECT idem_complete(%s, %s::jsonb, scope => 'load', token => %s)",
                                 (key, Jsonb(payload), token))
                    conn.execute("COMMIT")
                    acked.keys[key] = ("completed", token, payload)
            elif op == 2:
                # One-transaction mode: idem_once guards the business row.
                conn.execute("BEGIN")
                cur = conn.execute("INSERT INTO replica_effects (key, worker) SELECT %s, %s "
                                   "WHERE idem_once(%s, scope => 'load')", (key, w, key))
                assert cur.rowcount == 1, (key, cur.rowcount)
                conn.execute("COMMIT")
                acked.once.append(key)
            elif op == 3:
                part = rnd.randrange(3)
                next_offset[part] += rnd.randrange(1, 6)
                conn.execute("BEGIN")
                advanced = one(conn, "SELECT idem_record_offset(%s, 'topic', %s, %s, generation => 1)",
                               group, part, next_offset[part])
                conn.execute("COMMIT")
                assert advanced is True, (group, part, next_offset[part])
                acked.offsets[(group, "topic", part)] = next_offset[part]
            else:
                # A batch: claim five keys and complete them in the same transaction.
                keys = [f"{key}-b{j}" for j in range(5)]
                payloads = [{"batch": k} for k in keys]
                conn.execute("BEGIN")
                rows = conn.execute("SELECT key, outcome, token FROM idem_claim_batch(%s, scope => 'load')",
                                    (keys,)).fetchall()
                assert [r[1] for r in rows] == ["claimed"] * 5, rows
                done = one(conn, "SELECT idem_complete_batch(%s, %s::jsonb[], scope => 'load')",
                           keys, [Jsonb(pl) for pl in payloads])
                conn.execute("COMMIT")
                assert done == 5
                for (k, _, token), pl in zip(rows, payloads):
                    acked.keys[k] = ("completed", token, pl)
                    acked.tokens.append(token)
            acked.calls += 1


def run_load(node):
    stop = threading.Event()
    acked = [Acked() for _ in range(LOAD_SESSIONS)]
    errors = []

    def wrap(w):
        try:
            load_session(node, w, stop, acked[w])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((w, e))

    threads = [threading.Thread(target=wrap, args=(w,), daemon=True) for w in range(LOAD_SESSIONS)]
    for t in threads:
        t.start()
    time.sleep(LOAD_SECONDS)
    stop.set()
    for t in threads:
        t.join(30)
    assert not [t for t in threads if t.is_alive()], "load sessions still running 30s after the stop"
    if errors:
        w, e = errors[0]
        raise AssertionError(f"load session {w} failed: {type(e).__name__}: {e}") from e
    return acked


@pytest.mark.native_only("the maintenance worker premaking partitions on the new primary")
def test_promotion_after_load(pair, report):
    primary, standby = pair.primary, pair.standby
    acked = run_load(primary)
    keys = {k: v for a in acked for k, v in a.keys.items()}
    once_keys = [k for a in acked for k in a.once]
    acked_offsets = {pos: off for a in acked for pos, off in a.offsets.items()}
    tokens = [t for a in acked for t in a.tokens] + pair.seed_tokens
    completed = sum(1 for s, _, _ in keys.values() if s == "completed")
    assert completed > 50 and len(keys) - completed > 10 and len(once_keys) > 10 and acked_offsets, \
        "the load acknowledged too little to test anything"

    with primary.connect() as p:
        future_before = one(p, "SELECT count(*) FROM idempotency.partitions WHERE range_from > now()")
        with standby.connect() as s:
            lsn = wait_replayed(p, s)
    standby_has_no_worker(pair)
    log_offset = len(standby.log_text())
    primary.stop(mode="immediate")
    promote_started = time.monotonic()
    standby.pg_ctl("-w", "-t", "60", "promote")

    with standby.connect() as n:
        assert one(n, "SELECT pg_is_in_recovery()") is False

        # 4: the launcher starts on the new primary, and its first rounds premake the standby's
        # larger premake (nothing else on this server creates partitions ahead until the manual
        # calls further down).
        launcher = wait_for("an 'idempotency launcher' row on the new primary", lambda: n.execute(
            "SELECT backend_type, datname FROM pg_stat_activity "
            "WHERE backend_type = 'idempotency launcher'").fetchall(), timeout=15, interval=0.05)
        launcher_after = time.monotonic() - promote_started
        assert launcher == [("idempotency launcher", None)]
        ahead = "SELECT count(*) FROM idempotency.partitions WHERE range_from > now()"
        wait_for("partitions premade by the worker on the new primary",
                 lambda: one(n, ahead) > future_before, timeout=15)
        future_after = one(n, ahead)
        wait_for("the worker's LOG line on the new primary", lambda: re.search(
            rf'idempotency maintenance of "{DB}": [1-9]\d* partitions created',
            standby.log_text()[log_offset:]), timeout=10)

        # Every acknowledged key is there as acknowledged, and claims answer accordingly.
        wrong = []
        for key, (st, token, payload) in keys.items():
            got = status(n, key, "load")
            if got is None or (got["status"], got["token"], got["payload"]) != (st, token, payload):
                wrong.append(f"{key}: acknowledged {(st, token, payload)}, found "
                             f"{None if got is None else (got['status'], got['token'], got['payload'])}")
                continue
            outcome, c_payload = n.execute("SELECT outcome, payload FROM idem_claim(%s, scope => 'load', "
                                           "wait => false)", (key,)).fetchone()
            expected = ("completed", payload) if st == "completed" else ("in_progress", None)
            if (outcome, c_payload if st == "completed" else None) != expected:
                wrong.append(f"{key}: acknowledged {st}, idem_claim answers {outcome} {c_payload}")
        assert not wrong, f"{len(wrong)} of {len(keys)} acknowledged keys wrong after promotion:\n" + \
            "\n".join(wrong[:20])

        # idem_once of acknowledged keys is false, and each business row exists exactly once.
        n.execute("BEGIN")
        again = [k for k in once_keys if one(n, "SELECT idem_once(%s, scope => 'load')", k) is not False]
        n.execute("ROLLBACK")
        assert not again, f"idem_once true again after promotion for {len(again)} keys: {again[:10]}"
        counts = dict(n.execute("SELECT key, count(*) FROM replica_effects GROUP BY key").fetchall())
        missing = [k for k in once_keys if counts.get(k) != 1]
        assert not missing, f"business rows not exactly once: {[(k, counts.get(k)) for k in missing[:10]]}"

        # Every acknowledged offset is at least what was acknowledged.
        behind = []
        for (group, topic, part), off in acked_offsets.items():
            nxt = one(n, "SELECT idem_next_offset(%s, %s, %s)", group, topic, part)
            if nxt is None or nxt < off + 1:
                behind.append(((group, topic, part), off + 1, nxt))
        assert not behind, f"offsets behind what was acknowledged (position, expected, found): {behind}"

        # New claims get tokens above every token the old primary handed out.
        new_token = one(n, "SELECT token FROM idem_claim('after-promotion', scope => 'load')")
        assert new_token > max(tokens), f"new token {new_token} <= {max(tokens)} seen on the old primary"

        # Writing functions work now.
        n.execute("SELECT idem_complete('after-promotion', '{\"new\": true}', scope => 'load', token => %s)",
                  (new_token,))
        assert status(n, "after-promotion", "load")["status"] == "completed"
        assert one(n, "SELECT idem_once('after-once', scope => 'load')") is True
        t = one(n, "SELECT token FROM idem_claim('after-hb', scope => 'load')")
        assert one(n, "SELECT idem_heartbeat('after-hb', ttl => '1 hour', scope => 'load', token => %s)", t)
        assert one(n, "SELECT idem_fail('after-hb', '{\"e\": 1}', retryable => false, scope => 'load', "
                      "token => %s)", t) == "failed"
        n.execute("BEGIN")
        assert [r[0] for r in n.execute("SELECT outcome FROM idem_claim_batch(ARRAY['ab1', 'ab2'], "
                                        "scope => 'load')")] == ["claimed", "claimed"]
        assert one(n, "SELECT idem_complete_batch(ARRAY['ab1', 'ab2'], scope => 'load')") == 2
        n.execute("COMMIT")
        assert n.execute("SELECT * FROM idem_once_batch(ARRAY['ao1', 'ao2'], scope => 'load')"
                         ).fetchall() == [("ao1",), ("ao2",)]
        (group, topic, part), off = next(iter(acked_offsets.items()))
        assert one(n, "SELECT idem_record_offset(%s, %s, %s, %s)", group, topic, part, off + 100) is True
        n.execute("SELECT idem_reset_offset('after-group', 'topic', 0, 5)")
        assert one(n, "SELECT idem_next_offset('after-group', 'topic', 0)") == 5
        n.execute("SELECT idempotency.premake_partitions()")
        n.execute("SELECT * FROM idem_maintenance()")
        with pytest.raises(psycopg.Error) as handover:
            n.execute("SELECT idem_partman_handover()")  # refused under the builtin manager
        assert handover.value.sqlstate != "25006", handover.value.diag.message_primary

    report(f"{sum(a.calls for a in acked)} acknowledged calls from {LOAD_SESSIONS} sessions in "
           f"{LOAD_SECONDS:.0f}s ({len(keys)} keys, {completed} completed, {len(once_keys)} idem_once, "
           f"{len(acked_offsets)} offsets), replayed to {lsn}; all found after promotion; launcher up "
           f"{launcher_after:.1f}s after promote, future partitions {future_before} -> {future_after}")

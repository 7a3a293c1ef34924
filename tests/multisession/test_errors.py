"""PostgreSQL's own errors raised inside the extension reach the client as PostgreSQL raised them.

Each case provokes one error in the middle of a call (a timeout or a cancel while the call waits for a
key's lock, a read-only transaction, a serialization failure, a deadlock, a full disk) and checks what a
client sees: the SQLSTATE, the message as PostgreSQL words it, DETAIL and HINT where PostgreSQL gives
them (and none where it gives none), and that no field of the error (message, detail, hint, context)
contains Rust internals ("pgrx", "panic", "backtrace", ".rs:", "rust_begin_unwind", "core::", "std::").
The server runs with RUST_BACKTRACE=1 (conftest.SERVER_ENV, checked below in the postmaster's
environment): pgrx would then append a Rust backtrace to the DETAIL of an error that crossed the
extension's frames, so these checks can fail. After each error the session must still work, hold none
of the extension's key locks, and the failed call must have written nothing.
"""
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid

import psycopg
import pytest

import pgtools
from conftest import SERVER_ENV
from idemlib import rollback_quietly, rust_internals

LOCK_OBJSUBID = 18756  # the extension's advisory-lock namespace, as documented


def new_scope(tag):
    return f"err-{tag}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def srv(cluster):
    """The session cluster, after checking that its server runs with SERVER_ENV."""
    pid = int(pathlib.Path(cluster.pgdata, "postmaster.pid").read_text().split()[0])
    env = pgtools.process_environ(pid)
    for k, v in SERVER_ENV.items():
        assert env.get(k) == v, (f"the test server (postmaster {pid}) runs without {k}={v} in its environment, "
                                 f"so a Rust backtrace could not show in an error: {k}={env.get(k)!r}")
    # The partitions of today exist and are committed before the cases start: the first writing call
    # in a database creates them and holds the lock that serializes partition creators until its
    # transaction ends, so in a fresh database a waiter would wait for that lock, not for the key's.
    with cluster.connect() as conn:
        conn.execute("SELECT idempotency.premake_partitions()")
    return cluster


# --------------------------------------------------------------------------------------------------
# Helpers


def fields(e):
    d = e.diag
    return {"sqlstate": e.sqlstate, "message": d.message_primary, "detail": d.message_detail,
            "hint": d.message_hint, "context": d.context}


def assert_error(e, sqlstate, message, detail=None, hint=None):
    """The error as PostgreSQL raises it. `message`, `detail`, `hint`: an exact string, a compiled regex
    (full match), or None for "PostgreSQL gives none"."""
    f = fields(e)
    assert f["sqlstate"] == sqlstate, f"expected SQLSTATE {sqlstate}, got {f}"
    for name, want in (("message", message), ("detail", detail), ("hint", hint)):
        got = f[name]
        if isinstance(want, re.Pattern):
            assert got is not None and want.fullmatch(got), f"{name} {got!r} does not match {want.pattern!r}; {f}"
        else:
            assert got == want, f"{name}: expected {want!r}, got {got!r}; all fields: {f}"
    unclean = rust_internals(e)
    assert not unclean, f"the error carries Rust internals: {unclean}; all fields: {f}"


def backend_pid(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def key_locks(observer, pid):
    """(granted, waiting) key locks of the extension held or awaited by backend `pid`."""
    return observer.execute(
        "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) FROM pg_locks "
        "WHERE pid = %s AND locktype = 'advisory' AND objsubid = %s", (pid, LOCK_OBJSUBID)).fetchone()


def wait_for_key_lock(observer, pid, timeout=10.0):
    """Waits until backend `pid` waits for one of the extension's key locks and reports the wait.
    Returns the key locks it holds meanwhile. The SQL edition has no key locks (a new key waits in the
    unique index for the transaction that wrote it first): there, until `pid` waits for any lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pgtools.sql_edition():
            row = observer.execute(
                "SELECT a.wait_event_type, a.wait_event FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.pid = %s AND NOT l.granted", (pid,)).fetchone()
        else:
            row = observer.execute(
                "SELECT a.wait_event_type, a.wait_event FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.pid = %s AND NOT l.granted AND l.locktype = 'advisory' AND l.objsubid = %s",
                (pid, LOCK_OBJSUBID)).fetchone()
        if row and row[0] == "Lock":
            return key_locks(observer, pid)[0]
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never showed up waiting for a key lock of the extension")


class Background:
    """One statement run on another thread; `error` is the psycopg error it raised, if any."""

    def __init__(self, conn, sql, params=()):
        self.rows, self.error, self.elapsed = None, None, None
        self.done = threading.Event()

        def run():
            t = time.monotonic()
            try:
                self.rows = conn.execute(sql, params).fetchall()
            except psycopg.Error as e:
                self.error = e
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.error = e
            finally:
                self.elapsed = time.monotonic() - t
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout):
        assert self.done.wait(timeout), f"the statement did not end within {timeout}s"
        return self


def assert_session_clean(conn, observer):
    """After the failed statement: the session answers, and holds none of the extension's key locks."""
    rollback_quietly(conn)
    assert conn.execute("SELECT 1").fetchone()[0] == 1
    assert key_locks(observer, backend_pid(conn)) == (0, 0), "key locks left behind by the failed call"


def records_in(conn, scope):
    return conn.execute("SELECT count(*) FROM idempotency.records WHERE scope = %s", (scope,)).fetchone()[0]


# --------------------------------------------------------------------------------------------------
# Timeouts and cancels while a call waits for a key's lock


def test_statement_timeout_in_once_batch(srv, report):
    """statement_timeout fires while idem_once_batch of 500 keys waits for a key another session holds."""
    scope = new_scope("stmt-timeout")
    keys = [f"k{i:04d}" for i in range(500)]
    held = keys[250]
    with srv.connect() as holder, srv.connect() as waiter, srv.connect() as observer:
        holder.execute("BEGIN")
        assert holder.execute("SELECT idem_once(%s, scope => %s)", (held, scope)).fetchone()[0] is True
        pid = backend_pid(waiter)
        waiter.execute("SET statement_timeout = '2s'")
        bg = Background(waiter, "SELECT count(*) FROM idem_once_batch(%s, scope => %s)", (keys, scope))
        locks_while_waiting = wait_for_key_lock(observer, pid)
        bg.join(30)
        assert bg.error is not None, f"idem_once_batch returned {bg.rows} although a key was held"
        assert_error(bg.error, "57014", "canceling statement due to statement timeout")
        assert bg.elapsed >= 1.8, f"the error came after {bg.elapsed:.2f}s, before the 2s timeout"
        waiter.execute("RESET statement_timeout")
        assert_session_clean(waiter, observer)
        holder.execute("ROLLBACK")
        assert records_in(observer, scope) == 0, "the timed-out batch wrote records"
        assert waiter.execute("SELECT count(*) FROM idem_once_batch(%s, scope => %s)", (keys, scope)).fetchone()[0] == 500
    report(f"57014 after {bg.elapsed:.2f}s, waiting for key {held} while holding {locks_while_waiting} key locks; "
           f"fields clean")


def test_lock_timeout_in_claim(srv, report):
    """lock_timeout fires while idem_claim waits for a key another session holds."""
    scope = new_scope("lock-timeout")
    with srv.connect() as holder, srv.connect() as waiter, srv.connect() as observer:
        holder.execute("BEGIN")
        assert holder.execute("SELECT outcome FROM idem_claim('k', scope => %s)", (scope,)).fetchone()[0] == "claimed"
        pid = backend_pid(waiter)
        waiter.execute("SET lock_timeout = '1s'")
        bg = Background(waiter, "SELECT outcome FROM idem_claim('k', scope => %s)", (scope,))
        wait_for_key_lock(observer, pid)
        bg.join(30)
        assert bg.error is not None, f"idem_claim returned {bg.rows} although the key was held"
        assert_error(bg.error, "55P03", "canceling statement due to lock timeout")
        assert bg.elapsed >= 0.9, f"the error came after {bg.elapsed:.2f}s, before the 1s lock_timeout"
        waiter.execute("RESET lock_timeout")
        assert_session_clean(waiter, observer)
        holder.execute("ROLLBACK")
        assert records_in(observer, scope) == 0
    report(f"55P03 after {bg.elapsed:.2f}s; fields clean")


def test_cancel_while_blocked_in_once(srv, report):
    """pg_cancel_backend of a session blocked in idem_once."""
    scope = new_scope("cancel")
    with srv.connect() as holder, srv.connect() as waiter, srv.connect() as observer:
        holder.execute("BEGIN")
        assert holder.execute("SELECT idem_once('k', scope => %s)", (scope,)).fetchone()[0] is True
        pid = backend_pid(waiter)
        bg = Background(waiter, "SELECT idem_once('k', scope => %s)", (scope,))
        wait_for_key_lock(observer, pid)
        assert observer.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0] is True
        bg.join(30)
        assert bg.error is not None, f"idem_once returned {bg.rows} after the cancel"
        assert_error(bg.error, "57014", "canceling statement due to user request")
        assert_session_clean(waiter, observer)
        holder.execute("ROLLBACK")
        assert records_in(observer, scope) == 0
    report("57014 (user request); fields clean")


# --------------------------------------------------------------------------------------------------
# Read-only transactions


READ_ONLY_CALLS = {
    "idem_once": ("SELECT idem_once(%s, scope => %s)", lambda key, scope: (key, scope)),
    "idem_claim": ("SELECT * FROM idem_claim(%s, scope => %s)", lambda key, scope: (key, scope)),
    "idem_record_offset": ("SELECT idem_record_offset(%s, 'topic', 0, 41)", lambda key, scope: (scope,)),
}


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("fn", list(READ_ONLY_CALLS))
def test_read_only_transaction(srv, report, fn, existing):
    """A writing function in BEGIN READ ONLY fails at once with 25006, naming itself; nothing is written."""
    scope = new_scope("ro")
    sql, params = READ_ONLY_CALLS[fn]
    with srv.connect() as conn, srv.connect() as observer:
        if existing:  # a settled key / a stored position: the call would not even need to write
            conn.execute("SELECT idem_once('k', scope => %s)", (scope,))
            conn.execute("SELECT idem_record_offset(%s, 'topic', 0, 41)", (scope,))
        before = (records_in(observer, scope),
                  observer.execute("SELECT count(*), max(next_offset) FROM idempotency.offsets "
                                   "WHERE consumer_group = %s", (scope,)).fetchone())
        pid = backend_pid(conn)
        conn.execute("BEGIN READ ONLY")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, params("k", scope))
        e = info.value
        f = fields(e)
        assert e.sqlstate == "25006", f"expected 25006, got {f}"
        msg = f["message"] or ""
        assert msg.startswith(fn) and msg.endswith("cannot run in a read-only transaction"), \
            f"expected the message '{fn} cannot run in a read-only transaction', got {msg!r}"
        assert not rust_internals(e), f"the error carries Rust internals: {rust_internals(e)}; {f}"
        assert key_locks(observer, pid) == (0, 0), "the refused call took a key lock"
        conn.execute("ROLLBACK")
        after = (records_in(observer, scope),
                 observer.execute("SELECT count(*), max(next_offset) FROM idempotency.offsets "
                                  "WHERE consumer_group = %s", (scope,)).fetchone())
        assert after == before, f"the refused call changed the storage: {before} -> {after}"
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    report(f"25006 {msg!r}, hint {f['hint']!r}")


# --------------------------------------------------------------------------------------------------
# Serialization failures


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_serialization_failure_on_a_key(srv, report, level):
    """Two transactions race on one key; the one whose snapshot predates the other's commit gets 40001."""
    scope = new_scope("ser-key")
    with srv.connect() as t1, srv.connect() as t2, srv.connect() as observer:
        t1.execute(f"BEGIN ISOLATION LEVEL {level}")
        t1.execute("SELECT count(*) FROM idem_status('other', scope => %s)", (scope,))  # takes the snapshot
        assert t2.execute("SELECT idem_once('k', scope => %s)", (scope,)).fetchone()[0] is True
        with pytest.raises(psycopg.Error) as info:
            t1.execute("SELECT idem_once('k', scope => %s)", (scope,))
        e = info.value
        f = fields(e)
        assert e.sqlstate == "40001", f"expected 40001, got {f}"
        assert "could not serialize access" in (f["message"] or ""), f
        assert not rust_internals(e), f"the error carries Rust internals: {rust_internals(e)}; {f}"
        assert_session_clean(t1, observer)
        assert records_in(observer, scope) == 1
    report(f"40001 {f['message']!r}, hint {f['hint']!r}")


def test_serialization_failure_raised_by_postgres_on_an_offset(srv, report):
    """idem_record_offset under REPEATABLE READ locks a position row that another transaction updated
    after this one's snapshot: PostgreSQL's own 40001, as PostgreSQL words it."""
    group = new_scope("ser-offset")
    with srv.connect() as t1, srv.connect() as t2, srv.connect() as observer:
        t2.execute("SELECT idem_record_offset(%s, 'topic', 0, 10)", (group,))
        t1.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert t1.execute("SELECT idem_next_offset(%s, 'topic', 0)", (group,)).fetchone()[0] == 11
        assert t2.execute("SELECT idem_record_offset(%s, 'topic', 0, 20)", (group,)).fetchone()[0] is True
        with pytest.raises(psycopg.Error) as info:
            t1.execute("SELECT idem_record_offset(%s, 'topic', 0, 30)", (group,))
        assert_error(info.value, "40001", "could not serialize access due to concurrent update")
        f = fields(info.value)
        assert_session_clean(t1, observer)
        assert observer.execute("SELECT idem_next_offset(%s, 'topic', 0)", (group,)).fetchone()[0] == 21
    report(f"40001 {f['message']!r}, context {f['context']!r}")


# --------------------------------------------------------------------------------------------------
# Deadlock


DEADLOCK_LINE = r"Process (\d+) waits for ExclusiveLock on advisory lock \[\d+,\d+,\d+,%d\]; blocked by process (\d+)\." \
    % LOCK_OBJSUBID
if pgtools.sql_edition():  # no key locks: the claims wait for each other's transactions (the unique index)
    DEADLOCK_LINE = r"Process (\d+) waits for ShareLock on transaction \d+; blocked by process (\d+)\."


def test_deadlock_between_two_claims(srv, report):
    """Two sessions each hold one key and claim the other's: PostgreSQL's 40P01 with its DETAIL."""
    scope = new_scope("deadlock")
    with srv.connect() as a, srv.connect() as b, srv.connect() as observer:
        pid_a, pid_b = backend_pid(a), backend_pid(b)
        for conn, key in ((a, "k1"), (b, "k2")):
            conn.execute("BEGIN")
            assert conn.execute("SELECT outcome FROM idem_claim(%s, scope => %s)", (key, scope)).fetchone()[0] == "claimed"
        bg_a = Background(a, "SELECT outcome FROM idem_claim('k2', scope => %s)", (scope,))
        wait_for_key_lock(observer, pid_a)
        bg_b = Background(b, "SELECT outcome FROM idem_claim('k1', scope => %s)", (scope,))
        # One of the two is chosen as the victim (after deadlock_timeout); the other waits until the
        # victim's transaction ends.
        deadline = time.monotonic() + 30
        while not (bg_a.done.is_set() or bg_b.done.is_set()) and time.monotonic() < deadline:
            time.sleep(0.01)
        victim, survivor = (bg_a, bg_b) if bg_a.done.is_set() else (bg_b, bg_a)
        victim_conn, survivor_conn = (a, b) if victim is bg_a else (b, a)
        victim_pid = pid_a if victim is bg_a else pid_b
        assert victim.done.is_set(), "neither claim ended: no deadlock detected"
        assert victim.error is not None, f"the first claim to end returned {victim.rows}, expected 40P01"
        assert_error(victim.error, "40P01", "deadlock detected",
                     detail=re.compile(DEADLOCK_LINE + r"\n" + DEADLOCK_LINE),
                     hint="See server log for query details.")
        detail = victim.error.diag.message_detail
        pids = {int(p) for p in re.findall(r"\d+(?= waits for)|(?<=blocked by process )\d+", detail)}
        assert pids == {pid_a, pid_b}, f"the DETAIL names processes {pids}, the sessions are {pid_a} and {pid_b}"
        rollback_quietly(victim_conn)
        survivor.join(30)
        assert survivor.error is None, f"the survivor failed too: {survivor.error}"
        assert survivor.rows == [("claimed",)], survivor.rows
        survivor_conn.execute("COMMIT")
        assert_session_clean(victim_conn, observer)
        assert records_in(observer, scope) == 2  # the survivor's two keys
    report(f"40P01 for backend {victim_pid}; DETAIL {detail!r}")


# --------------------------------------------------------------------------------------------------
# Out of disk


DISK_DB = "idem_diskfull"
TABLESPACE = "idem_tiny"


def _run(args):
    return subprocess.run(args, capture_output=True, text=True)


def test_out_of_disk(srv, report):
    """The partition a batch writes into lives on a 2 MB tmpfs; idem_once_batch fills it until
    PostgreSQL's 53100 reaches the client intact."""
    mnt = tempfile.mkdtemp(prefix="idem-tiny-", dir="/tmp")
    r = _run(["mount", "-t", "tmpfs", "-o", "size=2M,mode=0700", "tmpfs", mnt])
    if r.returncode != 0:
        os.rmdir(mnt)
        pytest.skip(f"cannot mount a tmpfs here: `mount -t tmpfs -o size=2M tmpfs {mnt}` exited {r.returncode}: "
                    f"{(r.stderr or r.stdout).strip()}")
    how, batches, err = None, 0, None
    try:
        shutil.chown(mnt, "postgres", "postgres")
        with srv.connect(dbname="postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DISK_DB} WITH (FORCE)")
            admin.execute(f"CREATE TABLESPACE {TABLESPACE} LOCATION '{mnt}'")
            admin.execute(f"CREATE DATABASE {DISK_DB}")
            if pgtools.sql_edition():  # its partitions are made by the edition's owner (SECURITY DEFINER)
                if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pgtools.EDITION_OWNER,)).fetchone():
                    admin.execute(f"CREATE ROLE {pgtools.EDITION_OWNER} LOGIN CREATEROLE")
                admin.execute(f"GRANT CREATE ON TABLESPACE {TABLESPACE} TO {pgtools.EDITION_OWNER}")
        with srv.connect(dbname=DISK_DB) as c:
            pgtools.install_extension(c)
            # Partitions the extension creates from now on land in the small tablespace.
            c.execute(f"SET default_tablespace = {TABLESPACE}")
            made = c.execute("SELECT idempotency.premake_partitions()").fetchone()[0]
            how = f"premake_partitions() after SET default_tablespace created {made} partitions there"
            # Partitions made before (by CREATE EXTENSION, in older versions) are moved there.
            moved = 0
            for (rel,) in c.execute(
                    "SELECT c.oid::regclass::text FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid "
                    "WHERE h.inhparent = 'idempotency.records'::regclass AND c.reltablespace <> "
                    "(SELECT oid FROM pg_tablespace WHERE spcname = %s)", (TABLESPACE,)).fetchall():
                c.execute(f"ALTER TABLE {rel} SET TABLESPACE {TABLESPACE}")
                moved += 1
            for (idx,) in c.execute(
                    "SELECT i.indexrelid::regclass::text FROM pg_inherits h JOIN pg_index i ON i.indrelid = h.inhrelid "
                    "JOIN pg_class ic ON ic.oid = i.indexrelid WHERE h.inhparent = 'idempotency.records'::regclass "
                    "AND ic.reltablespace <> (SELECT oid FROM pg_tablespace WHERE spcname = %s)", (TABLESPACE,)).fetchall():
                c.execute(f"ALTER INDEX {idx} SET TABLESPACE {TABLESPACE}")
                moved += 1
            if moved:
                how += f"; {moved} partitions and indexes made before were moved there with ALTER ... SET TABLESPACE"
            c.execute("RESET default_tablespace")
            where = c.execute(
                "SELECT count(*), count(*) FILTER (WHERE c.reltablespace = (SELECT oid FROM pg_tablespace "
                "WHERE spcname = %s)) FROM idempotency.partitions p JOIN pg_class c ON c.oid = p.partition "
                "WHERE p.range_from <= now() AND p.range_to > now()", (TABLESPACE,)).fetchone()
            assert where == (1, 1), f"the partition holding now() is not in {TABLESPACE}: {where}"
            for b in range(100):  # ~1 MB of keys and index entries per batch: far more than 2 MB in all
                keys = [f"{b:03d}-{i:04d}-" + "x" * 480 for i in range(1000)]
                try:
                    c.execute("SELECT count(*) FROM idem_once_batch(%s, scope => 'disk')", (keys,))
                    batches += 1
                except psycopg.Error as e:
                    err = e
                    break
            assert err is not None, f"{batches} batches of 1,000 keys fit into a 2 MB tablespace"
            assert_error(err, "53100",
                         re.compile(r'could not extend file "[^"]+": (No space left on device|'
                                    r'wrote only \d+ of \d+ bytes at block \d+)'),
                         hint="Check free disk space.")
            assert err.diag.message_primary.endswith("No space left on device"), \
                f"a short write rather than ENOSPC: {err.diag.message_primary!r}"
            assert c.execute("SELECT 1").fetchone()[0] == 1
            assert key_locks(c, backend_pid(c)) == (0, 0)
            stored = c.execute("SELECT count(*) FROM idempotency.records WHERE scope = 'disk'").fetchone()[0]
            assert stored == 1000 * batches, f"{stored} records after {batches} committed batches and a failed one"
    finally:
        with srv.connect(dbname="postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DISK_DB} WITH (FORCE)")
            admin.execute(f"DROP TABLESPACE IF EXISTS {TABLESPACE}")
        u = _run(["umount", mnt])
        if u.returncode == 0:
            os.rmdir(mnt)
    assert u.returncode == 0, f"umount {mnt} failed: {u.stderr.strip()}"
    report(f"53100 {err.diag.message_primary!r}, hint {err.diag.message_hint!r} after {batches} batches of 1,000 "
           f"keys; {how}")

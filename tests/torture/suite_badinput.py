"""Suite 3: bad input, table-driven.

For every public function, hostile calls built from tables of hostile values, one bad argument at a
time (the others valid), plus hostile contexts (no privilege, read-only transaction, aborted
transaction, wrong types and arity, prepared statements, cursors, exception handlers):

* a call expected to fail must raise an ERROR with the SQLSTATE docs/reference.md's table documents (or, for
  values PostgreSQL itself rejects before the call, PostgreSQL's own SQLSTATE, with a message that is
  not the extension's);
* a hostile value that is valid input (quotes, SQL fragments, format specifiers, 512-byte keys,
  non-control Unicode...) must be accepted and stored byte for byte;
* a writing function in a read-only transaction fails at once with 25006 and the message
  "<function> cannot run in a read-only transaction", whatever its arguments and state;
* every error a call raises reaches the client clean: SQLSTATE not XX000 (internal error), and no
  field (message, detail, hint, context) contains Rust internals ("pgrx", "panic", "backtrace",
  ".rs:", "rust_begin_unwind", "core::", "std::"); the server runs with RUST_BACKTRACE=1, so a
  pgrx backtrace appended to DETAIL would show;
* after every call: no advisory lock of the extension survives the rolled-back subtransaction, the
  session answers SELECT 1 after ROLLBACK, pg_postmaster_start_time() is unchanged, and the row counts
  and digests of idempotency.records and idempotency.offsets (and the partition list) are unchanged;
* linear in the input (badinput_size.py, in a database of its own): a call given inputs 10 and 100 times
  larger takes at most 30 and 300 times the backend CPU time, for every function that takes a sizeable
  argument; and, against the SQL edition, idem_key over 1,000,000 parts within 3 times the native
  extension's time.

Every call runs in BEGIN ... ROLLBACK (a successful call is verified inside the transaction, then rolled
back), so the storage stays at the baseline written by the setup.

The suite's files: badinput_values.py (the hostile values, the functions and their kinds of argument),
badinput_args.py (the cases of each kind of argument), badinput_cases.py (the builder: base calls, states,
contexts, settings), this file (the cluster, the runner and the checks after every call).
"""
import badinput_size
import pgtools
import psycopg

from badinput_cases import Builder
from badinput_values import CONSUMER, DB, OK, OUTSIDER, PORT, SEQ_DB, RawBytes, _RawBytesDumper
from harness import Cluster, close_quietly, log, rust_internals, table_digest


# ---------------------------------------------------------------------------------------------------


def setup(conn):
    conn.execute(f"DROP ROLE IF EXISTS {CONSUMER}")
    conn.execute(f"DROP ROLE IF EXISTS {OUTSIDER}")
    conn.execute(f"CREATE ROLE {CONSUMER}")
    conn.execute(f"CREATE ROLE {OUTSIDER}")
    conn.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    st = {}
    for key in ("bi-pending", "bi-other", "bi-completed", "bi-failed", "bi-released"):
        st[key] = conn.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'bi')", (key,)).fetchone()[0]
    conn.execute("SELECT idem_complete('bi-completed', '{\"done\": 1}', scope => 'bi', token => %s)", (st["bi-completed"],))
    conn.execute("SELECT idem_fail('bi-failed', '{\"e\": 1}', retryable => false, scope => 'bi', token => %s)", (st["bi-failed"],))
    conn.execute("SELECT idem_fail('bi-released', '{\"e\": 2}', scope => 'bi', token => %s)", (st["bi-released"],))
    conn.execute("SELECT idem_claim('bi-fp', scope => 'bi', fingerprint => 'one')")
    conn.execute("SELECT idem_record_offset('bi-g', 'bi-t', 0, 100, 5)")
    return st


# Errors of this run whose fields were checked for Rust internals, and those that had some.
ERRORS = {"inspected": 0, "unclean": 0}


def run(install, opts, result):
    ERRORS.update(inspected=0, unclean=0)
    cluster = Cluster(install, PORT, conf=["track_functions = 'all'"])
    cluster.start()
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as admin:
            st = setup(admin)
            # (The SQL edition keeps its limits in the table idempotency.settings, not in the library's GUCs.)
            limit = int(admin.execute("SELECT max_batch_keys FROM idempotency.settings" if pgtools.sql_edition()
                                      else "SHOW idempotency.max_batch_keys").fetchone()[0])
            start = admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
            baseline = table_digest(admin)
            cases = Builder(st, limit).build()
            sess = _session(cluster)
            per_fn, failures, pg_rejected = {}, [], 0
            for case in cases:
                per_fn[case.fn] = per_fn.get(case.fn, 0) + 1
                sess, problems = _run_case(cluster, sess, case)
                if case.pg_rejects and not problems:
                    pg_rejected += 1
                if admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0] != start:
                    problems.append("the postmaster restarted")
                    start = admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
                digest = table_digest(admin)
                if digest != baseline:
                    problems.append(f"storage changed: {baseline[0]}/{baseline[2]} rows -> {digest[0]}/{digest[2]} rows, "
                                    f"partitions {'changed' if digest[4] != baseline[4] else 'same'}")
                    baseline = digest
                for p in problems:
                    failures.append(f"{case.fn} [{case.label}]: {p}")
            sess.close()
            seq = _sequences(cluster)
            failures += seq
        for f in failures:
            result.violation(f)
        result.figures.update({
            "hostile calls": len(cases),
            "functions covered": len(per_fn),
            "fewest calls to one function": f"{min(per_fn.values())} ({min(per_fn, key=per_fn.get)})",
            "calls per function": ", ".join(f"{k} {v}" for k, v in sorted(per_fn.items())),
            "expected to fail": sum(1 for c in cases if c.expect != OK),
            "valid hostile values accepted and verified": sum(1 for c in cases if c.expect == OK),
            "rejected by PostgreSQL before the call (22021 invalid UTF-8, 54000 NUL, type errors)": pg_rejected,
            "sequence checks": 2,
            "errors inspected for Rust internals and XX000": ERRORS["inspected"],
            "errors with Rust internals or XX000 (violations)": ERRORS["unclean"],
            "violations": len(failures),
        })
        log(f"{len(cases)} hostile calls to {len(per_fn)} functions, {len(failures)} violations")
        badinput_size.run(cluster, result)
    finally:
        cluster.stop()


def _session(cluster):
    s = cluster.connect(DB, timeout_ms=20000)
    s.adapters.register_dumper(RawBytes, _RawBytesDumper)
    s.execute("SET temp_file_limit = '64MB'")
    return s


def _inline(sess, sql, params):
    """The call with its parameters inlined as literals (for a DO block)."""
    return psycopg.ClientCursor(sess).mogrify(sql, params) if params else sql


def _call(sess, case):
    if case.setting and case.role:
        sess.execute(f"SET LOCAL {case.setting[0]} = '{case.setting[1]}'")
    if case.context == "prepared":
        sess.execute(case.sql, case.params, prepare=True)
    elif case.context == "cursor":
        cur = sess.cursor(name="hostile_cursor")
        try:
            cur.execute(case.sql, case.params)
            cur.fetchall()
        finally:
            if sess.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                cur.close()
    elif case.context == "cte":
        sess.execute(f"WITH x AS MATERIALIZED ({case.sql}) SELECT count(*) FROM x", case.params)
    elif case.context == "do-block":
        sess.execute("DO $do$ BEGIN PERFORM * FROM (" + _inline(sess, case.sql, case.params) +
                     ") AS x; EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'caught %', SQLSTATE; END $do$")
    else:
        sess.execute(case.sql, case.params)


def _run_case(cluster, sess, case):
    """Runs one case; returns the (possibly new) session and the problems found."""
    problems = []
    pid = sess.info.backend_pid
    outcome, message = None, ""
    try:
        sess.execute(case.begin)
        if case.setting and not case.role:
            sess.execute(f"SET LOCAL {case.setting[0]} = '{case.setting[1]}'")
        for sql, params in case.prelude:
            sess.execute(sql, params)
        if case.context == "aborted":
            try:
                sess.execute("SELECT 1/0")
            except psycopg.Error:
                pass
        else:
            held = sess.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                "AND locktype = 'advisory'").fetchone()[0]
            if case.role:
                sess.execute(f"SET LOCAL ROLE {case.role}")
            sess.execute("SAVEPOINT hostile")
        try:
            _call(sess, case)
            outcome = OK
        except psycopg.Error as e:
            outcome = e.sqlstate or "connection"
            message = e.diag.message_primary or (str(e).splitlines() or [""])[0]
            if sess.broken:
                raise
            unclean = rust_internals(e)
            ERRORS["inspected"] += 1
            ERRORS["unclean"] += bool(unclean)
            for p in unclean:
                problems.append(f"error {outcome} not clean: {p}")
        expect = case.expect if isinstance(case.expect, tuple) else (case.expect,)
        if outcome not in expect:
            problems.append(f"expected {'/'.join(expect)}, got {outcome}" + (f": {message}" if message else ""))
        if outcome == OK and case.verify:
            if case.role:
                sess.execute("RESET ROLE")
            for sql, params, want in case.verify:
                got = sess.execute(sql, params).fetchone()
                if got != tuple(want):
                    problems.append(f"accepted, but verification {sql!r} gave {got}, expected {tuple(want)}")
        if outcome == "25006" and case.read_only_message and not (
                message.startswith(case.fn) and message.endswith("cannot run in a read-only transaction")):
            problems.append(f"25006 without the function's own message "
                            f"('{case.fn} cannot run in a read-only transaction'): {message!r}")
        if outcome != OK and case.pg_rejects and message.startswith("idempotency:"):
            problems.append(f"expected PostgreSQL to reject the value before the call, but the extension did: {message}")
        if outcome != OK and case.context != "aborted":
            # A call that raised an error wrote nothing and holds nothing once its subtransaction is gone.
            sess.execute("ROLLBACK TO SAVEPOINT hostile")
            if case.role:
                sess.execute("RESET ROLE")
            leaked = sess.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                  "AND locktype = 'advisory'").fetchone()[0]
            if leaked != held:
                problems.append(f"{leaked - held} advisory locks of the failed call still held after ROLLBACK TO SAVEPOINT")
        sess.execute("ROLLBACK")
        if sess.execute("SELECT 1").fetchone()[0] != 1 or sess.info.backend_pid != pid:
            problems.append("the session did not survive")
    except psycopg.Error as e:
        problems.append(f"the session broke: {type(e).__name__}: {e}")
        close_quietly(sess)
        cluster.wait_ready(DB)
        sess = _session(cluster)
    return sess, problems


def _sequences(cluster):
    """Hostile sequences of valid calls, in a database of their own (they commit)."""
    problems = []

    def unclean(what, e):
        found = rust_internals(e)
        ERRORS["inspected"] += 1
        ERRORS["unclean"] += bool(found)
        return [f"sequence [{what}]: error {e.sqlstate} not clean: {p}" for p in found]
    cluster.create_db(SEQ_DB)
    with cluster.connect(SEQ_DB) as c:
        # Aging the data with a future as_of, then premaking that future again in the same session:
        # a later claim must still find (or create) the partition of today.
        c.execute("SELECT * FROM idem_maintenance(now() + interval '30 days')")
        c.execute("SELECT idempotency.premake_partitions(now() + interval '30 days')")
        try:
            out = c.execute("SELECT outcome FROM idem_claim('after-aging')").fetchone()[0]
            if out != "claimed":
                problems.append(f"sequence [claim after maintenance/premake as of now()+30 days]: outcome {out}")
        except psycopg.Error as e:
            problems.append(f"sequence [claim after idem_maintenance(now()+30 days) and premake_partitions(now()+30 days) "
                            f"in the same session]: expected claimed, got {e.sqlstate}: {str(e).splitlines()[0]}")
            problems += unclean("claim after aging", e)
    with cluster.connect(SEQ_DB) as c:
        # The same claim from a fresh session works: the partition is missing only for the first one.
        try:
            c.execute("SELECT outcome FROM idem_claim('fresh-session')").fetchone()
        except psycopg.Error as e:
            problems.append(f"sequence [claim from a fresh session]: {e.sqlstate}: {e}")
            problems += unclean("claim from a fresh session", e)
    return problems

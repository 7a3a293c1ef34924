"""Scale-out tests on a real Citus 13.2.2 cluster (a coordinator and two workers on loopback, started here from
a private copy of the installation with 'citus,idempotency' preloaded on every node). Groups, in order:

  distribute   idem_distribute: refusals with their SQLSTATEs and nothing written (no Citus, a worker, NULL,
               a local, a reference, a bigint-distributed table, records on the coordinator, another
               colocation group), then the registration (scope argument, colocation, force_delegation,
               the coordinator's guard) and its idempotence
  placement    keys of many tenants through the coordinator: each record on the worker that holds its
               tenant's shard, in the caller's transaction; none on the coordinator; spread per worker
  race         racing consumers (single calls, claim/complete, batches across tenants) with every message
               delivered several times, at READ COMMITTED and REPEATABLE READ: every effect exactly once
  status       idem_status, idem_heartbeat, idem_fail, idem_complete with tokens, through the coordinator
  bad-input    a NULL scope for every delegated function, in any spelling that folds to NULL (22004, no
               crash), no scope (the tenant 'default'),
               an empty scope, calls Citus does not delegate (0A000, nothing written)
  in-doubt     transactions spanning both workers and the coordinator's offsets, stopped after the
               coordinator's commit and before COMMIT PREPARED; a worker kill -9ed and restarted; the
               key locks held by its prepared transactions; recover_prepared_transactions(): all
               committed, offsets and effects agree, nothing twice
  chaos        consumers polling streams that span every tenant, batch claims + business rows + offset
               per poll, while workers are kill -9ed and restarted; the maintenance daemon's 2PC
               recovery; every message exactly once, offsets at the end of every stream
  maintenance  the launcher on every node; each node's retention drops its old partitions by itself
  rebalance    citus_move_shard_placement of a tenant's shard: the records stay behind (the failure
               mode: the key is new again on the new node), then idem_move_records repairs it, running
               none of the lookalikes a role planted on the workers

The last line is `citus: N passed, N failed`.
"""
import argparse
import collections
import os
import random
import re
import sys
import threading
import time
import traceback

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from citus_cluster import DB, CitusCluster  # noqa: E402

RETRY = ("40001", "40P01")


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.figures = []

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"  ok    {name}", flush=True)
        else:
            self.failed += 1
            print(f"  FAIL  {name}", flush=True)
            for line in str(detail).splitlines()[:40]:
                print(f"          {line}", flush=True)

    def figure(self, text):
        self.figures.append(text)
        print(f"  --    {text}", flush=True)


def sqlstate(conn, query, params=None):
    """(sqlstate, first message line) of the error query raises, or (None, rows)."""
    try:
        with conn.transaction():
            cur = conn.execute(query, params)
            return None, cur.fetchall() if cur.description else None
    except psycopg.Error as e:
        return e.sqlstate, str(e).strip().splitlines()[0] if str(e).strip() else ""


def worker_of(coord_conn, tenant):
    """The port of the worker holding the tenant's shard of ledger."""
    return coord_conn.execute(
        "SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('ledger', %s::text)",
        (tenant,)).fetchone()[0]


def records_on(node):
    with node.connect() as c:
        return c.execute("SELECT scope, key, status FROM idempotency.records").fetchall()


# ---------------------------------------------------------------------------------------------------


def t_distribute(cl, ck):
    co = cl.coord
    # A database without Citus on the coordinator.
    with co.connect("postgres") as c:
        c.execute("CREATE DATABASE plain")
    with co.connect("plain") as c:
        c.execute("CREATE EXTENSION idempotency")
        st, msg = sqlstate(c, "SELECT idem_distribute('pg_class')")
        ck.check("outside Citus: 55000", st == "55000", f"{st} {msg}")
    with cl.w1.connect() as c:
        st, msg = sqlstate(c, "SELECT idem_distribute('pg_class')")
        ck.check("on a worker: 55000", st == "55000", f"{st} {msg}")
    with co.connect() as c:
        c.execute("CREATE TABLE ledger (tenant text NOT NULL, msg text NOT NULL, amount int, "
                  "at timestamptz NOT NULL DEFAULT now())")
        c.execute("SELECT create_distributed_table('ledger', 'tenant', shard_count := 8)")
        c.execute("CREATE TABLE accounts (tenant text NOT NULL, balance int)")
        c.execute("SELECT create_distributed_table('accounts', 'tenant', colocate_with := 'ledger')")
        c.execute("CREATE TABLE local_t (tenant text)")
        c.execute("CREATE TABLE ref_t (tenant text)")
        c.execute("SELECT create_reference_table('ref_t')")
        c.execute("CREATE TABLE by_id (tenant_id bigint)")
        c.execute("SELECT create_distributed_table('by_id', 'tenant_id', shard_count := 8)")
        c.execute("CREATE TABLE other_group (tenant text)")
        c.execute("SELECT create_distributed_table('other_group', 'tenant', shard_count := 4)")
        for arg, want in [("NULL", "22004"), ("'local_t'", "22023"), ("'ref_t'", "22023"), ("'by_id'", "22023")]:
            st, msg = sqlstate(c, f"SELECT idem_distribute({arg})")
            ck.check(f"idem_distribute({arg}): {want}", st == want, f"{st} {msg}")
        # A key written on the coordinator before the scale-out (the functions still run locally).
        assert c.execute("SELECT idem_once('before', 'acme')").fetchone()[0] is True
        st, msg = sqlstate(c, "SELECT idem_distribute('ledger')")
        ck.check("records on the coordinator: 55000", st == "55000", f"{st} {msg}")
        n = c.execute("SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_proc'::regclass "
                      "AND objid::regprocedure::text LIKE 'idem_%'").fetchone()[0]
        ck.check("a refused idem_distribute writes nothing", n == 0, f"{n} functions registered")
        c.execute("DELETE FROM idempotency.records")
        rows = c.execute("SELECT * FROM idem_distribute('ledger')").fetchall()
        ck.check("idem_distribute('ledger') registers 12 functions", len(rows) == 12, rows)
        got = c.execute("""
            SELECT o.objid::regprocedure::text, o.distribution_argument_index,
                   array_position(p.proargnames, 'scope') - 1, o.colocationid, o.force_delegation
              FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
             WHERE o.classid = 'pg_proc'::regclass ORDER BY 1""").fetchall()
        colo = c.execute("SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'ledger'::regclass").fetchone()[0]
        bad = [r for r in got if r[1] != r[2] or r[3] != colo or r[4] is not True]
        ck.check("each delegated by its scope argument, colocated with ledger, force_delegation",
                 len(got) == 12 and not bad, got)
        names = sorted(r[0].split("(")[0] for r in got)
        ck.check("the nine scope-bound consumer functions and the three admin ones, no offset function",
                 names == sorted(["idem_claim", "idem_complete", "idem_fail", "idem_heartbeat", "idem_once",
                                  "idem_status", "idem_claim_batch", "idem_complete_batch", "idem_once_batch",
                                  "idem_redrive", "idem_redrive_scope", "idem_forget"]), names)
        rows2 = c.execute("SELECT * FROM idem_distribute('accounts')").fetchall()
        got2 = c.execute("SELECT objid::regprocedure::text, distribution_argument_index, colocationid, force_delegation "
                         "FROM pg_dist_object WHERE classid = 'pg_proc'::regclass ORDER BY 1").fetchall()
        ck.check("idempotent (again, through another table of the same colocation group)",
                 rows2 == rows and got2 == [(r[0], r[1], r[3], r[4]) for r in got], got2)
        st, msg = sqlstate(c, "SELECT idem_distribute('other_group')")
        ck.check("another colocation group: 55000", st == "55000", f"{st} {msg}")
        trig = c.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'idempotency.records'::regclass "
                         "AND tgname = 'idem_refuse_undelegated'").fetchone()[0]
        ck.check("the coordinator's record table is guarded", trig == 1, trig)
        for w in cl.workers:
            with w.connect() as wc:
                t = wc.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'idem_refuse_undelegated'").fetchone()[0]
                ck.check(f"{w.name}'s record table is not guarded", t == 0, t)
        desc = c.execute("SELECT obj_description('idem_distribute(regclass)'::regprocedure, 'pg_proc')").fetchone()[0]
        ck.check("idem_distribute has a comment", bool(desc) and "colocate_with" in desc, desc)


def t_placement(cl, ck, tenants=40, keys=5):
    with cl.coord.connect() as c:
        for t in range(tenants):
            with c.transaction():
                for k in range(keys):
                    assert c.execute("SELECT idem_once(%s, %s)", (f"p{k}", f"tenant-{t}")).fetchone()[0] is True
                c.execute("INSERT INTO ledger (tenant, msg) VALUES (%s, 'placement')", (f"tenant-{t}",))
        where = {f"tenant-{t}": worker_of(c, f"tenant-{t}") for t in range(tenants)}
    wrong, spread = [], {}
    for w in cl.workers:
        rows = [r for r in records_on(w) if r[1].startswith("p") and r[0].startswith("tenant-")]
        spread[w.name] = len(rows)
        wrong += [(w.name, r) for r in rows if where[r[0]] != w.port]
    total = sum(spread.values())
    ck.check("every record on the worker holding its tenant's shard", not wrong and total == tenants * keys,
             f"{len(wrong)} misplaced, {total} found: {wrong[:5]}")
    ck.check("no record on the coordinator", not records_on(cl.coord), records_on(cl.coord)[:5])
    tenants_per = collections.Counter(where.values())
    ck.figure(f"spread of {tenants} tenants x {keys} keys: " + ", ".join(
        f"{w.name} {spread[w.name]} records ({tenants_per[w.port]} tenants)" for w in cl.workers))
    with cl.coord.connect() as c:
        c.execute("SET citus.log_remote_commands = on")
        # The record commits with the business row: a rollback leaves neither.
        c.execute("BEGIN")
        c.execute("SELECT idem_once('rolled-back', 'tenant-1')")
        c.execute("INSERT INTO ledger (tenant, msg) VALUES ('tenant-1', 'rolled-back')")
        c.execute("ROLLBACK")
        n = c.execute("SELECT count(*) FROM ledger WHERE msg = 'rolled-back'").fetchone()[0]
        again = c.execute("SELECT idem_once('rolled-back', 'tenant-1')").fetchone()[0]
        ck.check("a rolled-back transaction leaves neither the key nor the row", n == 0 and again is True, (n, again))


# ---------------------------------------------------------------------------------------------------
# Racing consumers


def consume(cl, isolation, deliveries, tenants, stats, lock, seed):
    rnd = random.Random(seed)
    conn = cl.coord.connect(statement_timeout_ms=60000)
    while True:
        with lock:
            if not deliveries:
                break
            n = rnd.randint(1, 6)
            poll = [deliveries.pop() for _ in range(min(n, len(deliveries)))]
        mode = rnd.choice(("once", "claim", "batch"))
        for attempt in range(50):
            try:
                applied = process(conn, isolation, mode, poll)
                with lock:
                    stats["applied"] += applied
                    stats["polls"] += 1
                break
            except psycopg.Error as e:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
                if e.sqlstate in RETRY:
                    with lock:
                        stats[e.sqlstate] += 1
                    time.sleep(rnd.random() * 0.05)
                    continue
                with lock:
                    stats["errors"].append(f"{e.sqlstate} {e}")
                break
    conn.close()


def process(conn, isolation, mode, poll):
    """One transaction for one poll of (tenant, msg) deliveries; returns the effects applied."""
    applied = 0
    conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
    if mode == "batch":
        by_tenant = collections.defaultdict(list)
        for tenant, msg in poll:
            by_tenant[tenant].append(msg)
        for tenant in sorted(by_tenant):  # one lock order for all: tenants sorted, keys sorted by the batch
            rows = conn.execute("SELECT key, outcome FROM idem_claim_batch(%s, NULL, %s)",
                                (by_tenant[tenant], tenant)).fetchall()
            claimed = [k for k, o in rows if o == "claimed"]
            for k in claimed:
                conn.execute("INSERT INTO ledger (tenant, msg, amount) VALUES (%s, %s, 1)", (tenant, k))
            if claimed:
                conn.execute("SELECT idem_complete_batch(%s, NULL, %s)", (claimed, tenant))
            applied += len(claimed)
    else:
        for tenant, msg in sorted(poll):
            if mode == "once":
                if conn.execute("SELECT idem_once(%s, %s)", (msg, tenant)).fetchone()[0]:
                    conn.execute("INSERT INTO ledger (tenant, msg, amount) VALUES (%s, %s, 1)", (tenant, msg))
                    applied += 1
            else:
                outcome = conn.execute("SELECT outcome FROM idem_claim(%s, NULL, %s)", (msg, tenant)).fetchone()[0]
                if outcome == "claimed":
                    conn.execute("INSERT INTO ledger (tenant, msg, amount) VALUES (%s, %s, 1)", (tenant, msg))
                    conn.execute("SELECT idem_complete(%s, %s, %s)", (msg, Jsonb({"m": msg}), tenant))
                    applied += 1
    conn.execute("COMMIT")
    return applied


def t_race(cl, ck, quick):
    tenants = [f"race-{i}" for i in range(24)]
    for isolation in ("READ COMMITTED", "REPEATABLE READ"):
        tag = isolation.split()[0].lower()
        msgs = [(random.choice(tenants), f"{tag}-m{i}") for i in range(300 if quick else 1500)]
        # Redeliveries at the same moment: each run of 8 messages is queued three times in a row, so the
        # consumers popping next to each other take the same keys concurrently.
        deliveries = []
        for i in range(0, len(msgs), 8):
            for _ in range(3):
                deliveries += msgs[i:i + 8]
        deliveries.reverse()  # consumers pop from the end
        stats = collections.Counter()
        stats["errors"] = []
        lock = threading.Lock()
        threads = [threading.Thread(target=consume, args=(cl, isolation, deliveries, tenants, stats, lock, i))
                   for i in range(6)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        with cl.coord.connect() as c:
            rows = c.execute("SELECT tenant, msg, count(*) FROM ledger WHERE msg LIKE %s GROUP BY 1, 2",
                             (f"{tag}-m%",)).fetchall()
        got = {(t, m): n for t, m, n in rows}
        twice = {k: n for k, n in got.items() if n != 1}
        missing = [m for m in msgs if m not in got]
        ck.check(f"{isolation}: {len(msgs)} messages x 3 deliveries, 6 consumers: every effect exactly once",
                 not twice and not missing and not stats["errors"] and stats["applied"] == len(msgs),
                 f"twice {list(twice.items())[:5]}, missing {missing[:5]}, applied {stats['applied']}, "
                 f"errors {stats['errors'][:5]}")
        placed = sum(1 for w in cl.workers for r in records_on(w) if r[1].startswith(f"{tag}-m") and r[2] == "completed")
        ck.check(f"{isolation}: one completed record per message, on the workers", placed == len(msgs),
                 f"{placed} of {len(msgs)}")
        ck.figure(f"race {isolation}: {stats['polls']} polls in {time.time() - t0:.1f} s, "
                  f"{stats['40001']} retried 40001, {stats['40P01']} retried 40P01")


def t_status(cl, ck):
    with cl.coord.connect() as c:
        tok = c.execute("SELECT token FROM idem_claim('s1', '1 hour', 'acme')").fetchone()[0]
        exp = c.execute("SELECT idem_heartbeat('s1', '2 hours', 'acme', %s)", (tok,)).fetchone()[0]
        st = c.execute("SELECT status, token, expires_at FROM idem_status('s1', 'acme')").fetchall()
        ck.check("pending key: status, token and the heartbeat's expires_at through the coordinator",
                 st == [("pending", tok, exp)], (st, tok, exp))
        c.execute("SELECT idem_complete('s1', '{\"r\": 1}', 'acme', %s)", (tok,))
        st = c.execute("SELECT status, payload FROM idem_status('s1', 'acme')").fetchall()
        ck.check("completed key: payload through the coordinator", st == [("completed", {"r": 1})], st)
        out = c.execute("SELECT outcome, payload FROM idem_claim('s1', NULL, 'acme')").fetchall()
        ck.check("a duplicate claim replays the payload", out == [("completed", {"r": 1})], out)
        tok2 = c.execute("SELECT token FROM idem_claim('s2', NULL, 'globex')").fetchone()[0]
        r = c.execute("SELECT idem_fail('s2', '{\"e\": \"poison\"}', false, 'globex', %s)", (tok2,)).fetchone()[0]
        st = c.execute("SELECT status, error FROM idem_status('s2', 'globex')").fetchall()
        ck.check("failed key through the coordinator", r == "failed" and st == [("failed", {"e": "poison"})], (r, st))
        st = c.execute("SELECT * FROM idem_status('never', 'acme')").fetchall()
        ck.check("unknown key: no row", st == [], st)
        s, msg = sqlstate(c, "SELECT idem_complete('s1', NULL, 'acme', 1)")
        ck.check("a settled key refuses completion through the coordinator (55000 or 55006)",
                 s in ("55000", "55006"), f"{s} {msg}")
        s, msg = sqlstate(c, "SELECT idem_heartbeat('zzz', NULL, 'acme', 5)")
        ck.check("an unknown key's heartbeat: P0002 from the worker", s == "P0002", f"{s} {msg}")
        b = c.execute("SELECT * FROM idem_once_batch(ARRAY['b1', 'b2', 'b1'], 'acme')").fetchall()
        b2 = c.execute("SELECT * FROM idem_once_batch(ARRAY['b1', 'b3'], 'acme')").fetchall()
        ck.check("idem_once_batch through the coordinator", b == [("b1",), ("b2",)] and b2 == [("b3",)], (b, b2))
        # The admin's functions reach the key's worker too (globex's 's2' failed above).
        dead = c.execute("SELECT idem_redrive('s2', 'globex')").fetchone()[0]
        out = c.execute("SELECT outcome, attempts FROM idem_claim('s2', NULL, 'globex')").fetchall()
        tok3 = c.execute("SELECT token FROM idem_status('s2', 'globex')").fetchone()[0]
        c.execute("SELECT idem_fail('s2', '{\"e\": 2}', false, 'globex', %s)", (tok3,))
        bulk = c.execute("SELECT idem_redrive_scope('globex')").fetchone()[0]
        gone = c.execute("SELECT idem_forget('s1', 'acme')").fetchone()[0]
        st = c.execute("SELECT * FROM idem_status('s1', 'acme')").fetchall()
        ck.check("idem_redrive, idem_redrive_scope and idem_forget through the coordinator act on the key's worker",
                 dead is True and out == [("claimed", 1)] and bulk == 1 and gone is True and st == [],
                 (dead, out, bulk, gone, st))
        # An ordinary login role granted idempotency_consumer, as docs/scaling-out.md sets one up: Citus
        # propagates the role and its membership to the workers, where the delegated call runs as that role.
        c.execute("DROP ROLE IF EXISTS app_consumer")
        c.execute("CREATE ROLE app_consumer LOGIN")
        c.execute("GRANT idempotency_consumer TO app_consumer")
        holder = worker_of(c, "acme")
    with cl.coord.connect(user="app_consumer") as a:
        first = a.execute("SELECT idem_once('as-app', 'acme')").fetchone()[0]
        again = a.execute("SELECT idem_once('as-app', 'acme')").fetchone()[0]
        denied, msg = sqlstate(a, "SELECT idem_redrive('as-app', 'acme')")
    kept = cl.by_port(holder).sql("SELECT count(*) FROM idempotency.records WHERE scope = 'acme' AND key = 'as-app'")
    ck.check("a login role granted idempotency_consumer claims through the coordinator (the record on acme's "
             "worker); the admin's idem_redrive is refused to it (42501)",
             first is True and again is False and kept == [(1,)] and denied == "42501", (first, again, kept, denied, msg))


def t_bad_input(cl, ck):
    pid = cl.coord.postmaster_pid()
    calls = [
        "SELECT * FROM idem_claim('k', NULL, NULL)",
        "SELECT idem_complete('k', NULL, NULL)",
        "SELECT idem_fail('k', NULL, true, NULL)",
        "SELECT idem_heartbeat('k', NULL, NULL, 1)",
        "SELECT idem_once('k', NULL)",
        "SELECT * FROM idem_status('k', NULL)",
        "SELECT * FROM idem_claim_batch(ARRAY['k'], NULL, NULL)",
        "SELECT idem_complete_batch(ARRAY['k'], NULL, NULL)",
        "SELECT * FROM idem_once_batch(ARRAY['k'], scope => NULL)",
        "SELECT idem_once('k', NULL::varchar)",
        "SELECT idem_redrive('k', NULL)",
        "SELECT idem_redrive_scope(NULL)",
        "SELECT idem_forget('k', scope => NULL)",
        # Other spellings of NULL, which Citus folds into the same NULL constant before it hashes it
        # (0.5.0: signal 11 and crash recovery of the coordinator at the first of them).
        "SELECT idem_once('k', nullif('x', 'x'))",
        "SELECT idem_once('k', NULL::name)",
        "SELECT idem_once('k', CASE WHEN false THEN 'x' END)",
        "SELECT * FROM idem_claim('k', NULL, upper(NULL))",
        "SELECT * FROM idem_once_batch(ARRAY['k'], scope => lower(NULL::text) || 'x')",
    ]
    with cl.coord.connect() as c:
        for q in calls:
            st, msg = sqlstate(c, q)
            ck.check(f"{q}: 22004", st == "22004" and "scope must not be NULL" in msg, f"{st} {msg}")
        for q, p in [("SELECT idem_once(%s, %s)", ("k", None)), ("SELECT outcome FROM idem_claim(%s, NULL, %s)", ("k", None)),
                     ("SELECT idem_once(%s, nullif(%s, 'x'))", ("k", "x"))]:
            st, msg = sqlstate(c, q, p)
            ck.check(f"{q} with a NULL bound parameter: 22004", st == "22004", f"{st} {msg}")
        st, msg = sqlstate(c, "DO $$ DECLARE s text; BEGIN PERFORM * FROM idem_claim('k', NULL, s); END $$")
        ck.check("a NULL scope from PL/pgSQL: 22004", st == "22004", f"{st} {msg}")
    ck.check("the coordinator survived every NULL scope (same postmaster, no crash in its log)",
             cl.coord.postmaster_pid() == pid and not cl.crash_lines(), cl.crash_lines())
    with cl.coord.connect() as c:
        st, msg = sqlstate(c, "SELECT idem_once('k', '')")
        ck.check("an empty scope: 22023 from the worker", st == "22023", f"{st} {msg}")
        assert c.execute("SELECT idem_once('no-scope')").fetchone()[0] is True
        port = worker_of(c, "default")
        on = [w.name for w in cl.workers if ("default", "no-scope", "completed") in records_on(w)]
        ck.check("no scope: the tenant 'default', on the worker holding its shard",
                 on == [cl.by_port(port).name], (on, port))
        before = c.execute("SELECT count(*) FROM ledger").fetchone()[0]
        shapes = [
            "INSERT INTO ledger (tenant, msg) SELECT 'acme', 'u1' WHERE idem_once('u1', 'acme')",
            "WITH x AS (SELECT idem_once('u2', 'acme') AS f) SELECT * FROM x",
            "SELECT idem_once('u3', 'acme'), 1",
            "SELECT * FROM (SELECT 1) s WHERE idem_once('u4', 'acme')",
            "DO $$ BEGIN PERFORM idem_once('u5', 'acme'); END $$",
        ]
        for q in shapes:
            st, msg = sqlstate(c, q)
            ck.check(f"not delegated, refused on the coordinator: {q[:60]}: 0A000", st == "0A000", f"{st} {msg}")
        after = c.execute("SELECT count(*) FROM ledger").fetchone()[0]
        keys = [r for w in cl.nodes for r in records_on(w) if r[1] in ("u1", "u2", "u3", "u4", "u5")]
        ck.check("the refused calls wrote nothing anywhere", after == before and not keys, (before, after, keys))
        ok = c.execute("SELECT idem_once('u1', 'acme')").fetchone()[0]
        ck.check("the same key called alone is delegated and new", ok is True, ok)


# ---------------------------------------------------------------------------------------------------
# Crashes and two-phase commit


def two_worker_tenants(cl, n):
    """n tenants on worker1 and n on worker2."""
    out = {cl.w1.port: [], cl.w2.port: []}
    with cl.coord.connect() as c:
        i = 0
        while min(len(v) for v in out.values()) < n:
            t = f"t2pc-{i}"
            p = worker_of(c, t)
            if len(out[p]) < n:
                out[p].append(t)
            i += 1
    return out[cl.w1.port], out[cl.w2.port]


def t_in_doubt(cl, ck):
    """Transactions committed on the coordinator whose COMMIT PREPARED never reached worker2."""
    on1, on2 = two_worker_tenants(cl, 4)
    n = 6
    co = cl.coord
    with co.connect() as c:
        c.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        c.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    conns, threads, errors = [], [], []

    def txn(i, conn):
        try:
            conn.execute("BEGIN")
            for tenant in (on1[i % 4], on2[i % 4]):
                assert conn.execute("SELECT idem_once(%s, %s)", (f"doubt-{i}", tenant)).fetchone()[0] is True
                conn.execute("INSERT INTO ledger (tenant, msg, amount) VALUES (%s, %s, 2)", (tenant, f"doubt-{i}"))
            conn.execute("SELECT idem_record_offset('doubt', 'orders', %s, 100)", (i,))
            conn.execute("COMMIT")
        except psycopg.Error as e:
            errors.append(e)

    for i in range(n):
        conn = co.connect(statement_timeout_ms=0)
        conns.append(conn)
        threads.append(threading.Thread(target=txn, args=(i, conn)))
        threads[-1].start()
    # Wait until every transaction is committed locally and waits for the (absent) synchronous standby.
    deadline = time.time() + 30
    with co.connect() as c:
        while time.time() < deadline:
            waiting = c.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchall()
            if len(waiting) == n:
                break
            time.sleep(0.1)
        prepared_before = {}
        for w in cl.workers:
            with w.connect() as wc:
                prepared_before[w.name] = wc.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
        ck.check(f"{n} transactions committed on the coordinator, prepared on both workers",
                 len(waiting) == n and all(v == n for v in prepared_before.values()), (len(waiting), prepared_before))
        cl.w2.kill9()
        c.execute("ALTER SYSTEM RESET synchronous_standby_names")
        c.execute("SELECT pg_reload_conf()")
        for (pid,) in waiting:
            c.execute("SELECT pg_cancel_backend(%s::integer)", (pid,))
    for t in threads:
        t.join(60)
    for conn in conns:
        conn.close()
    ck.check("their clients were told the commit happened (a warning, no error)", not errors,
             [f"{e.sqlstate} {e}" for e in errors][:3])
    cl.w2.start()
    with cl.w2.connect() as wc:
        pending = wc.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    with co.connect() as c:
        seen = c.execute("SELECT count(*) FROM ledger WHERE msg LIKE 'doubt-%%' AND tenant = ANY(%s)", (on2,)).fetchone()[0]
        seen1 = c.execute("SELECT count(*) FROM ledger WHERE msg LIKE 'doubt-%%' AND tenant = ANY(%s)", (on1,)).fetchone()[0]
        offs = c.execute("SELECT count(*) FROM idem_offsets('doubt')").fetchone()[0]
    ck.check("after worker2's kill -9 and restart: its halves in doubt (prepared), worker1's and the offsets committed",
             pending == n and seen == 0 and seen1 == n and offs == n, (pending, seen, seen1, offs))
    # A redelivery of a message in doubt waits for the prepared transaction's key lock: never a second 'true'.
    with co.connect(statement_timeout_ms=2000) as c:
        # (the coordinator's statement_timeout cancels the delegated call waiting on the worker)
        st, msg = sqlstate(c, "SELECT idem_once('doubt-0', %s)", (on2[0],))
        ck.check("a redelivery of a key in doubt waits for its lock (cancelled here after 2 s), it does not get true",
                 st == "57014", f"{st} {msg}")
    with co.connect() as c:
        recovered = c.execute("SELECT recover_prepared_transactions()").fetchone()[0]
        with cl.w2.connect() as wc:
            left = wc.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
        rows = c.execute("SELECT tenant, msg, count(*) FROM ledger WHERE msg LIKE 'doubt-%' GROUP BY 1, 2").fetchall()
        again = [c.execute("SELECT idem_once(%s, %s)", (f"doubt-{i}", t)).fetchone()[0]
                 for i in range(n) for t in (on1[i % 4], on2[i % 4])]
        ck.check(f"recover_prepared_transactions() committed the {n} halves; effects once each, keys known",
                 recovered == n and left == 0 and len(rows) == 2 * n and all(r[2] == 1 for r in rows) and not any(again),
                 (recovered, left, rows, again))
        ck.figure(f"in-doubt: {n} transactions prepared on worker2, kill -9, {recovered} committed by recovery")


def chaos_consumer(cl, part, stream, state, stop, lock):
    """A consumer of one broker partition: polls of 8 messages spanning tenants on both workers, each poll
    one transaction: batch claims per tenant, ledger rows, completions and the offset (2PC)."""
    conn = None
    pos = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = cl.coord.connect(statement_timeout_ms=20000, connect_timeout=5)
                conn.execute("SET lock_timeout = '10s'")
                pos = None
            if pos is None:  # seek from the database, not from memory
                pos = conn.execute("SELECT idem_next_offset('chaos', 'orders', %s)", (part,)).fetchone()[0] or 0
            if pos >= len(stream):
                break
            poll = stream[pos:pos + 8]
            by_tenant = collections.defaultdict(list)
            for tenant, msg in poll:
                by_tenant[tenant].append(msg)
            dup = 0
            conn.execute("BEGIN")
            for tenant in sorted(by_tenant):
                rows = conn.execute("SELECT key, outcome FROM idem_claim_batch(%s, NULL, %s)",
                                    (by_tenant[tenant], tenant)).fetchall()
                claimed = [k for k, o in rows if o == "claimed"]
                dup += sum(1 for k, o in rows if o == "completed")
                odd = [(k, o) for k, o in rows if o not in ("claimed", "completed")]
                if odd:
                    raise AssertionError(f"unexpected outcomes {odd}")
                for k in claimed:
                    conn.execute("INSERT INTO ledger (tenant, msg, amount) VALUES (%s, %s, 3)", (tenant, k))
                if claimed:
                    conn.execute("SELECT idem_complete_batch(%s, NULL, %s)", (claimed, tenant))
            conn.execute("SELECT idem_record_offset('chaos', 'orders', %s, %s)", (part, pos + len(poll) - 1))
            conn.execute("COMMIT")
            pos += len(poll)
            with lock:
                state["polls"] += 1
                state["dups"] += dup
        except psycopg.Error as e:
            with lock:
                state["errors"] += 1
                state["codes"][e.sqlstate or "connection"] += 1
                if e.sqlstate not in ("08006", None) and len(state["samples"]) < 5:
                    state["samples"].append(f"{e.sqlstate} {str(e).strip().splitlines()[0][:160]}")
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
            conn = None
            time.sleep(0.2)
        except AssertionError as e:
            with lock:
                state["violations"].append(str(e))
            break
    if conn is not None and not conn.closed:
        conn.close()


def t_chaos(cl, ck, quick):
    on1, on2 = two_worker_tenants(cl, 6)
    tenants = on1 + on2
    parts, length = 4, (600 if quick else 1500)
    streams = {p: [(tenants[(p * 5 + i * 7) % len(tenants)], f"c{p}-{i}") for i in range(length)] for p in range(parts)}
    with cl.coord.connect() as c:
        # From here on, the coordinator's maintenance daemon recovers prepared transactions by itself.
        c.execute("ALTER SYSTEM SET citus.recover_2pc_interval = '1s'")
        c.execute("SELECT pg_reload_conf()")
    state = collections.Counter()
    state["codes"] = collections.Counter()
    state["violations"] = []
    state["samples"] = []
    log_from = cl.coord.log_size()
    stop, lock = threading.Event(), threading.Lock()
    threads = [threading.Thread(target=chaos_consumer, args=(cl, p, streams[p], state, stop, lock)) for p in range(parts)]
    t0 = time.time()
    for t in threads:
        t.start()
    # Kill at points of progress, not of time: a fast machine must not finish the streams before the kills.
    total_polls = parts * ((length + 7) // 8)
    kills, busy = 0, []
    victims = [cl.w2, cl.w1] if quick else [cl.w2, cl.w1, cl.w2, cl.w1]
    for n, victim in enumerate(victims, 1):
        target = total_polls * n // (len(victims) + 1) + random.randint(0, 3)
        waited = time.time()
        while time.time() - waited < 60 and any(t.is_alive() for t in threads):
            with lock:
                if state["polls"] >= target:
                    break
            time.sleep(0.01)
        busy.append(sum(1 for t in threads if t.is_alive()))
        victim.kill9()
        kills += 1
        time.sleep(random.uniform(0.5, 1.5))
        victim.start()
    deadline = time.time() + (120 if quick else 400)
    for t in threads:
        t.join(max(1, deadline - time.time()))
    stop.set()
    for t in threads:
        t.join(30)
    # The daemon finishes what the kills left prepared.
    left = None
    for _ in range(60):
        left = {w.name: w.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0] for w in cl.workers}
        if not any(left.values()):
            break
        time.sleep(0.5)
    with cl.coord.connect() as c:
        rows = c.execute("SELECT tenant, msg, count(*) FROM ledger WHERE msg LIKE 'c%-%' AND amount = 3 GROUP BY 1, 2").fetchall()
        offs = dict(c.execute("SELECT partition, next_offset FROM idem_offsets('chaos')").fetchall())
    got = {(t, m): n for t, m, n in rows}
    want = {m for s in streams.values() for m in s}
    twice = [k for k, n in got.items() if n > 1]
    missing = [m for m in want if m not in got]
    extra = [k for k in got if k not in want]
    ck.check("chaos: no prepared transaction left after the daemon's recovery", not any(left.values()), left)
    ck.check(f"chaos: {parts} partitions x {length} messages across {len(tenants)} tenants, {kills} worker kill -9s: "
             "every message exactly once",
             not twice and not missing and not extra and not state["violations"],
             f"twice {twice[:5]}, missing {len(missing)} {missing[:5]}, extra {extra[:5]}, {state['violations'][:3]}")
    ck.check("chaos: every offset at the end of its stream", offs == {p: length for p in range(parts)}, offs)
    ck.check("chaos: every kill hit running consumers (consumers alive at each kill, some polls failed)",
             len(busy) == kills and min(busy) > 0 and state["errors"] > 0, (busy, state["errors"]))
    ck.figure(f"chaos: {state['polls']} polls committed in {time.time() - t0:.1f} s, {state['errors']} failed "
              f"({dict(state['codes'])}), {state['dups']} redelivered keys answered 'completed'")
    recovered = sum(int(m) for m in re.findall(r"maintenance daemon recovered (\d+) distributed",
                                               cl.coord.log_since(log_from)))
    ck.figure(f"chaos: the coordinator's maintenance daemon recovered {recovered} distributed transactions")
    for sample in state["samples"]:
        ck.figure(f"chaos: a failed poll: {sample}")


# ---------------------------------------------------------------------------------------------------


def t_maintenance(cl, ck):
    for n in cl.nodes:
        with n.connect() as c:
            launcher = c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'").fetchone()[0]
            c.execute("SELECT idempotency.premake_partitions(now() - interval '12 days')")
            old = c.execute("SELECT partition::text FROM idempotency.partitions "
                            "WHERE range_to < now() - interval '8 days'").fetchall()
            if n is not cl.coord:  # the coordinator's record table refuses rows once guarded
                c.execute("INSERT INTO idempotency.records (scope, key, status, created_at) "
                          "VALUES ('old', 'old-1', 'completed', now() - interval '11 days')")
        gone = False
        for _ in range(40):
            with n.connect() as c:
                left = c.execute("SELECT count(*) FROM idempotency.partitions "
                                 "WHERE range_to < now() - interval '8 days'").fetchone()[0]
                ahead = c.execute("SELECT count(*) FROM idempotency.partitions WHERE range_to > now()").fetchone()[0]
            if left == 0:
                gone = True
                break
            time.sleep(0.5)
        ck.check(f"{n.name}: launcher running, its worker dropped {len(old)} old partitions by itself, "
                 "current ones kept", launcher == 1 and len(old) >= 3 and gone and ahead >= 1,
                 (launcher, old, gone, ahead))


def t_rebalance(cl, ck):
    with cl.coord.connect() as c:
        tenant = "moving-tenant"
        c.execute("SELECT idem_once('before-move', %s)", (tenant,))
        c.execute("INSERT INTO ledger (tenant, msg) VALUES (%s, 'before-move')", (tenant,))
        tok = c.execute("SELECT token FROM idem_claim('lease-in-flight', '1 hour', %s)", (tenant,)).fetchone()[0]
        shard = c.execute("SELECT get_shard_id_for_distribution_column('ledger', %s::text)", (tenant,)).fetchone()[0]
        src = worker_of(c, tenant)
        dst = cl.w2.port if src == cl.w1.port else cl.w1.port
        lo, hi = c.execute("SELECT shardminvalue::int, shardmaxvalue::int FROM pg_dist_shard WHERE shardid = %s",
                           (shard,)).fetchone()
        # A key processed three days ago, in a partition that both workers' own maintenance seals (each
        # round seals the partitions whose range has ended). The target's sealed partition of that day has
        # a filter that never saw the key: the move must put the record where a lookup finds it.
        old = "now() - interval '3 days'"
        for n in (cl.w1, cl.w2):
            with n.connect() as w, w.transaction():
                w.execute(f"SELECT idempotency.premake_partitions({old})")
                if n.port == src:
                    w.execute("INSERT INTO idempotency.records (scope, key, status, payload, created_at) "
                              f"VALUES (%s, 'done-days-ago', 'completed', '{{\"old\": true}}', {old})", (tenant,))
        sealed_q = f"SELECT sealed_at IS NOT NULL FROM idempotency.partitions WHERE range_from <= {old} AND range_to > {old}"
        for _ in range(60):
            if all(n.sql(sealed_q) == [(True,)] for n in (cl.w1, cl.w2)):
                break
            time.sleep(0.5)
        sealed = [n.sql(sealed_q) for n in (cl.w1, cl.w2)]
        c.execute("BEGIN")
        known = c.execute("SELECT idem_once('done-days-ago', %s)", (tenant,)).fetchone()[0]
        c.execute("ROLLBACK")
        ck.check("before the move: the day of the old key is sealed on both workers, and the key is known",
                 sealed == [[(True,)], [(True,)]] and known is False, (sealed, known))
        in_shard = cl.by_port(src).sql("SELECT count(*) FROM idempotency.records WHERE worker_hash(scope) BETWEEN %s AND %s",
                                       (lo, hi))[0][0]
        others = cl.by_port(src).sql("SELECT count(*) FROM idempotency.records")[0][0] - in_shard
        c.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s, "
                  "shard_transfer_mode := 'block_writes')", (shard, src, dst))
        moved = worker_of(c, tenant) == dst
        rows = c.execute("SELECT count(*) FROM ledger WHERE tenant = %s", (tenant,)).fetchone()[0]
        st = c.execute("SELECT status FROM idem_status('before-move', %s)", (tenant,)).fetchall()
        left = [r for r in records_on(cl.by_port(src)) if r[0] == tenant]
        ck.check("after citus_move_shard_placement the business rows moved, the records stayed on the old worker",
                 moved and rows == 1 and st == [] and len(left) == 3, (moved, rows, st, left))
        # The failure mode, as documented: the next delegated call consults the new worker, where the key is new.
        c.execute("BEGIN")
        again = c.execute("SELECT idem_once('before-move', %s)", (tenant,)).fetchone()[0]
        c.execute("ROLLBACK")
        st2, msg = sqlstate(c, "SELECT idem_complete('lease-in-flight', NULL, %s, %s)", (tenant, tok))
        ck.check("failure mode: a processed key is new again (idem_once true) and a lease holder gets P0002",
                 again is True and st2 == "P0002", (again, st2, msg))
        # The repair: move the records of the scopes whose shard moved (consumers of those tenants paused).
        # Meanwhile a role with CREATE on the workers' public schema, first in their search_path, planted
        # lookalikes of what idem_move_records sends there; they must not run (it runs as the admin).
        for n in (cl.w1, cl.w2):
            plant_worker_traps(n)
        moved_n = c.execute("SELECT idem_move_records(%s, '127.0.0.1', %s, '127.0.0.1', %s)", (shard, src, dst)).fetchone()[0]
        fired = [r for n in (cl.w1, cl.w2) for r in remove_worker_traps(n)]
        ck.check("idem_move_records ran none of the lookalikes planted on the workers", fired == [], fired)
        st = c.execute("SELECT status FROM idem_status('before-move', %s)", (tenant,)).fetchall()
        again = c.execute("SELECT idem_once('before-move', %s)", (tenant,)).fetchone()[0]
        c.execute("SELECT idem_complete('lease-in-flight', NULL, %s, %s)", (tenant, tok))
        left = [r for r in records_on(cl.by_port(src)) if r[0] == tenant]
        still = cl.by_port(src).sql("SELECT count(*) FROM idempotency.records")[0][0]
        ck.check(f"idem_move_records moved the shard's {in_shard} records (of all its tenants), no other: the key is "
                 "known again, the lease completes with its token",
                 moved_n == in_shard and st == [("completed",)] and again is False and not left and still == others,
                 (moved_n, in_shard, st, again, left, still, others))
        c.execute("BEGIN")
        old_again = c.execute("SELECT idem_once('done-days-ago', %s)", (tenant,)).fetchone()[0]
        c.execute("ROLLBACK")
        replay = c.execute("SELECT outcome, payload FROM idem_claim('done-days-ago', NULL, %s)", (tenant,)).fetchall()
        placed = cl.by_port(dst).sql(
            "SELECT r.created_at > now() - interval '2 days' FROM idempotency.records r "
            "WHERE r.scope = %s AND r.key = 'done-days-ago'", (tenant,))
        ck.check("a moved record of a day the target had sealed is written after its sealed partitions and found: "
                 "idem_once false, idem_claim replays its payload",
                 old_again is False and replay == [("completed", {"old": True})] and placed == [(True,)],
                 (old_again, replay, placed))
        st3, msg = sqlstate(c, "SELECT idem_move_records(%s, '127.0.0.1', %s, '127.0.0.1', %s)", (shard, dst, src))
        ck.check("idem_move_records towards a node that does not hold the shard: 55000", st3 == "55000", f"{st3} {msg}")


HOSTILE = "citus_hostile"
WORKER_TRAPS = """
CREATE TABLE IF NOT EXISTS public.trap_log (trap text, who name, superuser boolean);
GRANT INSERT ON public.trap_log TO PUBLIC;
CREATE OR REPLACE FUNCTION public.worker_hash(text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.trap_log VALUES ('worker_hash(text)', current_user, current_setting('is_superuser')::boolean);
    RETURN pg_catalog.worker_hash($1);
END $$;
CREATE OR REPLACE FUNCTION public.date_trunc(text, timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.trap_log VALUES ('date_trunc(text, timestamptz)', current_user, current_setting('is_superuser')::boolean);
    RETURN pg_catalog.date_trunc($1, $2);
END $$;
"""


def plant_worker_traps(node):
    """On one worker: a role with CREATE on public owns lookalikes of functions that idem_move_records used
    unqualified before 0.6.0, and the database's search_path puts public first."""
    with node.connect() as w:
        w.execute("SET citus.enable_ddl_propagation TO off")
        if not w.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (HOSTILE,)).fetchone():
            w.execute(f"CREATE ROLE {HOSTILE}")
        w.execute(f"GRANT CREATE ON SCHEMA public TO {HOSTILE}")
        w.execute(WORKER_TRAPS)
        for f in ("worker_hash(text)", "date_trunc(text, timestamptz)"):
            w.execute(f"ALTER FUNCTION public.{f} OWNER TO {HOSTILE}")
        w.execute("SELECT public.worker_hash('armed')")
        armed = w.execute("DELETE FROM public.trap_log RETURNING trap").fetchall()
        assert armed == [("worker_hash(text)",)], armed
        w.execute("ALTER DATABASE app SET search_path = public, pg_catalog")


def remove_worker_traps(node):
    """What the traps logged on one worker; then the worker is as before."""
    with node.connect() as w:
        w.execute("SET citus.enable_ddl_propagation TO off")
        w.execute("ALTER DATABASE app RESET search_path")
        fired = w.execute("SELECT trap, who, superuser FROM public.trap_log").fetchall()
        w.execute("DROP FUNCTION public.worker_hash(text), public.date_trunc(text, timestamptz)")
        w.execute("DROP TABLE public.trap_log")
        w.execute(f"REVOKE CREATE ON SCHEMA public FROM {HOSTILE}")
    return [(node.port, *r) for r in fired]


# docs/scaling-out.md "Rebalancing", the recipe for many shards at once: record the placements, move the shards, then move
# the records of every shard whose node changed.
RECORD_PLACEMENTS = ("CREATE TABLE idem_placements_before AS SELECT shardid, nodename, nodeport FROM citus_shards "
                     "WHERE table_name = 'ledger'::regclass")
MOVE_MOVED_RECORDS = """
SELECT b.shardid, idem_move_records(b.shardid, b.nodename, b.nodeport, a.nodename, a.nodeport) AS records
  FROM idem_placements_before b JOIN citus_shards a USING (shardid)
 WHERE a.table_name = 'ledger'::regclass AND (a.nodename, a.nodeport) <> (b.nodename, b.nodeport)"""


def t_drain(cl, ck):
    tenants = [f"drain-{i}" for i in range(40)]
    with cl.coord.connect() as c:
        for t in tenants:
            c.execute("SELECT * FROM idem_once_batch(ARRAY['d1', 'd2'], %s)", (t,))

        def unknown():
            c.execute("BEGIN")
            new = [t for t in tenants if c.execute("SELECT * FROM idem_once_batch(ARRAY['d1', 'd2'], %s)", (t,)).fetchall()]
            c.execute("ROLLBACK")
            return new

        def counts():
            return [w.sql("SELECT count(*) FROM idempotency.records")[0][0] for w in (cl.w1, cl.w2)]

        def move(shards_move):
            c.execute("DROP TABLE IF EXISTS idem_placements_before")
            c.execute(RECORD_PLACEMENTS)
            shards_move()
            return c.execute(MOVE_MOVED_RECORDS).fetchall()

        before = counts()
        drained = move(lambda: c.execute("SELECT citus_drain_node('127.0.0.1', %s, shard_transfer_mode := 'block_writes')",
                                         (cl.w2.port,)))
        after = counts()
        lost = unknown()
        ck.check(f"citus_drain_node of worker2 moved {len(drained)} shards, the recipe their "
                 f"{sum(n for _, n in drained)} records: worker2 holds none, and every key of {len(tenants)} tenants is known",
                 len(drained) > 0 and after == [sum(before), 0] and not lost, (before, after, lost[:5]))
        c.execute("SELECT citus_set_node_property('127.0.0.1', %s, 'shouldhaveshards', true)", (cl.w2.port,))
        back = move(lambda: (c.execute("SELECT citus_rebalance_start(shard_transfer_mode := 'block_writes')"),
                             c.execute("SELECT citus_rebalance_wait()")))
        spread = counts()
        lost = unknown()
        on_w2 = c.execute("SELECT count(*) FROM citus_shards WHERE table_name = 'ledger'::regclass AND nodeport = %s",
                          (cl.w2.port,)).fetchone()[0]
        ck.check(f"citus_rebalance_start moved {len(back)} shards back to worker2, the recipe their "
                 f"{sum(n for _, n in back)} records: records on both workers as the shards are, every key known",
                 len(back) == on_w2 > 0 and sum(spread) == sum(before) and min(spread) > 0 and not lost,
                 (back[:3], spread, on_w2, lost[:5]))
        c.execute("DROP TABLE idem_placements_before")


# ---------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", action="append")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = ap.parse_args()
    ck = Checks()
    cl = CitusCluster()
    groups = [("distribute", lambda: t_distribute(cl, ck)), ("placement", lambda: t_placement(cl, ck)),
              ("race", lambda: t_race(cl, ck, args.quick)), ("status", lambda: t_status(cl, ck)),
              ("bad-input", lambda: t_bad_input(cl, ck)), ("in-doubt", lambda: t_in_doubt(cl, ck)),
              ("chaos", lambda: t_chaos(cl, ck, args.quick)), ("maintenance", lambda: t_maintenance(cl, ck)),
              ("rebalance", lambda: t_rebalance(cl, ck)), ("drain", lambda: t_drain(cl, ck))]
    t0 = time.time()
    try:
        cl.build()
        cl.start()
        print(f"cluster up in {time.time() - t0:.1f} s: " + ", ".join(f"{n.name} {n.port}" for n in cl.nodes), flush=True)
        for name, fn in groups:
            if args.only and name not in args.only and name != "distribute":
                continue
            print(f"[{name}]", flush=True)
            t = time.time()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one failed check, and on to the next group
                ck.check(f"{name}: ran to the end", False, "".join(traceback.format_exception(e))[-3000:])
            print(f"  ({time.time() - t:.1f} s)", flush=True)
        crashes = [line for line in cl.crash_lines() if "worker" not in line.split(":")[0]]
        ck.check("no crash in the coordinator's log", not crashes, "\n".join(crashes[:10]))
    except Exception as e:  # noqa: BLE001
        ck.check("cluster", False, "".join(traceback.format_exception(e))[-3000:])
    finally:
        if not args.keep:
            cl.stop()
    print(f"total {time.time() - t0:.1f} s", flush=True)
    print(f"citus: {ck.passed} passed, {ck.failed} failed", flush=True)
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())

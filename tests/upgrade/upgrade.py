"""Upgrade test: a database written by a released version, then `ALTER EXTENSION idempotency UPDATE`.

For each old version given (--old VERSION=DIR, DIR holding the old build's idempotency.so, .control and
idempotency--VERSION.sql, see tests/upgrade/build-old):

 1. A private copy of the PostgreSQL installation (pgtools.PrivateTree) gets the OLD files; a cluster on
    the first port of the range "upgrade" of tests/ports runs from it with the library preloaded and the
    maintenance worker pointed at the test database. CREATE EXTENSION must report the old version, in the
    test database and in an empty one.
 2. The test database is written the way the old version writes it: keys in several partitions (past days
    inserted directly as the superuser, today's through the API), completed keys with payloads and
    fingerprints, terminal failures, released keys, live leases (1 hour) whose tokens are kept, expired
    leases, idem_once and idem_once_batch keys, completed and in-flight batches, hostile keys, offsets
    with generations. Every record row (every column and its partition), the offsets, token_seq and the
    partition list are snapshotted.
 3. The cluster stops, the private tree gets the NEW files (those scripts/build installed), the cluster
    starts again (no backend keeps the old library) and `ALTER EXTENSION idempotency UPDATE` runs in both
    databases; it must report the new version. A third database gets the new version by CREATE EXTENSION.
 4. Checks: no row, offset, sequence position or partition is lost or changed; each key answers
    idem_claim as its state says; idem_once is false for every known key; lease holders heartbeat and
    complete with their old tokens, other tokens are fenced; offsets never move backwards and a stale
    generation gets 55006; new tokens exceed all old ones; every partition has its own
    <partition>_key_scope_idx and <partition>_expires_at_idx (the same indexes the new version gives a
    partition it makes) and the parent has no index; a key's advisory lock is
    hashtextextended(scope || E'\\x1f' || key, 18756) split into classid/objid; writing functions fail with
    25006 in a read-only transaction; maintenance runs, and as of 30 days ahead (rolled back) drops every
    old partition; the catalog description of the extension (catalog.py) in the updated databases is
    identical to the freshly created one; the server log shows no crash.
The last line is `upgrade: N passed, N failed`.
"""
import argparse
import datetime
import difflib
import pathlib
import signal
import subprocess
import sys
import time
import traceback

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import catalog  # noqa: E402
import pgtools  # noqa: E402
from pgtools import PrivateTree, control_default_version, copy_ext_files, crash_lines  # noqa: E402

PORT = pgtools.port("upgrade")
TREE = "/tmp/idem-upgrade-inst"
NEW_FILES = "/tmp/idem-upgrade-newbuild"
DATA, EMPTY, FRESH = "upg_data", "upg_empty", "upg_fresh"
LOCK_NAMESPACE = 18756  # pg_locks.objsubid of the per-key advisory locks
# Keys that quoting, formatting or byte-wise hashing could get wrong (control characters are refused).
HOSTILE = ["O'Reilly \"q\"; DROP TABLE idempotency.records; --", "\U0001F525 \u00e9\u00e8", "%s %I %L", "$$ $body$",
           "k" * 512, "NULL", " ", "a\\b", "\u00a0\u200b", "E'\\x1f'"]

SNAP_RECORDS = """SELECT scope, key, status, token, attempts, fingerprint, payload::text, error::text, created_at,
                         updated_at, expires_at, tableoid::regclass::text
                    FROM idempotency.records ORDER BY scope, key"""
SNAP_OFFSETS = """SELECT consumer_group, topic, partition, next_offset, generation, updated_at
                    FROM idempotency.offsets ORDER BY consumer_group, topic, partition"""
SNAP_PARTS = "SELECT partition::text, range_from, range_to FROM idempotency.partitions ORDER BY range_from"


class Cluster(pgtools.Cluster):
    """A throwaway cluster run from a PrivateTree: Unix socket only, fsync off, no RUST_BACKTRACE."""

    def __init__(self, tree, port, conf=()):
        assert port in pgtools.ports("upgrade"), port
        super().__init__(port, ["log_line_prefix = '%m [%p] %e '", *conf], bindir=tree.bin, listen="",
                         max_connections=50, fsync="off", server_env={})
        self.tree = tree

    def init(self):
        """A new data directory (any previous one on this port is stopped and wiped)."""
        super().init(stop_mode="immediate")

    def start(self):
        super().start(timeout=120)

    def stop(self):
        super().stop("fast", timeout=120)

    def connect(self, dbname="postgres", autocommit=True, **kw):
        return super().connect(dbname, autocommit=autocommit, statement_timeout_ms=60000, connect_timeout=10, **kw)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=()):
        if isinstance(detail, str):
            detail = detail.splitlines()
        if ok:
            self.passed += 1
            print(f"  ok    {name}", flush=True)
        else:
            self.failed += 1
            print(f"  FAIL  {name}", flush=True)
            for line in list(detail)[:60]:
                print(f"          {line}", flush=True)
            if len(detail) > 60:
                print(f"          ... {len(detail) - 60} more lines", flush=True)

    def attempt(self, name, fn, *args):
        """Runs one group of checks; an exception is one failed check with the SQL error."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            self.check(name, False, describe_error(e))
            return None


def describe_error(e):
    lines = f"{type(e).__name__}: {getattr(e, 'sqlstate', None) or ''} {str(e).strip()}".splitlines()
    diag = getattr(e, "diag", None)
    if diag is not None and diag.context:
        lines += ["context: " + line for line in diag.context.splitlines()]
    tb = traceback.extract_tb(e.__traceback__)
    here = [f for f in tb if f.filename.endswith("upgrade.py")]
    if here:
        lines.append(f"at upgrade.py:{here[-1].lineno}: {here[-1].line}")
    return lines


def sql_error(conn, sql, params=None):
    """Runs sql and returns (sqlstate, message) of its error, or (None, result rows)."""
    try:
        with conn.transaction():
            return None, conn.execute(sql, params).fetchall()
    except psycopg.Error as e:
        return e.sqlstate, str(e).strip().splitlines()[0]


# ---------------------------------------------------------------------------------------------------
# The old version's writes


def populate(c):
    """Writes keys in every state with the OLD version; returns what the callers of the API were told."""
    told = {"live": {}, "batch_live": {}}
    c.execute("SELECT idempotency.premake_partitions(now() - interval '4 days')")  # rows go back 3 days and some minutes
    # Past days, written directly as the superuser (the API writes only into the present's partition).
    c.execute("""
        INSERT INTO idempotency.records (scope, key, status, token, attempts, fingerprint, payload, error,
                                         created_at, updated_at, expires_at)
        SELECT 'old', kind || '-' || g,
               CASE kind WHEN 'k' THEN 'completed' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
               CASE WHEN kind = 'released' THEN NULL ELSE nextval('idempotency.token_seq') END,
               CASE kind WHEN 'failed' THEN 2 ELSE 1 + g % 3 END,
               CASE WHEN g % 4 = 0 THEN 'fp-old' END,
               CASE kind WHEN 'k' THEN jsonb_build_object('g', g, 'note', repeat('x', g)) END,
               CASE kind WHEN 'failed' THEN '{"e": "poison"}'::jsonb WHEN 'released' THEN '{"e": "temporary"}' END,
               now() - (g % 3 + 1) * interval '1 day' - g * interval '1 minute',
               now() - interval '1 hour',
               CASE kind WHEN 'expired' THEN now() - interval '10 minutes'
                         WHEN 'released' THEN now() - interval '5 minutes'
                         WHEN 'live' THEN now() + interval '1 hour' END
          FROM unnest(ARRAY['k', 'failed', 'expired', 'released', 'live']) kind,
               generate_series(1, 60) g
         WHERE kind = 'k' OR g <= 6""")
    for key, token in c.execute("SELECT key, token FROM idempotency.records WHERE scope = 'old' AND key LIKE 'live-%'"):
        told["live"][("old", key)] = token
    # Today, through the API.
    for i in range(20):
        with c.transaction():
            c.execute("SELECT idem_claim(%s, scope => 'api', fingerprint => %s)", (f"done-{i}", f"fp-{i % 3}"))
            c.execute("SELECT idem_complete(%s, %s::jsonb, scope => 'api')",
                      (f"done-{i}", f'{{"i": {i}, "big": 123456789012345678901234, "s": "\u00e9\U0001F525"}}'))
    for i in range(5):
        t = c.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'api')", (f"failed-{i}",)).fetchone()[0]
        r = c.execute("SELECT idem_fail(%s, '{\"e\": \"poison\"}', retryable => false, scope => 'api', token => %s)",
                      (f"failed-{i}", t)).fetchone()[0]
        assert r == "failed", r
        t = c.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'api')", (f"released-{i}",)).fetchone()[0]
        r = c.execute("SELECT idem_fail(%s, '{\"e\": \"temporary\"}', scope => 'api', token => %s)",
                      (f"released-{i}", t)).fetchone()[0]
        assert r == "released", r
        t = c.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'api', fingerprint => 'fp-live')",
                      (f"live-{i}",)).fetchone()[0]
        told["live"][("api", f"live-{i}")] = t
    for i in range(3):
        c.execute("SELECT idem_claim(%s, ttl => '1 millisecond', scope => 'api')", (f"expired-{i}",))
    for i in range(10):
        assert c.execute("SELECT idem_once(%s, 'api')", (f"once-{i}",)).fetchone()[0] is True
    got = c.execute("SELECT idem_once_batch(ARRAY(SELECT 'once-b-' || g FROM generate_series(0, 9) g), scope => 'api')").fetchall()
    assert len(got) == 10, got
    with c.transaction():
        c.execute("SELECT * FROM idem_claim_batch(ARRAY(SELECT 'b-' || g FROM generate_series(0, 9) g), scope => 'batch')")
        c.execute("""SELECT idem_complete_batch(ARRAY(SELECT 'b-' || g FROM generate_series(0, 9) g),
                                                ARRAY(SELECT jsonb_build_object('b', g) FROM generate_series(0, 9) g),
                                                scope => 'batch')""")
    for key, token in c.execute("SELECT key, token FROM idem_claim_batch(ARRAY(SELECT 'bl-' || g FROM generate_series(0, 4) g), "
                                "ttl => '1 hour', scope => 'batch')").fetchall():
        told["batch_live"][key] = token
    with c.transaction():
        c.execute("SELECT * FROM idem_claim_batch(%s::text[], scope => 'hostile')", (HOSTILE,))
        c.execute("SELECT idem_complete_batch(%s::text[], scope => 'hostile')", (HOSTILE,))
    for g in range(3):
        for p in range(4):
            assert c.execute("SELECT idem_record_offset(%s, 'orders', %s, %s, %s)",
                             (f"group-{g}", p, 100 * p + g, 5 + g)).fetchone()[0] is True
    c.execute("SELECT idem_record_offset('nogen', 'orders', 0, 41)")
    c.execute("SELECT idem_record_offset('O''Reilly; --', 'topic %s', 2147483647, 9223372036854775000, 9223372036854775807)")
    return told


def snapshot(c):
    return {
        "records": c.execute(SNAP_RECORDS).fetchall(),
        "offsets": c.execute(SNAP_OFFSETS).fetchall(),
        "parts": c.execute(SNAP_PARTS).fetchall(),
        "seq": c.execute("SELECT last_value, is_called FROM idempotency.token_seq").fetchone(),
    }


# ---------------------------------------------------------------------------------------------------
# Checks after the update


def check_data(ck, c, before):
    after = snapshot(c)
    b = {r[:2]: r for r in before["records"]}
    a = {r[:2]: r for r in after["records"]}
    lost = [k for k in b if k not in a]
    extra = [k for k in a if k not in b]
    changed = [f"{b[k]}  became  {a[k]}" for k in b if k in a and a[k] != b[k]]
    ck.check(f"every record survived the update unchanged ({len(b)} rows in {len({r[11] for r in before['records']})} "
             "partitions, every column and its partition)",
             not lost and not extra and not changed and len(after["records"]) == len(before["records"]),
             [f"lost: {k}" for k in lost[:10]] + [f"new: {k}" for k in extra[:10]] + changed[:10])
    ck.check(f"every offset unchanged ({len(before['offsets'])} rows)", after["offsets"] == before["offsets"],
             [f"before: {x}" for x in before["offsets"] if x not in after["offsets"]]
             + [f"after:  {x}" for x in after["offsets"] if x not in before["offsets"]])
    ck.check("token_seq unchanged", after["seq"] == before["seq"], f"before {before['seq']}, after {after['seq']}")
    missing = [p for p in before["parts"] if p not in after["parts"]]
    ck.check(f"every partition kept with its range ({len(before['parts'])})", not missing,
             [f"missing or changed: {p}" for p in missing])


def partition_indexes(c):
    """{partition: [normalized index definitions]} and problems (attached indexes, invalid ones)."""
    rows = c.execute("""
        SELECT p.relname, i.relname, pg_get_indexdef(x.indexrelid), x.indisvalid AND x.indisready,
               EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)
          FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhrelid
          LEFT JOIN pg_index x ON x.indrelid = p.oid LEFT JOIN pg_class i ON i.oid = x.indexrelid
         WHERE h.inhparent = 'idempotency.records'::regclass ORDER BY 1, 2""").fetchall()
    out, problems = {}, []
    for part, idx, definition, valid, attached in rows:
        out.setdefault(part, [])
        if idx is None:
            continue
        out[part].append(definition.replace(part, "<partition>"))
        if not valid:
            problems.append(f"{idx} is not valid/ready")
        if attached:
            problems.append(f"{idx} is attached to a partitioned index")
    return {k: sorted(v) for k, v in out.items()}, problems


def check_observe(ck, c):
    """The health snapshot and the views of 0.4.0 read the records an old version wrote: per scope, the
    same counts as a direct count of the rows."""
    direct = c.execute("""
        SELECT scope, count(*), count(*) FILTER (WHERE status = 'completed'),
               count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed')
          FROM idempotency.records GROUP BY scope ORDER BY scope""").fetchall()
    metrics = c.execute("SELECT scope, retained_keys, completed_keys, in_flight + expired_leases + awaiting_retry, "
                        "dead_letters FROM idem_metrics() ORDER BY scope").fetchall()
    views = c.execute("SELECT (SELECT count(*) FROM idempotency.in_flight), "
                      "(SELECT count(*) FROM idempotency.dead_letters)").fetchone()
    ck.check(f"idem_metrics() counts the old records of each of {len(direct)} scopes; the in_flight and "
             "dead_letters views list the old pending and failed keys",
             metrics == direct and views == (sum(r[3] for r in direct), sum(r[4] for r in direct))
             and views[0] > 0 and views[1] > 0,
             {"direct": direct, "idem_metrics": metrics, "views": views})


def check_indexes(ck, c, fresh):
    parts, problems = partition_indexes(c)
    # Since 0.7.0 the lookup index is on (key, scope) and the expires_at index holds the leased rows only
    # (the update builds them anew).
    want = sorted(["CREATE INDEX <partition>_expires_at_idx ON idempotency.<partition> USING btree (expires_at) "
                   "WHERE (expires_at IS NOT NULL)",
                   "CREATE INDEX <partition>_key_scope_idx ON idempotency.<partition> USING btree (key, scope)"])
    bad = [f"{p}: {defs}" for p, defs in parts.items() if defs != want]
    ck.check(f"each of the {len(parts)} partitions has its own <partition>_key_scope_idx (key, scope) and "
             "<partition>_expires_at_idx (expires_at) WHERE expires_at IS NOT NULL, valid and not attached", parts and not bad and not problems,
             problems + bad[:10])
    n = c.execute("SELECT count(*) FROM pg_index WHERE indrelid = 'idempotency.records'::regclass").fetchone()[0]
    ck.check("the parent idempotency.records has no index", n == 0, f"{n} indexes: " + ", ".join(
        r[0] for r in c.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'idempotency.records'::regclass")))
    # The same as a partition that the new version makes itself.
    fresh.execute("SELECT idem_claim('first', scope => 'fresh')")
    fparts, fproblems = partition_indexes(fresh)
    fdefs = {tuple(v) for v in fparts.values()}
    udefs = {tuple(v) for v in parts.values()}
    ck.check("the upgraded partitions' indexes are those the new version gives the partitions it makes",
             len(fdefs) == 1 and udefs == fdefs and not fproblems,
             [f"fresh: {list(d)}" for d in fdefs] + [f"upgraded: {list(d)}" for d in udefs] + fproblems)


def check_claims(ck, c, before):
    rows = before["records"]
    max_token = max([r[3] for r in rows if r[3] is not None] + [before["seq"][0]])
    bad = {k: [] for k in ("completed", "failed", "live", "released/expired")}
    counts = dict.fromkeys(bad, 0)
    with c.transaction(force_rollback=True):
        for (scope, key, status, token, attempts, fp, payload, error, created, updated, expires, part) in rows:
            out, tok, att, pay, exp, now = c.execute(
                "SELECT outcome, token, attempts, payload::text, expires_at, clock_timestamp() "
                "FROM idem_claim(%s, scope => %s, wait => false)", (key, scope)).fetchone()
            if status == "completed":
                kind, ok = "completed", out == "completed" and pay == payload and tok == token
            elif status == "failed":
                kind, ok = "failed", out == "failed" and pay == error
            elif token is not None and expires is not None and expires > now:
                kind, ok = "live", out == "in_progress" and exp == expires
            else:
                kind, ok = "released/expired", out == "claimed" and att == attempts + 1 and tok > max_token
            counts[kind] += 1
            if not ok:
                bad[kind].append(f"{scope}/{key!r} stored {status} token {token} attempts {attempts}: "
                                 f"answered {out} token {tok} attempts {att} payload {pay}")
    what = {"completed": "replays its payload and token", "failed": "answers failed with its error",
            "live": "answers in_progress with its lease end",
            "released/expired": f"is claimed again with attempts + 1 and a token above every old one ({max_token})"}
    for kind in bad:
        ck.check(f"every {kind} key ({counts[kind]}) {what[kind]}", counts[kind] > 0 and not bad[kind], bad[kind])
    with c.transaction(force_rollback=True):
        res = [c.execute("SELECT outcome FROM idem_claim(%s, scope => 'api', fingerprint => %s, wait => false)",
                         (f"done-{i}", fp)).fetchone()[0] for i, fp in ((0, "fp-0"), (1, "other"))]
    ck.check("fingerprints kept: the same one replays, another one is a mismatch", res == ["completed", "mismatch"],
             f"answers {res}")


def check_once(ck, c, before):
    keys = [(r[0], r[1]) for r in before["records"]]
    with c.transaction(force_rollback=True):
        again = c.execute("SELECT u.scope, u.key FROM unnest(%s::text[], %s::text[]) AS u(scope, key) WHERE idem_once(u.key, u.scope)",
                          ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
    ck.check(f"idem_once is false for every known key ({len(keys)})", not again, [f"true for {k}" for k in again[:10]])
    by_scope = {}
    for s, k in keys:
        by_scope.setdefault(s, []).append(k)
    fresh = []
    with c.transaction(force_rollback=True):
        for s, ks in by_scope.items():
            fresh += [(s, r[0]) for r in c.execute("SELECT idem_once_batch(%s::text[], %s)", (ks, s)).fetchall()]
    ck.check("idem_once_batch returns none of the known keys", not fresh, [f"returned {k}" for k in fresh[:10]])


def check_holders(ck, c, before, told):
    pending = {(r[0], r[1]): r for r in before["records"] if r[2] == "pending"}
    holders = dict(told["live"])
    holders.update({("batch", k): t for k, t in told["batch_live"].items()})
    kept = [f"{k}: told {t}, stored {pending.get(k, (None,) * 4)[3]}" for k, t in holders.items()
            if pending.get(k, (None,) * 4)[3] != t]
    ck.check(f"the tokens the lease holders were given are the stored ones ({len(holders)})", not kept, kept)
    problems = []
    with c.transaction(force_rollback=True):
        for (scope, key), token in holders.items():
            if scope == "batch":
                continue
            old_end = pending[(scope, key)][10]
            st, res = sql_error(c, "SELECT idem_heartbeat(%s, '2 hours', %s, %s)", (key, scope, token))
            if st or not res[0][0] > old_end:
                problems.append(f"idem_heartbeat({key!r}, '2 hours', {scope!r}, {token}): {st} {res}")
            st, res = sql_error(c, "SELECT idem_complete(%s, '{\"done\": true}', %s, %s)", (key, scope, token))
            if st:
                problems.append(f"idem_complete({key!r}, ..., {scope!r}, {token}): {st} {res}")
            status = c.execute("SELECT status FROM idem_status(%s, %s)", (key, scope)).fetchone()
            if not status or status[0] != "completed":
                problems.append(f"{scope}/{key} is {status} after idem_complete")
        keys = sorted(told["batch_live"])
        st, res = sql_error(c, "SELECT idem_complete_batch(%s::text[], NULL, 'batch', %s::bigint[])",
                            (keys, [told["batch_live"][k] for k in keys]))
        if st or res[0][0] != len(keys):
            problems.append(f"idem_complete_batch of the batch in flight with its tokens: {st} {res}")
    ck.check(f"the holders of the {len(holders)} leases in flight heartbeat and complete with their old tokens",
             not problems, problems)
    stale = []
    with c.transaction(force_rollback=True):
        for (scope, key), token in list(holders.items())[:4]:
            for sql in ("SELECT idem_complete(%s, '{}', %s, %s)", "SELECT idem_heartbeat(%s, '1 hour', %s, %s)"):
                st, res = sql_error(c, sql, (key, scope, token + 1_000_000))
                if st != "55006":
                    stale.append(f"{sql % (repr(key), repr(scope), token + 1_000_000)}: {st} {res}")
    ck.check("a token that is not the holder's is fenced (55006)", not stale, stale)


def check_offsets(ck, c, before):
    problems = []
    with c.transaction(force_rollback=True):
        for (group, topic, part, nxt, gen, _) in before["offsets"]:
            args = (group, topic, part)
            st, res = sql_error(c, "SELECT idem_record_offset(%s, %s, %s, %s, %s)", (*args, nxt - 1, gen))
            if st or res[0][0] is not False:
                problems.append(f"redelivery of offset {nxt - 1} on {args}: {st} {res}")
            got = c.execute("SELECT idem_next_offset(%s, %s, %s)", args).fetchone()[0]
            if got != nxt:
                problems.append(f"next offset of {args} is {got}, was {nxt}")
            if gen is not None and gen > 0:
                st, res = sql_error(c, "SELECT idem_record_offset(%s, %s, %s, %s, %s)", (*args, nxt + 5, gen - 1))
                if st != "55006":
                    problems.append(f"stale generation {gen - 1} on {args} (stored {gen}): {st} {res}")
            st, res = sql_error(c, "SELECT idem_record_offset(%s, %s, %s, %s, %s)", (*args, nxt, gen))
            if st or res[0][0] is not True:
                problems.append(f"next offset {nxt} on {args} with generation {gen}: {st} {res}")
    ck.check(f"offsets ({len(before['offsets'])}) do not move backwards, move forwards, and a stale generation "
             "is fenced (55006)", not problems, problems)


def check_tokens_and_locks(ck, c, before):
    max_token = max([r[3] for r in before["records"] if r[3] is not None] + [before["seq"][0]])
    with c.transaction(force_rollback=True):
        new = [c.execute("SELECT token FROM idem_claim(%s, scope => 'api')", (f"brand-new-{i}",)).fetchone()[0]
               for i in range(3)]
    ck.check(f"new tokens {new} exceed every old one ({max_token})", all(t > max_token for t in new))
    # The advisory lock of each key this transaction claimed (and so holds until its end).
    claimed = [("api", "lock-probe"), ("old", "released-1"), ("api", "expired-0")] + [("lockprobe", k) for k in HOSTILE]
    with c.transaction(force_rollback=True):
        outcomes = [c.execute("SELECT outcome FROM idem_claim(%s, scope => %s)", (k, s)).fetchone()[0] for s, k in claimed]
        held = set(c.execute("""SELECT classid::text::bigint, objid::text::bigint FROM pg_locks
                                 WHERE locktype = 'advisory' AND objsubid = %s AND pid = pg_backend_pid()
                                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
                             (LOCK_NAMESPACE,)).fetchall())
        want = c.execute("""SELECT (h >> 32) & 4294967295, h & 4294967295, s, k
                              FROM unnest(%s::text[], %s::text[]) AS u(s, k),
                                   LATERAL (SELECT hashtextextended(u.s || E'\\x1f' || u.k, 18756) AS h) x""",
                         ([s for s, _ in claimed], [k for _, k in claimed])).fetchall()
    expected = {(a, b) for a, b, _, _ in want}
    detail = [f"outcomes: {outcomes}"] if any(o != "claimed" for o in outcomes) else []
    detail += [f"expected ({a}, {b}) for {s!r}/{k!r}: not held" for a, b, s, k in want if (a, b) not in held]
    detail += [f"held ({a}, {b}): not a hash of any claimed key" for a, b in held - expected]
    ck.check(f"the advisory lock (objsubid {LOCK_NAMESPACE}) of each of {len(claimed)} claimed keys is "
             "hashtextextended(scope || E'\\x1f' || key, 18756) as classid/objid",
             all(o == "claimed" for o in outcomes) and held == expected, detail)


def check_read_only(ck, c):
    results = []
    for sql in ("SELECT idem_once('ro-key', 'api')", "SELECT * FROM idem_claim('ro-key', scope => 'api')",
                "SELECT idem_once_batch(ARRAY['ro-key'], 'api')",
                "SELECT idem_record_offset('ro', 'orders', 0, 1)"):
        try:
            with c.transaction(force_rollback=True):
                c.execute("SET TRANSACTION READ ONLY")
                c.execute(sql).fetchall()
            results.append((sql, None, "no error"))
        except psycopg.Error as e:
            results.append((sql, e.sqlstate, str(e).strip().splitlines()[0]))
    once = results[0]
    ck.check("idem_once in a READ ONLY transaction fails with 25006", once[1] == "25006",
             f"BEGIN READ ONLY; {once[0]}: {once[1]} {once[2]}")
    others = [r for r in results[1:] if r[1] != "25006"]
    ck.check("idem_claim, idem_once_batch, idem_record_offset in a READ ONLY transaction fail with 25006", not others,
             [f"BEGIN READ ONLY; {sql}: {st} {msg}" for sql, st, msg in others])


def check_maintenance(ck, c, before):
    old_parts = [p[0] for p in before["parts"]]
    st, res = sql_error(c, "SELECT * FROM idem_maintenance()")
    left = c.execute("SELECT count(*) FROM idempotency.partitions WHERE partition::text = ANY(%s)", (old_parts,)).fetchone()[0]
    ck.check("idem_maintenance() runs and keeps the partitions within retention", st is None and left == len(old_parts),
             f"SELECT * FROM idem_maintenance(): {st} {res}; {left} of {len(old_parts)} old partitions left")
    problems = []
    with c.transaction(force_rollback=True):
        st, res = sql_error(c, "SELECT * FROM idem_maintenance(now() + interval '30 days')")
        if st:
            problems.append(f"SELECT * FROM idem_maintenance(now() + interval '30 days'): {st} {res}")
        else:
            created, dropped, deferred, reclaimed = res[0]
            survivors = [r[0] for r in c.execute("SELECT partition::text FROM idempotency.partitions "
                                                 "WHERE partition::text = ANY(%s)", (old_parts,)).fetchall()]
            if survivors or deferred or dropped < len(old_parts):
                problems.append(f"dropped {dropped}, deferred {deferred}, of {len(old_parts)} old partitions these "
                                f"survived: {survivors}")
            out = c.execute("SELECT outcome FROM idem_claim('k-1', scope => 'old')").fetchone()[0]
            if out != "claimed":
                problems.append(f"after retention the aged-out key old/k-1 answered {out}, not claimed")
    back = c.execute("SELECT count(*) FROM idempotency.partitions WHERE partition::text = ANY(%s)", (old_parts,)).fetchone()[0]
    if back != len(old_parts):
        problems.append(f"after ROLLBACK only {back} of {len(old_parts)} partitions are back")
    ck.check(f"idem_maintenance(now() + interval '30 days') drops every old partition ({len(old_parts)}; rolled back)",
             not problems, problems)


def check_sealed(ck, c, before):
    """After the first round on the new version, the old past partitions are sealed with filters of their
    keys, and every old key is still found (through those filters)."""
    past = c.execute("SELECT p.partition::oid, p.partition::text, "
                     "       (SELECT count(*) FROM idempotency.records r WHERE r.tableoid = p.partition::oid) "
                     "  FROM idempotency.partitions p WHERE p.range_to <= now()").fetchall()
    sealed = {r[0]: (r[1], r[2]) for r in c.execute("SELECT partition, keys, blocks FROM idempotency.sealed")}
    problems = [f"{name}: not sealed" for oid, name, n in past if oid not in sealed]
    problems += [f"{name}: filter of {sealed[oid][0]} keys over {n} rows, {sealed[oid][1]} blocks"
                 for oid, name, n in past if oid in sealed and (sealed[oid][0] != n or sealed[oid][1] == 0)]
    ck.check(f"the first round seals every old past partition ({len(past)}) with a filter of its keys",
             bool(past) and not problems, problems)
    check_once(ck, c, before)


def check_catalog(ck, cluster, upgraded_db, fresh_lines, old, new):
    with cluster.connect(upgraded_db) as c:
        lines = catalog.describe(c)
    diff = [line for line in difflib.unified_diff(fresh_lines, lines, f"fresh {new} (CREATE EXTENSION)",
                                                  f"{old} + ALTER EXTENSION UPDATE ({upgraded_db})", n=0, lineterm="")
            if not line.startswith("@@")]
    ck.check(f"catalog of {upgraded_db} ({old} updated to {new}) is identical to a fresh {new} "
             f"({len(fresh_lines)} lines, {sum(1 for l in fresh_lines if l.endswith(' | member'))} members)",
             not diff, diff)


def wait_for_first_round(cluster, timeout=15.0):
    """Waits until the maintenance launcher finished its first round (it then sleeps on its latch, wait
    event Extension). Returns the seconds waited, or None on timeout."""
    started = time.monotonic()
    with cluster.connect() as c:
        while time.monotonic() - started < timeout:
            row = c.execute("SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'").fetchone()
            if row and row[0] == "Extension":
                return time.monotonic() - started
            time.sleep(0.05)
    return None


# ---------------------------------------------------------------------------------------------------


def run_one(ck, old_version, old_dir, new_version, new_files):
    print(f"== upgrade {old_version} -> {new_version}", flush=True)
    tree = PrivateTree(TREE)
    tree.build()
    old_dir = pathlib.Path(old_dir)
    tree.install([old_dir / "idempotency.so", old_dir / "idempotency.control", old_dir / f"idempotency--{old_version}.sql"])
    ck.check(f"private tree {TREE} holds the old build ({', '.join(tree.installed())})",
             tree.default_version() == old_version, f"default_version {tree.default_version()}")
    released = ROOT / "sql" / "released" / f"idempotency--{old_version}.sql"
    r = subprocess.run([str(ROOT / "scripts" / "check-schema"), "--compare", str(released),
                        str(old_dir / f"idempotency--{old_version}.sql")], capture_output=True, text=True)
    ck.check(f"the old build's generated schema is the committed sql/released/{released.name}", r.returncode == 0,
             r.stdout.splitlines()[1:-1] or r.stderr)
    cluster = Cluster(tree, PORT, conf=["shared_preload_libraries = 'idempotency'", f"idempotency.database = '{DATA}'",
                                        "max_locks_per_transaction = 256"])
    try:
        cluster.init()
        cluster.start()
        with cluster.connect() as c:
            for db in (DATA, EMPTY, FRESH):
                c.execute(f"CREATE DATABASE {db}")
        for db in (DATA, EMPTY):
            with cluster.connect(db) as c:
                c.execute("CREATE EXTENSION idempotency")
                v = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]
                ck.check(f"CREATE EXTENSION in {db} reports {old_version}", v == old_version, f"reports {v}")
        with cluster.connect(DATA) as c:
            told = populate(c)
            before = snapshot(c)
        print(f"     wrote {len(before['records'])} records in {len(before['parts'])} partitions "
              f"({len({r[11] for r in before['records']})} holding records), {len(before['offsets'])} offsets; "
              f"token_seq at {before['seq'][0]}", flush=True)

        cluster.stop()
        tree.install(new_files)
        ck.check(f"private tree holds the new build ({', '.join(tree.installed())})", tree.default_version() == new_version,
                 f"default_version {tree.default_version()}")
        restart_log = cluster.log_size()
        cluster.start()
        # The new library's maintenance worker meets the old schema first (as on a real server, where the
        # launcher runs a round at once): let its first round run, then update.
        waited = wait_for_first_round(cluster)
        print("     " + ("note: the new maintenance launcher did not finish a round within 15 s of the restart"
                         if waited is None else
                         f"the new library's maintenance launcher finished its first round ({waited:.1f} s after the "
                         "restart) before the update"), flush=True)
        # Before the update, the new library meets the old schema: partitions it makes then (a day rolled
        # over, a first claim) must get their indexes too (rolled back, so the data stays as written).
        with cluster.connect(DATA) as c:
            c.execute("BEGIN")
            try:
                made = c.execute("SELECT idempotency.premake_partitions(now() + interval '60 days')").fetchone()[0]
                unindexed = c.execute("""
                    SELECT count(*) FROM idempotency.partitions p
                     WHERE range_from > now() + interval '50 days'
                       AND (SELECT count(*) FROM pg_index i WHERE i.indrelid = p.partition) <> 2""").fetchone()[0]
                err = None
            except psycopg.Error as e:
                made, unindexed, err = 0, None, describe_error(e)
            c.execute("ROLLBACK")
            ck.check("before the update, the new library makes partitions on the old schema, each with its 2 indexes",
                     err is None and made > 0 and unindexed == 0,
                     (err or []) + [f"made {made}, {unindexed} without 2 indexes"])
        for db in (DATA, EMPTY):
            with cluster.connect(db) as c:
                try:
                    c.execute("ALTER EXTENSION idempotency UPDATE")
                    err = None
                except psycopg.Error as e:
                    err = describe_error(e)
                v = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]
                ck.check(f"ALTER EXTENSION idempotency UPDATE in {db} succeeds and reports {new_version}",
                         err is None and v == new_version,
                         (err or []) + [f"reports {v}"])
        update_log = cluster.log_since(restart_log)
        with cluster.connect(FRESH) as c:
            c.execute("CREATE EXTENSION idempotency")
            v = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]
            ck.check(f"CREATE EXTENSION in {FRESH} reports {new_version}", v == new_version, f"reports {v}")
            fresh_lines = catalog.describe(c)

        for db in (EMPTY, DATA):
            ck.attempt(f"catalog comparison of {db}", check_catalog, ck, cluster, db, fresh_lines, old_version, new_version)
        with cluster.connect(DATA) as c, cluster.connect(FRESH) as f:
            ck.attempt("data check", check_data, ck, c, before)
            if tuple(map(int, new_version.split("."))) >= (0, 4, 0):
                ck.attempt("observability check", check_observe, ck, c)
            ck.attempt("index check", check_indexes, ck, c, f)
            ck.attempt("claim check", check_claims, ck, c, before)
            ck.attempt("idem_once check", check_once, ck, c, before)
            ck.attempt("lease holder check", check_holders, ck, c, before, told)
            ck.attempt("offset check", check_offsets, ck, c, before)
            ck.attempt("token and lock check", check_tokens_and_locks, ck, c, before)
            ck.attempt("read-only check", check_read_only, ck, c)
            ck.attempt("maintenance check", check_maintenance, ck, c, before)
            ck.attempt("sealed partitions check", check_sealed, ck, c, before)

        errors = [line for line in update_log.splitlines() if " ERROR:" in line or " WARNING:" in line]
        if errors:
            print("     note: the server logged between the restart and the end of ALTER EXTENSION UPDATE:", flush=True)
            for line in errors[:10]:
                print(f"       {line}", flush=True)
    finally:
        crashes = crash_lines(cluster.log_since())
        cluster.stop()
        ck.check("no server crash in the log", not crashes, crashes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", action="append", default=[], metavar="VERSION=DIR",
                    help="an old version and the directory with its build (repeatable)")
    ap.add_argument("--new-dir", metavar="DIR",
                    help="take the new build's files from DIR (a `cargo pgrx package` output directory or a flat "
                         "directory) instead of the system installation")
    args = ap.parse_args()

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    ck = Checks()
    started = time.monotonic()
    try:
        new_version = cargo_version()
        try:
            new_files = copy_ext_files(NEW_FILES, args.new_dir)
        except (OSError, RuntimeError) as e:
            new_files = []
            ck.check("the new build is installed (scripts/build)", False, str(e))
        control = pathlib.Path(NEW_FILES) / "idempotency.control"
        installed = control_default_version(control) if control.exists() else None
        names = sorted(p.name for p in new_files)
        ok = installed == new_version and "idempotency.so" in names and f"idempotency--{new_version}.sql" in names
        ck.check(f"the installed build is version {new_version} of Cargo.toml ({', '.join(names) or 'no files'})", ok,
                 f"{args.new_dir or pgtools.pg().extdir}/idempotency.control says default_version = {installed!r}, "
                 f"Cargo.toml says {new_version!r}: run scripts/build first" if installed != new_version else
                 "the library or the version's SQL file is missing: run scripts/build first")
        if ok:
            for spec in args.old:
                version, _, directory = spec.partition("=")
                ck.attempt(f"upgrade from {version} (aborted)", run_one, ck, version, directory, new_version, new_files)
    except KeyboardInterrupt as e:
        ck.check("interrupted", False, str(e) or "Ctrl-C")
    print(f"     upgrade test took {time.monotonic() - started:.0f} s", flush=True)
    print(f"upgrade: {ck.passed} passed, {ck.failed} failed", flush=True)
    return 1 if ck.failed or not ck.passed else 0


def cargo_version():
    for line in (ROOT / "Cargo.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("no version in Cargo.toml")


if __name__ == "__main__":
    sys.exit(main())

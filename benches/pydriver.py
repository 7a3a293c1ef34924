"""A small closed-loop client for what pgbench cannot express.

pgbench aborts a client on any error other than a serialization failure or a deadlock, so
pattern 5c (a plain INSERT that fails on a duplicate, the application catching the
unique_violation) cannot run its duplicates variant under pgbench. This driver runs one
statement per transaction (autocommit) from N processes, each with its own connection and a
prepared statement, for a fixed time, and reports the same figures as a pgbench run:
transactions per second and per-transaction latencies in microseconds.

It also runs the floor (workload 1) so that the driver's own overhead shows as a ratio against
a row measured the same way.
"""
import argparse
import json
import multiprocessing as mp
import random
import sys
import time

import psycopg
from psycopg import errors

STATEMENTS = {
    # Workload 1 (floor), the same statement as benches/sql/w1_floor.sql.
    "floor": "INSERT INTO floor_keys (key) VALUES (%s) ON CONFLICT DO NOTHING",
    # Pattern 5c, the same statement as benches/sql/w5c_plain_insert.sql.
    "plain_insert": "INSERT INTO processed_events (event_id) VALUES (%s)",
}


def worker(conninfo, sql, dup, dupkeys, seed, start_at, stop_at, out):
    try:
        out.put(run_client(conninfo, sql, dup, dupkeys, seed, start_at, stop_at))
    except BaseException as e:  # report, so that the parent does not wait forever
        out.put(("error", repr(e)))


def run_client(conninfo, sql, dup, dupkeys, seed, start_at, stop_at):
    rng = random.Random(seed)
    lat = []
    dups = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.cursor()
        # prepare=True: a server-side prepared statement from the first execution on, as with
        # pgbench -M prepared.
        while time.time() < start_at:
            time.sleep(0.001)
        clock = time.perf_counter_ns
        while time.time() < stop_at:
            if rng.random() * 100 < dup:
                key = str(rng.randint(1, dupkeys))
            else:
                key = str(rng.randint(100000, 1000000000000))
            t0 = clock()
            try:
                cur.execute(sql, (key,), prepare=True)
            except errors.UniqueViolation:
                # The application's duplicate branch: the message was processed before; ack it.
                dups += 1
            lat.append((clock() - t0) // 1000)
    return lat, dups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conninfo", required=True)
    ap.add_argument("--workload", choices=sorted(STATEMENTS), required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--dup", type=int, default=0)
    ap.add_argument("--dupkeys", type=int, default=10000)
    args = ap.parse_args()

    sql = STATEMENTS[args.workload]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 1.0 + 0.05 * args.clients  # time for every client to connect
    stop_at = start_at + args.duration
    procs = [
        ctx.Process(target=worker, args=(args.conninfo, sql, args.dup, args.dupkeys, 1000 + i, start_at, stop_at, out))
        for i in range(args.clients)
    ]
    for p in procs:
        p.start()
    lat, dups = [], 0
    for _ in procs:
        l, d = out.get(timeout=args.duration + 120)
        if l == "error":
            for p in procs:
                p.kill()
            sys.exit(f"pydriver: a client failed: {d}")
        lat.extend(l)
        dups += d
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"pydriver: a client exited with {p.exitcode}")
    json.dump({"transactions": len(lat), "duration_s": args.duration, "duplicates": dups, "latencies_us": lat}, sys.stdout)


if __name__ == "__main__":
    main()

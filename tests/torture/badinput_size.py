"""Suite 3 (bad input): linear in the input. A call given inputs 10 and 100 times larger may take at most
about 10 and 100 times longer: for each function that takes a sizeable argument (parts, a document, paths,
key arrays, payloads), the call at sizes n, 10n and 100n, each timed three times, the sizes taking turns.

What is timed: the CPU time of the backend that runs the statement (the first field of /proc/PID/schedstat,
in nanoseconds), the statement's parameters included, as a client sends them. Unlike the wall clock, it does
not count the time other processes of a busy machine take from the backend. The median of the three calls
of a size stands for it.

The bound, stated once: t(10n) <= 30 t(n) and t(100n) <= 300 t(n), three times linear. Linear work, a
sort's log factor and caches pass (measured, both editions: 3x to 12x at 10n, 29x to 118x at 100n); work
that grows with the square of the input (100x and 10,000x) fails, at 100n by a factor of 33. A call that takes longer than
four times its bound (wall clock, at least 10 s) is cancelled and fails; after a call over twice its bound
(or a cancelled one) that size is not called again and the larger sizes are not run.

And idem_key over 1,000,000 parts answers within three times the native extension's time: the statement's
CPU time in a database of the same cluster with the native extension (CREATE EXTENSION idempotency, the
library not preloaded), three calls each, alternating, with the same key answered. Only when the suite
runs against the SQL edition (IDEM_EDITION=sql); the native run reports it as skipped.

Each writing call runs in a transaction of its own, rolled back; the limits it needs beyond the defaults
(max_batch_keys, max_payload_bytes) are raised by the session, a superuser's.
"""
import json
import os
import statistics
import time
from dataclasses import dataclass, field

import pgtools
import psycopg

from harness import log

SIZE_DB = "badinput_size"
NATIVE_DB = "badinput_native"
NAMESPACE = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
RUNS = 3
FACTORS = (1, 10, 100)
BOUND = 3  # times linear
NATIVE_PARTS = 1_000_000
NATIVE_BOUND = 3
SESSION = ["SET idempotency.max_batch_keys = 1000000", "SET idempotency.max_payload_bytes = '1GB'"]


@dataclass
class Workload:
    name: str
    base: int                             # n: the smallest size
    unit: str
    call: object                          # size -> (sql, params) of the timed statement
    prelude: object = None                # size -> [(sql, params)] run first, in the same transaction
    writes: bool = False                  # in BEGIN ... ROLLBACK
    figures: dict = field(default_factory=dict)


def _array(values):
    """A text[] literal (sent as one text parameter, cast by the statement)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _keys(prefix, n):
    return _array([f"{prefix}-{i}" for i in range(n)])


def _document(n):
    return json.dumps({f"k{i}": {"id": i, "name": f"item {i}", "tags": ["a", "b"], "price": i * 1.25} for i in range(n)})


def _paths(n):
    return json.dumps({"a": {f"k{i}": i for i in range(n)}}), _array([f"/a/k{i}" for i in range(n)])


def _claimed(prefix):
    return lambda n: [("SELECT count(*) FROM idem_claim_batch(%s::text[], scope => 'size')", [_keys(prefix, n)])]


WORKLOADS = [
    Workload("idem_key", 10_000, "parts",
             lambda n: ("SELECT idem_key(%s::uuid, VARIADIC %s::text[])", [NAMESPACE, _keys("part", n)])),
    Workload("idem_fingerprint, document", 100, "members",
             lambda n: ("SELECT idem_fingerprint(%s::jsonb)", [_document(n)])),
    Workload("idem_fingerprint, paths", 200, "paths",
             lambda n: ("SELECT idem_fingerprint(%s::jsonb, VARIADIC %s::text[])", list(_paths(n)))),
    Workload("idem_once_batch", 100, "keys",
             lambda n: ("SELECT count(*) FROM idem_once_batch(%s::text[], 'size')", [_keys("once", n)]), writes=True),
    Workload("idem_claim_batch, new keys", 100, "keys",
             lambda n: ("SELECT count(*) FROM idem_claim_batch(%s::text[], scope => 'size')", [_keys("new", n)]),
             writes=True),
    Workload("idem_claim_batch, keys claimed", 100, "keys",
             lambda n: ("SELECT count(*) FROM idem_claim_batch(%s::text[], scope => 'size')", [_keys("held", n)]),
             _claimed("held"), writes=True),
    Workload("idem_complete_batch", 100, "keys",
             lambda n: ("SELECT idem_complete_batch(%s::text[], %s::jsonb[], 'size')",
                        [_keys("done", n), "{" + ",".join('"{\\"n\\": %d}"' % i for i in range(n)) + "}"]),
             _claimed("done"), writes=True),
    Workload("idem_complete, payload", 100_000, "bytes",
             lambda n: ("SELECT idem_complete('payload', jsonb_build_object('x', %s::text), 'size')", ["x" * n]),
             lambda n: [("SELECT count(*) FROM idem_claim('payload', scope => 'size')", [])], writes=True),
    Workload("idem_fail, error", 100_000, "bytes",
             lambda n: ("SELECT idem_fail('error', jsonb_build_object('x', %s::text), false, 'size')", ["x" * n]),
             lambda n: [("SELECT count(*) FROM idem_claim('error', scope => 'size')", [])], writes=True),
]


class Clock:
    """The CPU time of one backend, in nanoseconds (/proc/PID/schedstat)."""

    def __init__(self, conn):
        self.path = f"/proc/{conn.info.backend_pid}/schedstat"

    def cpu(self):
        with open(self.path) as f:
            return int(f.read().split()[0])


def _timed(conn, clock, w, n, call, timeout_s):
    """One call of w at size n: (CPU seconds, wall seconds, first column of the answer). Raises on error."""
    sql, params = call
    conn.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
    try:
        if w.writes:
            conn.execute("BEGIN")
        for pre_sql, pre_params in (w.prelude(n) if w.prelude else []):
            conn.execute(pre_sql, pre_params)
        c0, w0 = clock.cpu(), time.monotonic()
        row = conn.execute(sql, params).fetchone()
        cpu, wall = (clock.cpu() - c0) / 1e9, time.monotonic() - w0
    finally:
        if w.writes:
            conn.execute("ROLLBACK")
        conn.execute("RESET statement_timeout")
    return cpu, wall, row[0]


def measure(conn, w):
    """The median CPU time of each size of w, against its bound; the violations. After a call over twice its
    bound (against the base's median so far) that size is judged on the calls made, and the larger sizes are
    not run."""
    clock = Clock(conn)
    sizes = [w.base * f for f in FACTORS]
    calls = {n: w.call(n) for n in sizes}
    runs = {n: [] for n in sizes}
    walls = {n: [] for n in sizes}
    stopped = None
    problems = []

    def bound(n):
        return BOUND * (n // sizes[0]) * statistics.median(runs[sizes[0]])

    for _ in range(RUNS):   # the sizes take turns, so that a busy moment falls on all of them
        for n in sizes:
            if stopped is not None and n >= stopped:
                break
            timeout = max(10.0, 4 * BOUND * (n // sizes[0]) * statistics.median(walls[sizes[0]])) if walls[sizes[0]] else 60.0
            try:
                cpu, wall, _ = _timed(conn, clock, w, n, calls[n], timeout)
            except psycopg.errors.QueryCanceled:
                problems.append(f"{w.name}: {n:,} {w.unit}: cancelled after {timeout:.1f} s"
                                + (f" (bound {bound(n):.3f} s of CPU)" if n != sizes[0] else ""))
                stopped = n
                break
            runs[n].append(cpu)
            walls[n].append(wall)
            if n != sizes[0] and cpu > 2 * bound(n):
                stopped = n   # judged on this call; neither it nor the larger sizes run again
    if not runs[sizes[0]]:
        return problems
    base = statistics.median(runs[sizes[0]])
    parts = [f"{sizes[0]:,} {w.unit} {base * 1000:.1f} ms"]
    for n, f in zip(sizes[1:], FACTORS[1:]):
        if not runs[n]:
            parts.append(f"{n:,}: not run")
            continue
        t = statistics.median(runs[n])
        parts.append(f"{n:,} {t * 1000:.1f} ms ({t / base:.1f}x)")
        if t > BOUND * f * base:
            problems.append(f"{w.name}: {n:,} {w.unit} took {t / base:.1f}x the CPU time of {sizes[0]:,} "
                            f"({t * 1000:.1f} ms against {base * 1000:.1f} ms; bound {BOUND * f}x)")
    w.figures[f"{w.name}, CPU (median of {RUNS})"] = ", ".join(parts)
    return problems


def native_key(cluster, conn):
    """idem_key over NATIVE_PARTS parts, SQL edition against the native extension: (violations, figure). The
    edition's call is cancelled after four times its bound (wall clock, at least 10 s)."""
    with cluster.connect() as c:
        c.execute(f'DROP DATABASE IF EXISTS "{NATIVE_DB}"')
        c.execute(f'CREATE DATABASE "{NATIVE_DB}"')
    sql, params = "SELECT idem_key(%s::uuid, VARIADIC %s::text[])", [NAMESPACE, _keys("part", NATIVE_PARTS)]
    times, walls, answers = {"native": [], "edition": []}, [], set()
    with cluster.connect(NATIVE_DB, timeout_ms=600000) as native:
        native.execute("CREATE EXTENSION idempotency")
        sessions = {"native": native, "edition": conn}
        for _ in range(RUNS):
            for name, s in sessions.items():
                clock, timeout = Clock(s), 600.0
                if name == "edition":
                    timeout = max(10.0, 4 * NATIVE_BOUND * statistics.median(walls))
                s.execute(f"SET statement_timeout = {int(timeout * 1000)}")
                c0, w0 = clock.cpu(), time.monotonic()
                try:
                    answers.add((name, s.execute(sql, params).fetchone()[0]))
                except psycopg.errors.QueryCanceled:
                    return ([f"idem_key over {NATIVE_PARTS:,} parts: the SQL edition's call cancelled after {timeout:.1f} s "
                             f"(the native extension's took {statistics.median(walls):.2f} s; bound {NATIVE_BOUND}x)"],
                            "the SQL edition's call cancelled")
                finally:
                    s.execute("RESET statement_timeout")
                times[name].append((clock.cpu() - c0) / 1e9)
                if name == "native":
                    walls.append(time.monotonic() - w0)
    e, n = statistics.median(times["edition"]), statistics.median(times["native"])
    problems = []
    if len({a for _, a in answers}) != 1:
        problems.append(f"idem_key over {NATIVE_PARTS:,} parts: the editions answered differently: {sorted(answers)}")
    if e > NATIVE_BOUND * n:
        problems.append(f"idem_key over {NATIVE_PARTS:,} parts: the SQL edition took {e / n:.2f}x the native "
                        f"extension's CPU time ({e * 1000:.0f} ms against {n * 1000:.0f} ms; bound {NATIVE_BOUND}x)")
    return problems, f"edition {e * 1000:.0f} ms, native {n * 1000:.0f} ms CPU (median of {RUNS}): {e / n:.2f}x"


def run(cluster, result):
    """The timings, in a database of their own; figures and violations into result."""
    if not os.path.exists("/proc/self/schedstat"):
        result.violation("linear in the input: no /proc/PID/schedstat on this machine, nothing timed")
        return
    cluster.create_db(SIZE_DB)
    problems = []
    with cluster.connect(SIZE_DB, timeout_ms=600000) as conn:
        for s in SESSION:
            conn.execute(s)
        for w in WORKLOADS:
            problems += measure(conn, w)
            result.figures.update(w.figures)
            log(f"linear in the input: {w.name} done")
        if pgtools.sql_edition():
            found, figure = native_key(cluster, conn)
            problems += found
        else:
            figure = "skipped: the native extension is the edition under test"
        result.figures[f"idem_key over {NATIVE_PARTS:,} parts against the native extension"] = figure
    for p in problems:
        result.violation(f"linear in the input: {p}")

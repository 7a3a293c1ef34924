"""Suite 6: SQL fuzzing.

For a bounded time, several sessions (superusers and one consumer role) call the public functions with
random arguments: mostly values of the right type drawn from hostile and ordinary pools (shared keys so
that sessions collide, empty, huge, control characters, quotes, deep and huge JSON, extreme numbers and
timestamps, arrays with NULLs, repeats, two dimensions), sometimes NULL, sometimes a value of another
type; positional or named notation; inside random transactions (three isolation levels, savepoints,
commits and rollbacks) with random settings of the idempotency.* GUCs. The maintenance launcher runs a
round every second meanwhile.

Violations: a session that loses its connection (a backend crash), a server log line with PANIC, TRAP,
"terminated by signal" or "server process ... was terminated", a postmaster start time that changed, an
internal error (XX000: a Rust panic turned into an ERROR), and any error whose fields (message, detail,
hint, context) contain Rust internals ("pgrx", "panic", "backtrace", ".rs:", "rust_begin_unwind",
"core::", "std::"): the server runs with RUST_BACKTRACE=1, so a pgrx backtrace appended to the DETAIL
of an error that crossed the extension (a timeout, a lock timeout, a serialization failure raised by
PostgreSQL inside a call) would show. Unclean errors are reported once per kind, with a count and an
example. Check violations (23514) and timeouts are counted; 23514 and XX000 are listed as notes.
"""
import json
import threading
import time

import psycopg

from harness import Cluster, crash_lines, log, port, rust_internals, seeded

PORT = port(5)
DB = "fuzz"
ROLE = "fuzz_consumer"

SIGS = {
    "idem_claim": [("key", "text"), ("ttl", "interval"), ("scope", "text"), ("fingerprint", "text"), ("wait", "boolean")],
    "idem_complete": [("key", "text"), ("payload", "jsonb"), ("scope", "text"), ("token", "bigint")],
    "idem_fail": [("key", "text"), ("error", "jsonb"), ("retryable", "boolean"), ("scope", "text"), ("token", "bigint")],
    "idem_heartbeat": [("key", "text"), ("ttl", "interval"), ("scope", "text"), ("token", "bigint")],
    "idem_once": [("key", "text"), ("scope", "text")],
    "idem_status": [("key", "text"), ("scope", "text")],
    "idem_claim_batch": [("keys", "text[]"), ("ttl", "interval"), ("scope", "text")],
    "idem_complete_batch": [("keys", "text[]"), ("payloads", "jsonb[]"), ("scope", "text"), ("tokens", "bigint[]")],
    "idem_once_batch": [("keys", "text[]"), ("scope", "text")],
    "idem_record_offset": [("consumer_group", "text"), ("topic", "text"), ("partition", "integer"),
                           ("processed_offset", "bigint"), ("generation", "bigint")],
    "idem_next_offset": [("consumer_group", "text"), ("topic", "text"), ("partition", "integer")],
    "idem_offsets": [("consumer_group", "text"), ("topic", "text")],
    "idem_reset_offset": [("consumer_group", "text"), ("topic", "text"), ("partition", "integer"), ("next_offset", "bigint")],
    "idem_maintenance": [("as_of", "timestamptz")],
    "idempotency.premake_partitions": [("as_of", "timestamptz")],
    "idem_partman_handover": [],
}
REQUIRED = {"idem_claim": 1, "idem_complete": 1, "idem_fail": 1, "idem_heartbeat": 1, "idem_once": 1, "idem_status": 1,
            "idem_claim_batch": 1, "idem_complete_batch": 1, "idem_once_batch": 1, "idem_record_offset": 4,
            "idem_next_offset": 3, "idem_offsets": 1, "idem_reset_offset": 4, "idem_maintenance": 0,
            "idempotency.premake_partitions": 0, "idem_partman_handover": 0}
WEIGHTS = {"idem_claim": 14, "idem_complete": 8, "idem_fail": 6, "idem_heartbeat": 5, "idem_once": 6, "idem_status": 4,
           "idem_claim_batch": 6, "idem_complete_batch": 5, "idem_once_batch": 4, "idem_record_offset": 6,
           "idem_next_offset": 2, "idem_offsets": 2, "idem_reset_offset": 2, "idem_maintenance": 1,
           "idempotency.premake_partitions": 1, "idem_partman_handover": 1}
GUCS = [("idempotency.lease_ttl", ["1", "1ms", "10ms", "1s", "5min", "2147483647"]),
        ("idempotency.max_attempts", ["1", "2", "5", "1000000"]),
        ("idempotency.max_key_bytes", ["1", "16", "512", "1MB"]),
        ("idempotency.max_payload_bytes", ["0", "10", "1kB", "1MB", "2GB"]),
        ("idempotency.max_batch_keys", ["1", "3", "1000", "1000000"])]


# Answers worth an example in the notes: internal errors (a Rust panic turned into an ERROR), and
# check violations (a row with no partition to go to, or a partition created over a default
# partition's rows).
EXPLAINED_STATES = ("XX000", "23514")


class Gen:
    """Random argument values, as (SQL text with a placeholder or a literal, parameters)."""

    def __init__(self, rng):
        self.r = rng
        self.tokens = [1, 2, 3]

    def text(self, small=False):
        r = self.r
        x = r.random() * (0.9 if small else 1.0)
        if x < 0.45:
            return f"k{r.randrange(25)}"
        pool = ["", " ", "default", "a\x01b", "\n", "\x7f", "\u0085", "'; DROP TABLE idempotency.records; --",
                "%s %I %L", "$$", "\\", "\u200b\u202e", "\U0001F525" * r.randrange(1, 200), "e\u0301",
                "k" * 511, "k" * 512, "k" * 513, "\u00e9" * 256, "\u00e9" * 257]
        if x < 0.8:
            return r.choice(pool)
        if x < 0.89:
            return "".join(chr(r.choice([r.randrange(32, 127), r.randrange(0x80, 0x800), r.randrange(0x800, 0xD7FF),
                                         r.randrange(1, 32)])) for _ in range(r.randrange(0, 40)))
        return "x" * r.choice([1000, 10000, 100000, 3 * 1024 * 1024])  # only at the top level

    def interval(self):
        r = self.r
        return r.choice(["1 ms", "0", "-1 s", "10 ms", "50 ms", "1 s", "1 min", "1 hour", "1 year", "100000000 years",
                         "1 mon -30 days", "-1 mon 31 days", "00:00:00.000001", f"{r.randrange(1, 2000)} ms", "P1D",
                         "178000000 years", "-178000000 years"])

    def bigint(self):
        r = self.r
        return r.choice([0, -1, 1, 2**63 - 1, -(2**63), r.randrange(0, 1000), r.randrange(-10**18, 10**18),
                         r.choice(self.tokens), r.choice(self.tokens) + 1, 2**63 - 2])

    def integer(self):
        r = self.r
        return r.choice([0, -1, 1, 2**31 - 1, -(2**31), r.randrange(0, 16), r.randrange(-1000, 1000)])

    def boolean(self):
        return self.r.choice([True, False])

    def json_value(self, depth=0):
        r = self.r
        x = r.random()
        if depth > 3 or x < 0.4:
            return r.choice([None, True, False, 0, -1, 1.5, 10**30, 1e300, "", "s", "\u00e9\U0001F525", "\\u0000-like", "x" * r.randrange(0, 300)])
        if x < 0.7:
            return [self.json_value(depth + 1) for _ in range(r.randrange(0, 5))]
        return {self.text()[:50]: self.json_value(depth + 1) for _ in range(r.randrange(0, 5))}

    def jsonb(self, small=False):
        r = self.r
        x = r.random()
        if x < 0.75 or (small and x < 0.97):
            return json.dumps(self.json_value())
        if x < 0.85:
            d = r.randrange(100, 3000)
            return "[" * d + "]" * d
        if x < 0.9 and not small:
            return json.dumps({"big": "x" * r.choice([1024 * 1024 - 20, 1024 * 1024 + 1, 3 * 1024 * 1024])})
        return r.choice(["{", "nul", '"\\u0000"', "[1,]", "1e999999", "-0", "123456789012345678901234567890.5"])

    def array(self, elem):
        r = self.r
        n = 1001 if r.random() < 0.03 else r.choice([0, 1, 2, 3, 5, 10, r.randrange(0, 50)])
        out = [None if r.random() < 0.05 else elem() for _ in range(n)]
        if out and r.random() < 0.2:
            out.append(out[0])
        return out

    def timestamptz(self):
        r = self.r
        return r.choice(["now", "epoch", "2000-01-01 00:00:00+00", "1900-01-01", "4713-11-24 00:00:00+00 BC",
                         "294276-12-31 00:00:00+00", f"{r.randrange(1970, 2100)}-0{r.randrange(1, 10)}-1{r.randrange(0, 9)} 12:00:00+00",
                         "2026-03-29 02:30:00 Europe/Paris"] + (["infinity", "-infinity"] if r.random() < 0.05 else []))

    def value(self, typ):
        if typ == "text[]":
            return self.array(lambda: self.text(small=True))
        if typ == "jsonb[]":
            return self.array(lambda: self.jsonb(small=True))
        if typ == "bigint[]":
            return self.array(self.bigint)
        return getattr(self, typ)()

    def wrong(self, typ):
        """A value of another type, cast to it: PostgreSQL will find no such function (42883) or coerce."""
        other = self.r.choice([t for t in ("text", "integer", "bigint", "boolean", "jsonb", "interval", "text[]") if t != typ])
        return other, self.value(other)


def make_call(rng, gen, fn):
    sig = SIGS[fn]
    n = len(sig) if rng.random() < 0.5 else rng.randrange(REQUIRED[fn], len(sig) + 1)
    named = rng.random() < 0.6
    chosen = list(range(n))
    if named:
        optional = list(range(REQUIRED[fn], len(sig)))
        chosen = (list(range(REQUIRED[fn])) if rng.random() < 0.95 else []) + \
            sorted(rng.sample(optional, rng.randrange(0, len(optional) + 1)))
    parts, params = [], []
    for i in chosen:
        name, typ = sig[i]
        x = rng.random()
        if x < 0.12:
            expr, val = f"%s::{typ}", None
        elif x < 0.17:
            other, val = gen.wrong(typ)
            expr = f"%s::{other}"
        else:
            val = gen.value(typ)
            expr = f"%s::{typ}"
        params.append(val)
        parts.append(f"{name} => {expr}" if named else expr)
    if rng.random() < 0.02:
        parts.append("%s::int")
        params.append(1)
    args = ", ".join(parts)
    form = rng.random()
    if form < 0.7:
        sql = f"SELECT * FROM {fn}({args})"
    elif form < 0.85:
        sql = f"SELECT {fn}({args})"
    else:
        sql = f"SELECT * FROM generate_series(1, 2) g, LATERAL {fn}({args}) AS f"
    return sql, params


class Fuzzer(threading.Thread):
    def __init__(self, suite, idx, user, deadline):
        super().__init__(daemon=True, name=f"fuzz-{idx}")
        self.s = suite
        self.idx = idx
        self.user = user
        self.deadline = deadline
        self.rng = seeded(suite.seed, "fuzz", idx)
        self.gen = Gen(self.rng)
        self.conn = None

    def connect(self):
        self.conn = self.s.cluster.connect(DB, user=self.user, timeout_ms=2000)
        self.conn.execute("SET lock_timeout = '1s'")
        if self.user == "postgres":
            self.conn.execute("SET temp_file_limit = '64MB'")

    def run(self):
        try:
            self.connect()
            while time.monotonic() < self.deadline:
                self.step()
        except BaseException as e:  # noqa: BLE001
            self.s.violation(f"fuzz session {self.idx} died: {type(e).__name__}: {e}")
        finally:
            if self.conn is not None:
                self.conn.close()

    def step(self):
        rng = self.rng
        x = rng.random()
        in_tx = self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        if x < 0.04 and not in_tx:
            sql, params = rng.choice(["BEGIN", "BEGIN ISOLATION LEVEL REPEATABLE READ",
                                      "BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN READ ONLY"]), []
        elif x < 0.08 and in_tx:
            sql, params = rng.choice(["COMMIT", "ROLLBACK", "SAVEPOINT s", "ROLLBACK TO SAVEPOINT s", "COMMIT"]), []
        elif x < 0.10:
            guc, values = rng.choice(GUCS)
            sql, params = f"SET {rng.choice(['', 'LOCAL '])}{guc} = '{rng.choice(values)}'", []
        else:
            fn = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
            sql, params = make_call(rng, self.gen, fn)
            self.s.count("calls", fn)
        try:
            cur = self.conn.execute(sql, params)
            if cur.description:
                for row in cur.fetchall():
                    for v in row:
                        if isinstance(v, int) and 0 < v < 2**62:
                            self.gen.tokens.append(v)
                            del self.gen.tokens[:-50]
            self.s.count("sqlstate", "ok")
        except psycopg.DataError as e:
            if e.sqlstate is None:  # rejected by the driver (a NUL character, a number beyond int8)
                self.s.count("sqlstate", "client")
                return
            self.record(e, sql, params)
        except psycopg.Error as e:
            self.record(e, sql, params)

    def record(self, e, sql, params):
        state = e.sqlstate
        if state is None or self.conn.broken:
            self.s.violation(f"fuzz session {self.idx} lost its connection ({type(e).__name__}: {e}) on: "
                             f"{sql} with {_short(params)}")
            self.s.cluster.wait_ready(DB)
            self.connect()
            return
        self.s.count("sqlstate", state)
        self.s.count("inspected", state)
        problems = rust_internals(e)
        if problems:
            self.s.count("unclean", state)
        for problem in problems:
            self.s.unclean(state, problem, sql, params)
        if state in EXPLAINED_STATES:
            self.s.internal(f"{state}: {str(e).splitlines()[0]}", sql, params)
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR and self.rng.random() < 0.7:
            self.conn.execute("ROLLBACK")


def _short(params):
    out = []
    for p in params:
        s = repr(p)
        out.append(s if len(s) < 80 else s[:60] + f"...({len(s)} chars)")
    return "[" + ", ".join(out) + "]"


class Suite:
    def __init__(self, cluster, seed):
        self.cluster = cluster
        self.seed = seed
        self.lock = threading.Lock()
        self.counts = {}
        self.violations = []
        self.internals = {}
        self.unclean_errors = {}  # (SQLSTATE, field and markers) -> [count, example sql, example params, problem]

    def count(self, kind, what):
        with self.lock:
            d = self.counts.setdefault(kind, {})
            d[what] = d.get(what, 0) + 1

    def violation(self, text):
        with self.lock:
            self.violations.append(text)

    def unclean(self, state, problem, sql, params):
        kind = (state, problem.split(":", 1)[0])
        with self.lock:
            entry = self.unclean_errors.setdefault(kind, [0, sql, _short(params), problem])
            entry[0] += 1

    def internal(self, message, sql, params):
        with self.lock:
            if message not in self.internals:
                self.internals[message] = (0, sql, _short(params))
            n, s, p = self.internals[message]
            self.internals[message] = (n + 1, s, p)


def run(install, opts, result):
    cluster = Cluster(install, PORT, conf=[
        "shared_preload_libraries = 'idempotency'",
        f"idempotency.database = '{DB}'",
        "idempotency.maintenance_interval = '1s'",
        "max_locks_per_transaction = 256",
    ])
    cluster.start()
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as c:
            c.execute(f"CREATE ROLE {ROLE} LOGIN")
            c.execute(f"GRANT idempotency_consumer TO {ROLE}")
            start = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        log_offset = cluster.log_size()
        suite = Suite(cluster, opts.seed)
        deadline = time.monotonic() + opts.fuzz_seconds
        users = ["postgres"] * (opts.fuzz_sessions - 1) + [ROLE]
        threads = [Fuzzer(suite, i, u, deadline) for i, u in enumerate(users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(opts.fuzz_seconds + 120)
        cluster.wait_ready(DB)
        with cluster.connect(DB) as c:
            c.execute("SELECT 1")
            if c.execute("SELECT pg_postmaster_start_time()").fetchone()[0] != start:
                suite.violation("the postmaster restarted during fuzzing")
        crashes = crash_lines(cluster.log_since(log_offset))
        for line in crashes[:20]:
            suite.violation(f"server log: {line.strip()}")
        for (state, _kind), (n, sql, params, problem) in sorted(suite.unclean_errors.items(), key=lambda kv: -kv[1][0]):
            suite.violation(f"x{n} errors {state} not clean: {problem} -- e.g. {sql} with {params}")
        for v in suite.violations:
            result.violation(v)
        calls = suite.counts.get("calls", {})
        states = suite.counts.get("sqlstate", {})
        total = sum(calls.values())
        result.figures.update({
            "seconds": opts.fuzz_seconds,
            "sessions": f"{opts.fuzz_sessions} ({opts.fuzz_sessions - 1} superuser, 1 consumer role)",
            "random calls": total,
            "calls per function": ", ".join(f"{k} {v}" for k, v in sorted(calls.items())),
            "answers": ", ".join(f"{k} {v}" for k, v in sorted(states.items(), key=lambda kv: -kv[1])),
            "internal errors (XX000)": states.get("XX000", 0),
            "errors inspected for Rust internals": sum(suite.counts.get("inspected", {}).values()),
            "errors with Rust internals or XX000": sum(suite.counts.get("unclean", {}).values()),
            "backend crashes": sum(1 for v in suite.violations if "lost its connection" in v),
            "crash lines in the server log": len(crashes),
            "violations": len(result.violations),
        })
        for msg, (n, sql, params) in sorted(suite.internals.items(), key=lambda kv: -kv[1][0]):
            result.note(f"x{n} {msg} -- e.g. {sql} with {params}")
        log(f"{total} random calls in {opts.fuzz_seconds}s, {states.get('XX000', 0)} internal errors, "
            f"{len(result.violations)} violations")
    finally:
        cluster.stop()

"""The consumer workload of the torture and crash suites: a broker stream, consumers, a monitor, checks.

The stream
----------
M messages, each delivered 1 to 4 times. Deliveries are entries of partition logs, one log per
consumer, like a Kafka topic whose partition p is assigned to consumer p: a redelivery of a message is
another entry of some partition (a producer retry, a rebalance replay). All entries are shuffled into
one global order and every partition log keeps that order. About half of the messages delivered more
than once are *simultaneous*: their entries sit in distinct partitions at the same place of the global
order and share a barrier, so that their consumers start processing them at the same instant. Because
every log follows the same global order, the barriers cannot deadlock.

A consumer processes its log in order and records the offset of every entry with idem_record_offset
in the same transaction as its work, so the database holds its position; on a reconnect it seeks to
idem_offsets() and goes on from there (the entries after the stored position are delivered again).

One-transaction mode: BEGIN; idem_claim; business row; idem_complete; idem_record_offset; COMMIT.
Two-transaction mode: claim and COMMIT with a short lease; work outside the database (sometimes longer
than the lease, sometimes the consumer "dies" and abandons the claim); then BEGIN; business row;
idem_complete(token); idem_record_offset; COMMIT. A holder whose lease was taken over gets 55006 (or
55000 when the new holder already completed) and its business row is rolled back with its complete.

Transactions abort at random points after the claim (the consumer then handles the delivery again);
40001 and 40P01 are retried from BEGIN as a client would.
"""
import collections
import json
import threading
import time
from dataclasses import dataclass, field

import psycopg

import pgtools
from harness import Counter, RETRY_SQLSTATES, close_quietly, is_connection_error, sqlstate

BUSINESS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    scope    text   NOT NULL,
    key      text   NOT NULL,
    consumer int    NOT NULL,
    part     int    NOT NULL,
    off      bigint NOT NULL,
    token    bigint,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS effects_scope_key ON effects (scope, key);
GRANT SELECT, INSERT ON effects TO PUBLIC;
"""


class ConnectionLost(Exception):
    pass


class Abort(Exception):
    """An injected abort: the transaction is rolled back at this point."""


class Stop(Exception):
    pass


@dataclass(eq=False)
class Group:
    gid: int
    size: int
    barrier: threading.Barrier
    broken_counted: bool = False


@dataclass(eq=False)
class Entry:
    key: str
    msg: int
    part: int
    off: int
    group: Group = None
    waited: bool = False


@dataclass
class Stream:
    keys: list
    logs: list
    deliveries: int
    simultaneous_groups: int


def build_stream(rng, n_messages, n_parts, prefix, simultaneous=0.5):
    keys = [f"{prefix}:msg-{i:06d}" for i in range(n_messages)]
    units = []
    for i in range(n_messages):
        k = rng.randint(1, 4)
        if k >= 2 and rng.random() < simultaneous:
            parts = rng.sample(range(n_parts), min(k, n_parts))
            units.append((rng.random(), i, parts, True))
            for _ in range(k - len(parts)):
                units.append((rng.random(), i, [rng.randrange(n_parts)], False))
        else:
            for _ in range(k):
                units.append((rng.random(), i, [rng.randrange(n_parts)], False))
    units.sort(key=lambda u: u[0])
    logs = [[] for _ in range(n_parts)]
    groups = 0
    deliveries = 0
    for gid, (_, i, parts, sim) in enumerate(units):
        group = None
        if sim and len(parts) > 1:
            group = Group(gid, len(parts), threading.Barrier(len(parts)))
            groups += 1
        for p in parts:
            logs[p].append(Entry(keys[i], i, p, len(logs[p]), group))
            deliveries += 1
    return Stream(keys, logs, deliveries, groups)


@dataclass
class Settings:
    iso: str = "READ COMMITTED"
    mode: str = "1tx"               # or "2tx"
    abort_rate: float = 0.08        # transactions aborted on purpose, at a random point after the claim
    lease_ms: int = 300             # two-transaction mode: lease of a claim
    slow_rate: float = 0.08         # two-transaction mode: work that outlasts the lease, on the simultaneous
                                    # deliveries (where a peer is waiting to take the key over)
    die_rate: float = 0.005         # two-transaction mode: claim abandoned (consumer "dies")
    heartbeat_rate: float = 0.1     # two-transaction mode: heartbeat during the work
    barrier_timeout: float = 0.25  # a peer later than this does not hold the others up
    crash_tolerant: bool = False    # reconnect and resume on connection loss instead of failing
    only_one_tx: bool = True        # every consumer of the run is in one-transaction mode
    sabotage: str = None            # self-test of the checks: a consumer that breaks the rules on purpose


@dataclass
class ClientLog:
    """What the consumers were told: the client's side of the history."""
    applied: list = field(default_factory=list)    # (key, token, consumer): work + complete acknowledged
    claims: list = field(default_factory=list)     # (key, token): a committed claim (two-transaction mode)
    stale: list = field(default_factory=list)      # (key, token, sqlstate): holder rejected after losing the lease
    in_doubt: int = 0                              # COMMITs whose outcome was lost with the connection
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what, item):
        with self.lock:
            getattr(self, what).append(item)


class Run:
    """One run of the workload on one database: stream, consumers, monitor, counters and checks."""

    def __init__(self, cluster, dbname, stream, scope, settings_for, rng, result, stop=None):
        self.cluster = cluster
        self.dbname = dbname
        self.stream = stream
        self.scope = scope
        self.group = scope
        self.topic = "orders"
        self.settings_for = settings_for  # consumer index -> Settings
        self.rng = rng
        self.result = result
        self.counters = Counter()
        # Every answer and every completion the consumers got, committed or not: what the extension's
        # statistics (idempotency.stats) must add up to.
        self.answers = collections.Counter()
        self.alock = threading.Lock()
        self.clog = ClientLog()
        self.stop = stop or threading.Event()
        self.fatal = []
        self.violations = []
        self.vlock = threading.Lock()
        self.consumers = []
        self.progress = Counter()
        self.crashes_expected = False  # True: commits may be in doubt, generations grow at reconnects

    def violation(self, text):
        with self.vlock:
            self.violations.append(text)

    def saw(self, what):
        with self.alock:
            self.answers[what] += 1

    def saw_claim(self, outcome, attempts):
        self.saw(f"answered {outcome}")
        if outcome == "claimed":
            self.saw("claimed first" if attempts == 1 else "claimed again")

    def check_statistics(self, conn):
        """The counters of idempotency.stats for this run's scope against what its consumers saw. The SQL
        edition keeps no such counters (no shared memory; native only): nothing to check there."""
        if pgtools.sql_edition():
            return []
        row = conn.execute("SELECT claims, claimed_new, takeovers + retries, answered_completed, answered_in_progress, "
                           "answered_failed + answered_mismatch, completes, heartbeats, stale_refused "
                           "FROM idempotency.stats WHERE scope = %s", (self.scope,)).fetchone()
        a = self.answers
        want = (sum(v for k, v in a.items() if k.startswith("answered ")), a["claimed first"], a["claimed again"],
                a["answered completed"], a["answered in_progress"], 0, a["completes"], a["heartbeats"],
                self.counters.get("stale 55006") or 0)
        if row != want:
            names = ("claims", "claimed_new", "takeovers+retries", "answered_completed", "answered_in_progress",
                     "answered_failed+mismatch", "completes", "heartbeats", "stale_refused")
            return [f"idempotency.stats of {self.scope}: {dict(zip(names, row or ()))}, the consumers saw "
                    f"{dict(zip(names, want))}"]
        return []

    def connect(self, timeout_ms=120000):
        conn = self.cluster.connect(self.dbname, timeout_ms=timeout_ms)
        conn.execute("SET idempotency.max_attempts = 1000")
        return conn

    def entries_done(self):
        return self.progress.get("acked")

    # -------------------------------------------------------------------------------------------
    def run(self, monitor_interval=None, zombie_interval=0.25):
        n = len(self.stream.logs)
        if monitor_interval is None:
            # One sample costs about a millisecond per 2,000 deliveries of Python time.
            monitor_interval = max(0.2, self.stream.deliveries / 50000)
        for i in range(n):
            c = Consumer(self, i, self.stream.logs[i], self.settings_for(i))
            self.consumers.append(c)
        mon = threading.Thread(target=self._monitor, args=(monitor_interval,), daemon=True, name="monitor")
        zom = threading.Thread(target=self._zombie, args=(zombie_interval,), daemon=True, name="zombie")
        for c in self.consumers:
            c.start()
        mon.start()
        zom.start()
        for c in self.consumers:
            c.join()
        self.stop.set()
        mon.join(30)
        zom.join(30)
        for f in self.fatal:
            self.violation(f)

    # -------------------------------------------------------------------------------------------
    def _monitor(self, interval):
        """Samples the database in one snapshot: no stored offset ahead of applied work, no
        completed key without its business row and no business row without a completed key."""
        conn = None
        by_part = [[e.key for e in log] for log in self.stream.logs]
        while not self.stop.wait(interval):
            try:
                if conn is None or conn.closed:
                    conn = self.cluster.connect(self.dbname, timeout_ms=30000)
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                offsets = conn.execute(
                    "SELECT partition, next_offset FROM idempotency.offsets WHERE consumer_group = %s AND topic = %s",
                    (self.group, self.topic)).fetchall()
                applied = {k for (k,) in conn.execute("SELECT key FROM effects WHERE scope = %s", (self.scope,))}
                completed = {k for (k,) in conn.execute(
                    "SELECT key FROM idempotency.records WHERE scope = %s AND status = 'completed'", (self.scope,))}
                conn.execute("COMMIT")
            except psycopg.Error:
                close_quietly(conn)
                conn = None
                continue
            self.counters.add("monitor samples")
            for part, nxt in offsets:
                ahead = [k for k in by_part[part][:nxt] if k not in applied]
                if ahead:
                    self.violation(f"monitor: partition {part} stored next_offset {nxt} but {len(ahead)} entries "
                                   f"below it have no business row (e.g. {ahead[0]})")
            if completed - applied:
                self.violation(f"monitor: {len(completed - applied)} keys completed without their business row, "
                               f"e.g. {sorted(completed - applied)[:3]}")
            if applied - completed:
                self.violation(f"monitor: {len(applied - completed)} business rows whose key is not completed, "
                               f"e.g. {sorted(applied - completed)[:3]}")
        if conn is not None:
            conn.close()

    def _zombie(self, interval):
        """A consumer from an older generation: its idem_record_offset must be fenced (55006) and move
        nothing. It only touches partitions whose position the owners already created."""
        conn = None
        rng = self.rng
        while not self.stop.wait(interval):
            part = rng.randrange(len(self.stream.logs))
            try:
                if conn is None or conn.closed:
                    conn = self.cluster.connect(self.dbname, timeout_ms=30000)
                if conn.execute("SELECT idem_next_offset(%s, %s, %s)", (self.group, self.topic, part)).fetchone()[0] is None:
                    continue
                try:
                    moved = conn.execute("SELECT idem_record_offset(%s, %s, %s, %s, 0)",
                                         (self.group, self.topic, part, 10**12)).fetchone()[0]
                    self.violation(f"zombie of generation 0 moved partition {part} (returned {moved})")
                except psycopg.Error as e:
                    if sqlstate(e) == "55006":
                        self.counters.add("zombie offsets fenced")
                    elif is_connection_error(e, conn):
                        raise
                    else:
                        self.violation(f"zombie record_offset: unexpected {sqlstate(e)}: {e}")
            except psycopg.Error:
                close_quietly(conn)
                conn = None
        if conn is not None:
            conn.close()

    # -------------------------------------------------------------------------------------------
    def check(self, conn):
        """The final checks, against the database and the client's log. Returns violation texts."""
        v = []
        keys = set(self.stream.keys)
        effects = {}
        for key, consumer, part, off, token in conn.execute(
                "SELECT key, consumer, part, off, token FROM effects WHERE scope = %s", (self.scope,)):
            effects.setdefault(key, []).append((consumer, part, off, token))
        records = {k: (s, t, p) for k, s, t, p in conn.execute(
            "SELECT key, status, token, payload FROM idempotency.records WHERE scope = %s", (self.scope,))}
        missing = [k for k in keys if k not in effects]
        doubled = {k: len(e) for k, e in effects.items() if len(e) > 1}
        strangers = [k for k in effects if k not in keys]
        if missing:
            v.append(f"{len(missing)} messages without their side effect, e.g. {sorted(missing)[:3]}")
        if doubled:
            v.append(f"{len(doubled)} messages applied more than once, e.g. {sorted(doubled.items())[:3]}")
        if strangers:
            v.append(f"{len(strangers)} business rows of unknown keys")
        pending = [k for k, (s, _, _) in records.items() if s == "pending"]
        if pending:
            v.append(f"{len(pending)} keys left pending without a live holder, e.g. {sorted(pending)[:3]}")
        not_done = [k for k in keys if records.get(k, (None,))[0] != "completed"]
        if not_done:
            v.append(f"{len(not_done)} messages whose key is not completed, e.g. "
                     f"{[(k, records.get(k, (None,))[0]) for k in sorted(not_done)[:3]]}")
        completed_without = [k for k, (s, _, _) in records.items() if s == "completed" and k not in effects]
        if completed_without:
            v.append(f"{len(completed_without)} completed keys without their side effect")
        mismatched = []
        for k, rows in effects.items():
            if len(rows) != 1 or k not in records:
                continue
            consumer, part, off, token = rows[0]
            status, rtoken, payload = records[k]
            want = {"consumer": consumer, "part": part, "off": off, "token": token}
            if rtoken != token or payload != want:
                mismatched.append((k, token, rtoken, payload))
        if mismatched:
            v.append(f"{len(mismatched)} keys whose stored token/payload is not the business row's, "
                     f"e.g. {mismatched[:2]}")
        # The client's log: every acknowledged completion is there, with its token; every
        # acknowledged claim is there (the key's token only grows); no rejected holder's write.
        acked = {}
        for key, token, consumer in self.clog.applied:
            acked.setdefault(key, []).append(token)
        twice = {k: t for k, t in acked.items() if len(t) > 1}
        if twice:
            v.append(f"{len(twice)} keys acknowledged as applied more than once: {sorted(twice.items())[:3]}")
        lost = [(k, t) for k, ts in acked.items() for t in ts
                if not any(row[3] == t for row in effects.get(k, []))]
        if lost:
            v.append(f"{len(lost)} acknowledged completions lost, e.g. {lost[:3]}")
        lost_claims = [(k, t) for k, t in self.clog.claims
                       if k not in records or records[k][1] is None or records[k][1] < t]
        if lost_claims:
            v.append(f"{len(lost_claims)} acknowledged claims lost (key gone or token went back), "
                     f"e.g. {lost_claims[:3]}")
        survived = [(k, t, s) for k, t, s in self.clog.stale if any(row[3] == t for row in effects.get(k, []))]
        if survived:
            v.append(f"{len(survived)} business rows of holders that were told their lease was lost, "
                     f"e.g. {survived[:3]}")
        if not self.crashes_expected and len(acked) != len(keys):
            v.append(f"{len(acked)} keys acknowledged as applied, expected {len(keys)}")
        # Offsets: every partition consumed to its end, with its owner's last generation.
        stored = {p: (n, g) for _, p, n, g, _ in conn.execute(
            "SELECT * FROM idem_offsets(%s, %s)", (self.group, self.topic))}
        for c in self.consumers:
            want = len(c.log)
            got = stored.get(c.idx)
            if want == 0:
                continue
            if got is None or got[0] != want:
                v.append(f"partition {c.idx}: stored next_offset {got and got[0]}, its log has {want} entries")
            elif got[1] is None or got[1] > c.generation or (not self.crashes_expected and got[1] != c.generation):
                v.append(f"partition {c.idx}: stored generation {got[1]}, consumer is at {c.generation}")
            if c.acked_next > (got[0] if got else 0):
                v.append(f"partition {c.idx}: acknowledged offset {c.acked_next - 1} lost "
                         f"(stored next_offset {got and got[0]})")
        return v

    def figures(self):
        c = self.counters
        return {
            "messages": len(self.stream.keys),
            "deliveries": self.stream.deliveries,
            "deliveries handled (incl. replays)": c.get("deliveries handled"),
            "simultaneous redelivery groups": self.stream.simultaneous_groups,
            "simultaneous groups met at the barrier": c.get("simultaneous groups met"),
            "transactions committed": c.get("commits"),
            "claims answered claimed": c.get("claimed"),
            "duplicates suppressed": c.get("duplicates suppressed"),
            "slow holders (work outlasted the lease)": c.get("slow holders"),
            "takeovers": c.get("takeovers"),
            "stale holders rejected (55006)": c.get("stale 55006"),
            "stale holders rejected (55000, taker already done)": c.get("stale 55000"),
            "in_progress answers waited out": c.get("in_progress"),
            "aborts injected": c.get("aborts"),
            "claims abandoned (consumer died)": c.get("abandoned"),
            "40001 retried": c.get("retry 40001"),
            "40P01 retried": c.get("retry 40P01"),
            "offsets not advanced (replays)": c.get("offset not advanced"),
            "zombie offsets fenced": c.get("zombie offsets fenced"),
            "reconnects": c.get("reconnects"),
            "commits in doubt": self.clog.in_doubt,
            "monitor samples": c.get("monitor samples"),
        }


class Consumer(threading.Thread):
    def __init__(self, run, idx, log, settings):
        super().__init__(daemon=True, name=f"consumer-{idx}")
        self.run_ = run
        self.idx = idx
        self.log = log
        self.s = settings
        self.rng = run.rng.__class__(f"{run.rng.random()}-{idx}")
        self.conn = None
        self.generation = 1
        self.acked_next = 0           # next offset after the last acknowledged commit
        self.in_doubt_next = None     # the offset a COMMIT in doubt would have stored
        self.in_doubt_key = None      # the key whose held claim that COMMIT would have completed (2tx)
        self.held = {}                # key -> token of a committed claim not yet completed (2tx)
        self.C = run.counters

    # -------------------------------------------------------------------------------------------
    def run(self):
        try:
            self._loop()
        except Stop:
            pass
        except BaseException as e:  # noqa: BLE001 - reported as a violation
            self.run_.fatal.append(f"consumer {self.idx} died: {type(e).__name__}: {e}")
            self._break_barriers()
        finally:
            close_quietly(self.conn)

    def _break_barriers(self):
        for e in self.log:
            if e.group is not None and not e.waited:
                e.group.barrier.abort()

    def _loop(self):
        pos = self._connect_and_seek(first=True)
        while pos < len(self.log):
            if self.run_.stop.is_set() and self.run_.fatal:
                raise Stop()
            e = self.log[pos]
            if e.group is not None and not e.waited:
                e.waited = True
                try:
                    if e.group.barrier.wait(self.s.barrier_timeout) == 0:
                        self.C.add("simultaneous groups met")
                except threading.BrokenBarrierError:
                    # A peer is late (a slow consumer): this group is delivered without the barrier.
                    if not e.group.broken_counted:
                        e.group.broken_counted = True
                        self.C.add("simultaneous groups missed")
            try:
                self.C.add("deliveries handled")
                self._process(e)
                pos += 1
                self.run_.progress.add("acked")
            except ConnectionLost:
                if not self.s.crash_tolerant:
                    raise
                pos = self._connect_and_seek()

    def _connect_and_seek(self, first=False):
        """(Re)connects and returns the stored position of this consumer's partition."""
        close_quietly(self.conn)
        self.conn = None
        deadline = time.monotonic() + 300
        while True:
            try:
                self.conn = self.run_.connect()
                rows = self.conn.execute("SELECT partition, next_offset FROM idem_offsets(%s, %s)",
                                         (self.run_.group, self.run_.topic)).fetchall()
                break
            except psycopg.Error as e:
                if not (self.s.crash_tolerant and is_connection_error(e, self.conn)) or time.monotonic() > deadline:
                    raise
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                time.sleep(0.2 + self.rng.random() * 0.3)
        if not first:
            self.C.add("reconnects")
            self.generation += 1  # a rebalance: the group generation grows
        stored = dict(rows).get(self.idx, 0)
        allowed = {self.acked_next}
        if self.in_doubt_next is not None:
            allowed.add(self.in_doubt_next)
        if stored not in allowed:
            self.run_.violation(f"consumer {self.idx}: stored next_offset {stored} after reconnect, expected one of "
                                f"{sorted(allowed)} (acknowledged {self.acked_next})")
        if stored > self.acked_next:
            self.acked_next = stored  # the commit in doubt did commit
            # ... and with it the completion: the token is no longer held (a later redelivery of
            # the key must claim, not complete with a settled token).
            if self.in_doubt_key is not None:
                self.held.pop(self.in_doubt_key, None)
        self.in_doubt_next = None
        self.in_doubt_key = None
        return stored

    # -------------------------------------------------------------------------------------------
    def _sql(self, query, args=()):
        try:
            return self.conn.execute(query, args)
        except psycopg.Error as e:
            if is_connection_error(e, self.conn):
                raise ConnectionLost(str(e)) from e
            raise

    def _rollback(self):
        try:
            self.conn.execute("ROLLBACK")
        except psycopg.Error as e:
            if is_connection_error(e, self.conn):
                raise ConnectionLost(str(e)) from e
            raise

    def _commit(self, next_offset=None, completes=None):
        try:
            self.conn.execute("COMMIT")
        except psycopg.Error as e:
            if is_connection_error(e, self.conn):
                with self.run_.clog.lock:
                    self.run_.clog.in_doubt += 1
                if next_offset is not None:
                    self.in_doubt_next = next_offset
                    self.in_doubt_key = completes
                raise ConnectionLost(str(e)) from e
            raise
        self.C.add("commits")

    def _maybe_abort(self, point):
        if self.rng.random() < self.s.abort_rate / 4:
            raise Abort(point)

    def _begin(self):
        self._sql(f"BEGIN ISOLATION LEVEL {self.s.iso}")

    def _record_offset(self, e):
        off = e.off
        if self.s.sabotage == "offset-ahead" and self.rng.random() < 0.05 and e.off + 1 < len(self.log):
            off = e.off + 1
        advanced = self._sql("SELECT idem_record_offset(%s, %s, %s, %s, %s)",
                             (self.run_.group, self.run_.topic, e.part, off, self.generation)).fetchone()[0]
        if not advanced:
            self.C.add("offset not advanced")

    def _payload(self, e, token):
        return json.dumps({"consumer": self.idx, "part": e.part, "off": e.off, "token": token})

    def _retryable(self, ex):
        st = sqlstate(ex)
        if st in RETRY_SQLSTATES:
            self.C.add(f"retry {st}")
            return True
        return False

    # -------------------------------------------------------------------------------------------
    def _process(self, e):
        if self.s.mode == "1tx":
            self._process_one(e)
        else:
            self._process_two(e)
        self.acked_next = e.off + 1

    def _process_one(self, e):
        while True:
            try:
                self._begin()
                outcome, token, attempts = self._sql(
                    "SELECT outcome, token, attempts FROM idem_claim(%s, scope => %s)", (e.key, self.run_.scope)).fetchone()
                self.run_.saw_claim(outcome, attempts)
                applied = False
                if outcome == "claimed":
                    self._maybe_abort("after claim")
                    self._sql("INSERT INTO effects (scope, key, consumer, part, off, token) VALUES (%s, %s, %s, %s, %s, %s)",
                              (self.run_.scope, e.key, self.idx, e.part, e.off, token))
                    self._maybe_abort("after business write")
                    self._sql("SELECT idem_complete(%s, %s::jsonb, scope => %s)",
                              (e.key, self._payload(e, token), self.run_.scope))
                    self.run_.saw("completes")
                    self._maybe_abort("after complete")
                    applied = True
                elif outcome == "completed":
                    if self.s.sabotage == "double-apply" and self.rng.random() < 0.05:
                        self._sql("INSERT INTO effects (scope, key, consumer, part, off, token) VALUES (%s, %s, %s, %s, %s, %s)",
                                  (self.run_.scope, e.key, self.idx, e.part, e.off, token))
                elif outcome == "in_progress" and not self.s.only_one_tx:
                    # A two-transaction consumer of the same run holds a live lease on the key.
                    self.C.add("in_progress")
                    self._rollback()
                    time.sleep(0.03 + self.rng.random() * 0.05)
                    continue
                else:
                    # One-transaction mode: a concurrent claim waits for the holder's transaction,
                    # then sees completed or (after a rollback) nothing. Anything else is wrong.
                    self.run_.violation(f"one-transaction claim of {e.key} answered {outcome}")
                    self._rollback()
                    time.sleep(0.05)
                    continue
                self._record_offset(e)
                self._maybe_abort("before commit")
                self._commit(e.off + 1)
                if applied:
                    self.C.add("claimed")
                    if attempts > 1:
                        self.C.add("takeovers")
                    self.run_.clog.add("applied", (e.key, token, self.idx))
                else:
                    self.C.add("duplicates suppressed")
                return
            except Abort:
                self.C.add("aborts")
                self._rollback()
            except psycopg.Error as ex:
                if is_connection_error(ex, self.conn):
                    raise ConnectionLost(str(ex)) from ex
                self._rollback()
                if not self._retryable(ex):
                    raise

    def _claim_tx(self, e):
        """Two-transaction mode, transaction 1. Returns (outcome, token, attempts) once committed,
        or None when the claim was aborted on purpose."""
        while True:
            try:
                self._begin()
                outcome, token, attempts = self._sql(
                    "SELECT outcome, token, attempts FROM idem_claim(%s, ttl => %s::interval, scope => %s)",
                    (e.key, f"{self.s.lease_ms} milliseconds", self.run_.scope)).fetchone()
                self.run_.saw_claim(outcome, attempts)
                if outcome == "claimed" and self.rng.random() < self.s.abort_rate / 4:
                    self.C.add("aborts")
                    self._rollback()
                    return None
                self._commit()
                return outcome, token, attempts
            except psycopg.Error as ex:
                if is_connection_error(ex, self.conn):
                    raise ConnectionLost(str(ex)) from ex
                self._rollback()
                if not self._retryable(ex):
                    raise

    def _lost(self, e, token, state):
        """The holder of `token` was told its lease is lost: check that somebody else holds the key."""
        self.C.add(f"stale {state}")
        self.run_.clog.add("stale", (e.key, token, state))
        self.held.pop(e.key, None)
        row = self._sql("SELECT status, token FROM idem_status(%s, scope => %s)", (e.key, self.run_.scope)).fetchone()
        if row is None or row[1] is None or row[1] <= token:
            self.run_.violation(f"{e.key}: holder of token {token} got {state} but the key shows {row}")
        elif state == "55000" and row[0] == "pending":
            self.run_.violation(f"{e.key}: holder of token {token} got 55000 but the key is pending")

    def _process_two(self, e):
        lease = self.s.lease_ms / 1000.0
        while True:
            token = self.held.get(e.key)
            if token is None:
                r = self._claim_tx(e)
                if r is None:
                    continue
                outcome, token, attempts = r
                if outcome == "completed":
                    self._offset_only(e)
                    self.C.add("duplicates suppressed")
                    return
                if outcome == "in_progress":
                    self.C.add("in_progress")
                    time.sleep(0.005 + self.rng.random() * 0.01)
                    continue
                if outcome != "claimed":
                    self.run_.violation(f"two-transaction claim of {e.key} answered {outcome}")
                    time.sleep(lease)
                    continue
                self.C.add("claimed")
                if attempts > 1:
                    self.C.add("takeovers")
                self.held[e.key] = token
                self.run_.clog.add("claims", (e.key, token))
                # The work outside the database.
                x = self.rng.random()
                if x < self.s.die_rate:
                    # The consumer dies before completing: the claim stays until its lease expires.
                    self.C.add("abandoned")
                    self.held.pop(e.key, None)
                    continue
                if e.group is not None and x < self.s.die_rate + self.s.slow_rate:
                    self.C.add("slow holders")
                    time.sleep(lease * (1.3 + self.rng.random()))
                else:
                    time.sleep(self.rng.random() * 0.003)
                if self.rng.random() < self.s.heartbeat_rate:
                    try:
                        self._sql("SELECT idem_heartbeat(%s, ttl => %s::interval, scope => %s, token => %s)",
                                  (e.key, f"{self.s.lease_ms} milliseconds", self.run_.scope, token))
                        self.run_.saw("heartbeats")
                        self.C.add("heartbeats")
                    except psycopg.Error as ex:
                        if is_connection_error(ex, self.conn):
                            raise ConnectionLost(str(ex)) from ex
                        if sqlstate(ex) in ("55006", "55000"):
                            self._lost(e, token, sqlstate(ex))
                            continue
                        raise
            # Transaction 2: the business write and the completion, with the token.
            done = self._complete_tx(e, token)
            if done:
                return

    def _complete_tx(self, e, token):
        """Returns True once committed; False when the lease was lost (claim again)."""
        while True:
            try:
                self._begin()
                self._sql("INSERT INTO effects (scope, key, consumer, part, off, token) VALUES (%s, %s, %s, %s, %s, %s)",
                          (self.run_.scope, e.key, self.idx, e.part, e.off, token))
                self._maybe_abort("after business write")
                self._sql("SELECT idem_complete(%s, %s::jsonb, scope => %s, token => %s)",
                          (e.key, self._payload(e, token), self.run_.scope, token))
                self.run_.saw("completes")
                self._maybe_abort("after complete")
                self._record_offset(e)
                self._maybe_abort("before commit")
                self._commit(e.off + 1, completes=e.key)
                self.held.pop(e.key, None)
                self.run_.clog.add("applied", (e.key, token, self.idx))
                return True
            except Abort:
                self.C.add("aborts")
                self._rollback()
            except psycopg.Error as ex:
                if is_connection_error(ex, self.conn):
                    raise ConnectionLost(str(ex)) from ex
                self._rollback()
                st = sqlstate(ex)
                if st in ("55006", "55000"):
                    self._lost(e, token, st)
                    if self.s.sabotage == "ignore-fencing":
                        # the zombie writes its side effect anyway, outside the fenced transaction
                        self._sql("INSERT INTO effects (scope, key, consumer, part, off, token) VALUES (%s, %s, %s, %s, %s, %s)",
                                  (self.run_.scope, e.key, self.idx, e.part, e.off, token))
                    return False
                if st == "P0002":
                    self.run_.violation(f"{e.key}: acknowledged claim with token {token} is gone (P0002)")
                    self.held.pop(e.key, None)
                    return False
                if not self._retryable(ex):
                    raise

    def _offset_only(self, e):
        while True:
            try:
                self._begin()
                self._record_offset(e)
                self._commit(e.off + 1)
                return
            except psycopg.Error as ex:
                if is_connection_error(ex, self.conn):
                    raise ConnectionLost(str(ex)) from ex
                self._rollback()
                if not self._retryable(ex):
                    raise

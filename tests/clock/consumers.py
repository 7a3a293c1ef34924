"""The consumers of the clock layer: threads that take messages without pause and process each in one of
four ways (claim + complete, idem_once, a batch, a lease in two transactions), record their broker offset
in the same transaction, and re-deliver messages already done, which must never be answered as new.

What they saw is kept for the checks (clocklab.check_case): the keys they committed, every error by
SQLSTATE, the duplicates answered as new, offsets that did not advance.
"""
import itertools
import random
import threading
import time

import psycopg

from pgtools import RETRY_SQLSTATES

GROUP, TOPIC = "clock", "messages"
MODES = ("claim", "once", "batch", "lease")
BATCH = 3


class Ledger:
    """What every consumer of a case saw, shared between them."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.done = []  # keys whose first processing committed, in order
        self.done_at = []  # when each was committed (time.monotonic())
        self.errors = []  # (sqlstate, message, where)
        self.answered_new = []  # (key, what) a re-delivery answered as new
        self.offsets_stuck = []  # (consumer, offset) idem_record_offset did not advance
        self.last_offset = {}  # consumer -> the last offset it committed
        self.lost_leases = 0  # 55006 on the second transaction of a lease: taken over, processed by another
        self.reclaimed_leases = 0  # P0002 there: reclaimed by maintenance, processed again
        self.redelivered = 0
        self.tx = 0

    def next_keys(self, n):
        with self.lock:
            return [f"{self.prefix}-{next(self.seq)}" for _ in range(n)]

    def committed(self, keys):
        now = time.monotonic()
        with self.lock:
            self.done.extend(keys)
            self.done_at.extend([now] * len(keys))

    def error(self, e, where):
        with self.lock:
            self.errors.append((getattr(e, "sqlstate", None), str(e).splitlines()[0] if str(e) else repr(e), where))

    def pick_done(self, rng, max_age=None):
        """A done key, at random; with max_age, one committed at most that many real seconds ago."""
        with self.lock:
            if not self.done:
                return None
            if max_age is None:
                return rng.choice(self.done)
            oldest = time.monotonic() - max_age
            first = next((i for i in range(len(self.done_at) - 1, -1, -1) if self.done_at[i] < oldest), -1) + 1
            return rng.choice(self.done[first:]) if first < len(self.done) else None


class Gate:
    """Parks consumers between two messages, with no transaction open, while it is closed: a test that needs a
    round with no consumer writing (a seal that must not be deferred) closes it for that round."""

    def __init__(self):
        self.cond = threading.Condition()
        self.closed = False
        self.parked = set()

    def passage(self, consumer):
        """Called by a consumer between two messages: waits there while the gate is closed."""
        with self.cond:
            if self.closed and not consumer.stop.is_set():
                self.parked.add(consumer)
                self.cond.notify_all()  # once, for close(): the other parked consumers wait on
                while self.closed and not consumer.stop.is_set():
                    self.cond.wait()
            self.parked.discard(consumer)

    def close(self, consumers, within_s=60):
        """Closes the gate; returns once each of `consumers` still running is parked. A consumer not parked
        within `within_s` (stuck in a statement) fails the case rather than hanging it."""
        deadline = time.monotonic() + within_s
        with self.cond:
            self.closed = True
            while True:
                running = [c.name for c in consumers if c.is_alive() and c not in self.parked]
                if not running:
                    return
                assert time.monotonic() < deadline, f"not parked within {within_s} s: {running}"
                self.cond.wait(0.05)  # polled too: a consumer that stops (crashes) parks nowhere

    def open(self):
        with self.cond:
            self.closed = False
            self.cond.notify_all()


class Consumer(threading.Thread):
    """One consumer: until stop is set (or `budget` messages are done), processes new messages and, one time
    in `redeliver`, re-delivers a done one. `connect()` opens its session; `setup` runs once in it (SET
    TimeZone ...). `max_age`: a re-delivery picks keys done at most that many real seconds ago (still
    retained). `gate` (a Gate): passed between two messages."""

    def __init__(self, n, ledger, connect, stop, *, seed, redeliver=4, budget=None, setup=(), max_age=None,
                 ttl="5 min", gate=None):
        super().__init__(daemon=True, name=f"consumer-{n}")
        self.n, self.ledger, self.connect, self.stop = n, ledger, connect, stop
        self.rng = random.Random(seed)
        self.redeliver, self.budget, self.setup, self.max_age, self.ttl = redeliver, budget, setup, max_age, ttl
        self.gate = gate
        self.offset = 0
        self.crashed = None

    def run(self):
        try:
            with self.connect(application_name="clock-consumer") as c:
                for statement in self.setup:
                    c.execute(statement)
                done = 0
                while not self.stop.is_set() and (self.budget is None or done < self.budget):
                    if self.gate is not None:
                        self.gate.passage(self)
                    self.one(c)
                    done += 1
        except Exception as e:  # noqa: BLE001 - kept for the checks, which fail on it
            self.crashed = e
            self.ledger.error(e, f"consumer {self.n} stopped")

    def one(self, c):
        old = self.rng.randrange(self.redeliver) == 0 and self.ledger.pick_done(self.rng, self.max_age)
        mode = MODES[self.rng.randrange(len(MODES))]
        if old:
            self.ledger.redelivered += 1
            self.attempt(c, lambda: self.deliver_again(c, old, mode))
        else:
            keys = self.ledger.next_keys(BATCH if mode == "batch" else 1)
            self.attempt(c, lambda: self.process(c, keys, mode))

    def attempt(self, c, work):
        """Runs work (one or two transactions) again after 40001/40P01; any other error is kept."""
        for _ in range(20):
            try:
                work()
                return
            except psycopg.Error as e:
                c.rollback() if not c.autocommit else c.execute("ROLLBACK")
                if e.sqlstate in RETRY_SQLSTATES:
                    continue
                self.ledger.error(e, f"consumer {self.n}")
                return
        self.ledger.error(RuntimeError("20 retries"), f"consumer {self.n}")

    def commit_offset(self, c):
        """The broker position, in the same transaction as the work: it must always advance."""
        self.offset += 1
        advanced = c.execute("SELECT idem_record_offset(%s, %s, %s, %s)",
                             (GROUP, TOPIC, self.n, self.offset)).fetchone()[0]
        if not advanced:
            with self.ledger.lock:
                self.ledger.offsets_stuck.append((self.n, self.offset))

    def finish(self, c, keys):
        self.commit_offset(c)
        c.execute("COMMIT")
        offset = self.offset
        with self.ledger.lock:
            self.ledger.last_offset[self.n] = offset
            self.ledger.tx += 1
        if keys:
            self.ledger.committed(keys)

    def effect(self, c, key):
        c.execute("INSERT INTO business (key, consumer) VALUES (%s, %s)", (key, self.n))

    def process(self, c, keys, mode):
        offset_before = self.offset
        try:
            if mode == "lease":
                return self.lease(c, keys[0])
            c.execute("BEGIN")
            if mode == "claim":
                outcome = c.execute("SELECT outcome FROM idem_claim(%s)", (keys[0],)).fetchone()[0]
                if outcome != "claimed":
                    raise AssertionError(f"a new key answered {outcome}")
                self.effect(c, keys[0])
                c.execute("SELECT idem_complete(%s, '{\"ok\": true}')", (keys[0],))
            elif mode == "once":
                new = c.execute("SELECT idem_once(%s)", (keys[0],)).fetchone()[0]
                if not new:
                    raise AssertionError("a new key answered false by idem_once")
                self.effect(c, keys[0])
            else:
                rows = c.execute("SELECT key, outcome FROM idem_claim_batch(%s)", (keys,)).fetchall()
                if [o for _, o in rows] != ["claimed"] * len(keys):
                    raise AssertionError(f"new keys answered {rows}")
                for k in keys:
                    self.effect(c, k)
                c.execute("SELECT idem_complete_batch(%s)", (keys,))
            self.finish(c, keys)
        except BaseException:
            self.offset = offset_before
            raise

    def lease(self, c, key):
        """Two transactions: the claim (a lease of self.ttl) commits, then the work and the completion with
        the token. A lease taken over meanwhile (55006) was processed by the one that took it; one that
        maintenance reclaimed meanwhile (P0002: it expired more than reclaim_after ago, which a step of the
        clock forward does at once) is processed again from its claim, as a broker's redelivery would."""
        for _ in range(5):
            c.execute("BEGIN")
            outcome, token = c.execute("SELECT outcome, token FROM idem_claim(%s, %s::interval)",
                                       (key, self.ttl)).fetchone()
            c.execute("COMMIT")
            if outcome != "claimed":
                raise AssertionError(f"a new key answered {outcome}")
            offset_before = self.offset
            c.execute("BEGIN")
            try:
                self.effect(c, key)
                c.execute("SELECT idem_complete(%s, NULL, 'default', %s)", (key, token))
                self.finish(c, [key])
                return
            except psycopg.Error as e:
                self.offset = offset_before
                c.execute("ROLLBACK")
                if e.sqlstate not in ("55006", "P0002"):
                    raise
                with self.ledger.lock:
                    if e.sqlstate == "55006":
                        self.ledger.lost_leases += 1
                        return
                    self.ledger.reclaimed_leases += 1
        raise AssertionError(f"{key}: reclaimed 5 times")

    def deliver_again(self, c, key, mode):
        """A message already done, delivered again: whatever the way, it must not be new."""
        c.execute("BEGIN")
        if mode == "once":
            new = c.execute("SELECT idem_once(%s)", (key,)).fetchone()[0]
        elif mode == "batch":
            new = c.execute("SELECT outcome FROM idem_claim_batch(ARRAY[%s])", (key,)).fetchone()[0] == "claimed"
        else:
            new = c.execute("SELECT outcome FROM idem_claim(%s, wait => %s)", (key, mode == "lease")).fetchone()[0] == "claimed"
        if new:
            with self.ledger.lock:
                self.ledger.answered_new.append((key, mode))
            c.execute("ROLLBACK")
            return
        self.finish(c, [])

"""What the end-to-end exactly-once runs share, whatever the broker (tests/e2e: Kafka; tests/brokers:
RabbitMQ and NATS JetStream).

* `setup_db`: a fresh database with the extension and the ledger table `e2e.ledger`, which deliberately
  has no unique constraint on the message key, so that a message applied twice shows up as two rows;
* `Provider`: the client of tests/e2e/provider.py, the HTTP payment provider (it deduplicates by
  Idempotency-Key) that the consumers charge *outside* the database, in two-transaction mode; the
  consumers themselves (tests/e2e/consumer.py, tests/brokers/consumer.py) are written with the client
  library idempotency_client (clients/python), not here;
* `verify_ledger`: the checks at the end of a run (every produced message exactly once in the ledger,
  with its amount and its one charge; nothing else; every key completed);
* `read_events`: the consumers' JSON-lines event logs;
* `pay_with_leases` and its counters: the consumers' payment step, a lease of the client library per key
  (the asyncio consumer of tests/brokers keeps its own loop, with the same counters).

Only psycopg and the standard library; callers put tests/ on sys.path.
"""
import collections
import glob
import http.client
import json
import os
import random
import signal
import subprocess
import time

import psycopg

LEDGER_DDL = """
    CREATE SCHEMA e2e;
    CREATE SEQUENCE e2e.epoch;
    -- the business table: deliberately no unique constraint on msg_key, so that a duplicate
    -- application would show up instead of being hidden by an index. partition and kafka_offset are
    -- the message's place in a log when the broker has one (Kafka offset, JetStream stream sequence).
    CREATE TABLE e2e.ledger (id bigserial PRIMARY KEY, msg_key text NOT NULL, partition int,
        kafka_offset bigint, amount int NOT NULL, charge text NOT NULL, consumer text,
        generation bigint, at timestamptz DEFAULT clock_timestamp());
"""


def setup_db(dsn, db):
    """Drops and creates database `db` with the extension, its first partitions and the ledger."""
    with psycopg.connect(dsn + " dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db}")
    with psycopg.connect(dsn + f" dbname={db}", autocommit=True) as c:
        c.execute("CREATE EXTENSION idempotency")
        c.execute("SELECT FROM idem_maintenance()")  # its first partitions
        c.execute(LEDGER_DDL)


# ---- the payment provider's client -----------------------------------------------------------------


class Provider:
    """A keep-alive HTTP client for the payment provider (tests/e2e/provider.py)."""

    def __init__(self, port):
        self.port, self.conn = port, None

    def charge(self, key, amount):
        for attempt in range(20):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                self.conn.request("POST", "/charges", json.dumps({"amount": amount}),
                                  {"Idempotency-Key": key, "Content-Type": "application/json"})
                resp = self.conn.getresponse()
                body = json.loads(resp.read())
                if resp.status in (200, 201):
                    return body, resp.status == 200
                raise RuntimeError(f"provider answered {resp.status}: {body}")
            except (OSError, http.client.HTTPException):
                self.conn = None
                time.sleep(0.1 * (attempt + 1))
        raise RuntimeError("provider unreachable")


# ---- the end of a run -------------------------------------------------------------------------------



# ---- the payment, outside the database: a lease of the client library per key ----------------------

PAY_DEADLINE_S = 120  # keys still leased by other holders after this: the run is stuck
BUSY_PAUSE_S = 0.5    # before another try at keys leased by another holder


def amounts_of(msgs):
    amounts = {}
    for m in msgs:
        amounts.setdefault(m["key"], m["amount"])
    return amounts


def pay_counters():
    return {"claimed": 0, "replayed": 0, "waited": 0, "takeover": 0, "provider_dedup": 0, "fenced": 0,
            "heartbeats": 0}


def count_claim(st, l):
    if l.replayed:  # done before (by us before a crash, or by another holder)
        st["replayed"] += 1
    else:
        st["claimed"] += 1
        st["takeover"] += l.attempts > 1  # the previous holder's lease ended without a completion


def lease_lost(st, key, e, event):
    st["fenced"] += 1
    event("lease_lost", key=key, sqlstate=e.sqlstate,
          heartbeat_error=None if e.heartbeat_error is None else repr(e.heartbeat_error))


def pay_with_leases(db, hb, provider, msgs, lease_s, event, chaos_point, keepalive=lambda: None):
    """Charges each message's key once at the provider, under idempotency_client.lease (scope
    'payment', heartbeats on `hb`); a key another holder leases is tried again after BUSY_PAUSE_S, with
    `keepalive` called meanwhile. Returns ({key: charge}, counters)."""
    from idempotency_client import InProgress, LeaseLost, lease  # the consumers' venv has it

    amounts, charges, st = amounts_of(msgs), {}, pay_counters()
    todo, deadline = list(amounts), time.monotonic() + PAY_DEADLINE_S
    while todo:
        if time.monotonic() > deadline:
            raise RuntimeError(f"payment keys stuck in progress: {todo[:5]}")
        busy = []
        for key in todo:
            keepalive()
            l = None
            try:
                with lease(db, key, scope="payment", ttl=lease_s, heartbeat_conn=hb) as l:
                    count_claim(st, l)
                    if not l.replayed:
                        body, dedup = provider.charge(key, amounts[key])
                        st["provider_dedup"] += dedup
                        chaos_point("after_http")
                        l.result = {"charge": body["charge"]}  # idem_complete with the token at the exit
            except InProgress:  # another holder's lease is live: after it ends
                busy.append(key)
                continue
            except LeaseLost as e:  # taken over while we were slow or frozen: the new holder does it
                lease_lost(st, key, e, event)
                busy.append(key)
                continue
            finally:
                st["heartbeats"] += l.beats if l is not None else 0
            charges[key] = l.result["charge"]
        todo = busy
        if busy:
            st["waited"] += len(busy)
            pause = time.monotonic() + BUSY_PAUSE_S
            while time.monotonic() < pause:
                keepalive()
                time.sleep(0.1)
    return charges, st


def verify_ledger(db, produced, stats):
    """The violations of exactly-once at the end of a run, as sentences (none: the run passed).

    produced: {key: amount} of every message produced; stats: the provider's GET /stats answer."""
    v = []
    ledger = collections.defaultdict(list)
    for key, amount, charge in db.execute("SELECT msg_key, amount, charge FROM e2e.ledger"):
        ledger[key].append((amount, charge))
    dup = [k for k, rows in ledger.items() if len(rows) > 1]
    lost = [k for k in produced if k not in ledger]
    alien = [k for k in ledger if k not in produced]
    wrong = [k for k, rows in ledger.items() if k in produced and rows[0][0] != produced[k]]
    for name, keys in [("applied more than once", dup), ("lost (never applied)", lost),
                       ("in the ledger but never produced", alien), ("wrong amount", wrong)]:
        if keys:
            v.append(f"{len(keys)} messages {name}, e.g. {keys[:3]}")
    charges = stats["charges"]
    if len(charges) != len(produced) or set(charges) != set(produced):
        v.append(f"provider charged {len(charges)} distinct keys for {len(produced)} messages")
    if stats["stats"]["mismatched"]:
        v.append(f"provider saw {stats['stats']['mismatched']} key reuses with another amount")
    bad = [k for k, rows in ledger.items() if k in charges and
           (rows[0][1] != charges[k]["charge"] or charges[k]["amount"] != produced[k])]
    if bad:
        v.append(f"{len(bad)} ledger rows whose charge is not the provider's charge, e.g. {bad[:3]}")
    open_keys = db.execute(
        "SELECT scope, status, count(*) FROM idempotency.records WHERE status <> 'completed' "
        "GROUP BY 1, 2").fetchall()
    if open_keys:
        v.append(f"keys not completed at the end: {open_keys}")
    n_records = db.execute("SELECT scope, count(*) FROM idempotency.records GROUP BY 1").fetchall()
    if dict(n_records) != {"ledger": len(produced), "payment": len(produced)}:
        v.append(f"records per scope {dict(n_records)}, expected {len(produced)} each")
    return v


# ---- the consumer processes and the chaos ---------------------------------------------------------

FREEZE_S = 14  # longer than the consumers' session (6 s), their leases (8 s) and the brokers' timeouts
ARM_S = 10     # an armed point not reached within this is withdrawn (an idle consumer, no rebalance)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class EventLog:
    """A consumer's event log RUN_DIR/c<cid>.<pid>.jsonl: one unbuffered JSON line per event, so that
    nothing is lost to kill -9. `events(kind, **fields)`."""

    def __init__(self, run_dir, cid):
        self.fd = os.open(f"{run_dir}/c{cid}.{os.getpid()}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                          0o644)

    def __call__(self, kind, **kw):
        os.write(self.fd, (json.dumps({"t": time.time(), "ev": kind, **kw}) + "\n").encode())


def chaos_points(run_dir, cid, event):
    """The `chaos_point(point)` of a consumer: when the driver armed this point for this consumer (wrote
    its name into RUN_DIR/arm-<cid>), die here with SIGKILL, or for "freeze_<point>" stop here with
    SIGSTOP until the driver sends SIGCONT (a zombie that wakes up after its leases ended)."""

    def chaos_point(point):
        path = f"{run_dir}/arm-{cid}"
        try:
            with open(path) as f:
                armed = f.read().strip()
        except FileNotFoundError:
            return
        if armed not in (point, "freeze_" + point):
            return
        try:
            os.unlink(path)
        except FileNotFoundError:  # the driver withdrew it at this very moment: act all the same
            pass
        if armed == point:
            event("selfkill", point=point)
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            event("selffreeze", point=point)
            os.kill(os.getpid(), signal.SIGSTOP)  # the driver sends SIGCONT later
            event("thawed", point=point)

    return chaos_point


class Fleet:
    """The consumer processes: the desired set, restarts after deaths, and the chaos counters.

    Member `cid` runs `cmd + [cid]`. An exit status outside `expected_exits` (kill -9, or 3: fenced
    and left) is counted and logged; every dead member is restarted after `restart_delay`. The chaos
    hooks: `arm(cid, point)` writes RUN_DIR/arm-<cid> (see `chaos_points`), `kill9`, `freeze`."""

    def __init__(self, cmd, env, run_dir, expected_exits=(-signal.SIGKILL, 3)):
        self.cmd, self.env, self.run_dir, self.expected_exits = list(cmd), env, run_dir, expected_exits
        self.procs, self.next_cid = {}, 0
        self.restart_at = {}                  # cid -> when to restart a dead member
        self.frozen = {}                      # cid -> when to SIGCONT
        self.freeze_armed = set()             # cids armed to stop themselves
        self.armed_at = {}                    # cid -> when its arm file was written
        self.count = collections.Counter()

    def spawn(self, cid=None):
        if cid is None:
            cid, self.next_cid = self.next_cid, self.next_cid + 1
        out = open(f"{self.run_dir}/c{cid}.out", "a")
        self.procs[cid] = subprocess.Popen(self.cmd + [str(cid)], env=self.env,
                                           stdout=out, stderr=subprocess.STDOUT)
        return cid

    def alive(self):
        return [c for c, p in self.procs.items() if p.poll() is None]

    def reap(self, restart_delay=(0.0, 2.0)):
        """Schedule a restart for members that died (SIGKILL, self-kill, fenced)."""
        now = time.monotonic()
        for cid, p in list(self.procs.items()):
            if p.poll() is not None and cid not in self.restart_at:
                if p.returncode not in self.expected_exits:
                    self.count[f"exit_{p.returncode}"] += 1
                    log(f"consumer {cid} exited with {p.returncode}: see {self.run_dir}/c{cid}.out")
                self.restart_at[cid] = now + random.uniform(*restart_delay)
        for cid, at in list(self.restart_at.items()):
            if at <= now:
                del self.restart_at[cid]
                self.spawn(cid)
        for cid, at in list(self.armed_at.items()):  # an arm not reached in ARM_S is withdrawn
            path = f"{self.run_dir}/arm-{cid}"
            if not os.path.exists(path):
                del self.armed_at[cid]
            elif now - at > ARM_S:
                try:
                    os.unlink(path)
                    self.count["armed, point not reached"] += 1
                except FileNotFoundError:
                    pass
                del self.armed_at[cid]
        for cid in list(self.freeze_armed):  # a consumer that stopped itself: wake it in FREEZE_S
            p = self.procs.get(cid)
            if p is None or p.poll() is not None:
                self.freeze_armed.discard(cid)
            elif process_state(p.pid) == "T":
                self.freeze_armed.discard(cid)
                self.frozen[cid] = now + FREEZE_S
            elif cid not in self.armed_at and not os.path.exists(f"{self.run_dir}/arm-{cid}"):
                time.sleep(0.2)  # it may be between reading its arm and stopping
                if process_state(p.pid) == "T":
                    self.frozen[cid] = now + FREEZE_S
                self.freeze_armed.discard(cid)
        for cid, at in list(self.frozen.items()):
            if at <= now:
                del self.frozen[cid]
                if self.procs[cid].poll() is None:
                    os.kill(self.procs[cid].pid, signal.SIGCONT)

    def kill9(self, cid):
        os.kill(self.procs[cid].pid, signal.SIGKILL)
        self.procs[cid].wait()
        self.count["kill -9 (external, random moment)"] += 1

    def arm(self, cid, point):
        with open(f"{self.run_dir}/arm-{cid}", "w") as f:
            f.write(point)
        self.armed_at[cid] = time.monotonic()
        if point.startswith("freeze_"):
            self.freeze_armed.add(cid)

    def remove(self, cid):
        self.restart_at.pop(cid, None)
        self.freeze_armed.discard(cid)
        if self.frozen.pop(cid, None) is not None and self.procs[cid].poll() is None:
            os.kill(self.procs[cid].pid, signal.SIGCONT)
        self.procs[cid].send_signal(signal.SIGTERM)
        try:
            self.procs[cid].wait(30)
        except subprocess.TimeoutExpired:
            self.procs[cid].kill()
            self.procs[cid].wait()
        del self.procs[cid]
        self.count["members removed (clean leave)"] += 1

    def freeze(self, cid, seconds):
        os.kill(self.procs[cid].pid, signal.SIGSTOP)
        self.frozen[cid] = time.monotonic() + seconds
        self.count["frozen past session and lease (zombie)"] += 1

    def stop_all(self):
        for cid in list(self.frozen) + list(self.freeze_armed):
            if self.procs[cid].poll() is None:
                os.kill(self.procs[cid].pid, signal.SIGCONT)
        self.frozen.clear()
        self.freeze_armed.clear()
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def process_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def kills_so_far(run_dir, fleet):
    selfkills = 0
    for path in glob.glob(f"{run_dir}/c*.jsonl"):
        with open(path) as f:
            selfkills += f.read().count('"ev": "selfkill"')
    return fleet.count["kill -9 (external, random moment)"] + selfkills


def read_events(run_dir, pattern="c*.jsonl"):
    """Every complete event line of the consumers' logs RUN_DIR/c<cid>.<pid>.jsonl, oldest first, each
    with its consumer id as "cid" (a line cut by kill -9 is not an event)."""
    evs = []
    for path in glob.glob(os.path.join(run_dir, pattern)):
        cid = os.path.basename(path)[1:].split(".")[0]
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    evs.append({"cid": cid, **json.loads(line)})
    return sorted(evs, key=lambda e: e["t"])

#!/usr/bin/env python3
"""One consumer process of the end-to-end run: a Kafka consumer-group member that applies every payment
message exactly once, with both side effects:

1. outside the database, a charge at the HTTP payment provider, in TWO-TRANSACTION mode:
       idem_claim_batch(keys, ttl, 'payment')        -- its own transaction: leases + fencing tokens
       POST /charges (Idempotency-Key: key) ...        -- idem_heartbeat while the calls take long
       idem_complete_batch(keys, charges, 'payment', tokens)   -- 55006 if a lease was taken over
   A key another holder leases is retried until that lease ends; a key already completed replays the
   stored charge. A crash between the HTTP call and the completion makes the next holder call again,
   with the same key: the provider's deduplication, not the extension, makes that call harmless.
2. inside the database, the ledger row and the offset, in ONE transaction per poll:
       BEGIN; idem_claim_batch(keys, scope => 'ledger'); INSERT INTO ledger ...;
       idem_complete_batch(claimed); idem_record_offset(group, topic, p, last, generation); COMMIT
   and only then the broker commit, as a courtesy. On assignment, every partition is sought to
   idem_offsets(), not to the broker's committed offset.

Chaos hooks: the driver may write a point name into RUN_DIR/arm-<cid>; the consumer then kills itself
with SIGKILL when it reaches that point (in_assign, after_http, mid_txn, after_commit), or, for
freeze_after_http and freeze_before_txn, stops itself with SIGSTOP until the driver sends SIGCONT (a
zombie that wakes up after its session and its leases ended). SIGTERM means leave the group cleanly. Every event goes to RUN_DIR/c<cid>.<pid>.jsonl, one unbuffered line each, so
nothing is lost to kill -9.

Usage: consumer.py CID   (the rest comes from the environment; see e2e.py)
"""
import http.client
import json
import os
import signal
import sys
import time

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pgtools import RETRY_SQLSTATES  # noqa: E402 - 40001, 40P01: the whole transaction again

CID = sys.argv[1]
ENV = os.environ
RUN_DIR, TOPIC, GROUP = ENV["E2E_RUN_DIR"], ENV["E2E_TOPIC"], ENV["E2E_GROUP"]
LEASE = float(ENV.get("E2E_LEASE_S", "8"))
BATCH = int(ENV.get("E2E_POLL_MAX", "100"))
GEN_MODE = ENV.get("E2E_GENERATION", "group")  # group: Kafka's generation id; epoch: a DB sequence
LOG = os.open(f"{RUN_DIR}/c{CID}.{os.getpid()}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
STOP = False


def event(kind, **kw):
    os.write(LOG, (json.dumps({"t": time.time(), "ev": kind, **kw}) + "\n").encode())


def chaos_point(point):
    """Die here with SIGKILL if the chaos driver armed this point for this consumer."""
    path = f"{RUN_DIR}/arm-{CID}"
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


def on_sigterm(*_):
    global STOP
    STOP = True


class Fenced(Exception):
    pass


class Provider:
    """A keep-alive HTTP client for the payment provider."""

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


class Worker:
    def __init__(self):
        self.db = psycopg.connect(host=ENV["IDEM_SOCKDIR"], port=ENV["IDEM_PORT"], dbname=ENV["E2E_DB"],
                                  user="postgres", autocommit=True, application_name=f"e2e-c{CID}")
        # Under chaos a payment key can be taken over many times; the default (5) would make it terminal.
        self.db.execute("SET idempotency.max_attempts = 1000")
        self.provider = Provider(int(ENV["E2E_PROVIDER_PORT"]))
        self.generation = None
        self.consumer = Consumer({
            "bootstrap.servers": ENV["E2E_BOOTSTRAP"], "group.id": GROUP,
            "client.id": f"e2e-c{CID}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": int(ENV.get("E2E_SESSION_MS", "6000")), "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": 60000, "partition.assignment.strategy": "range",
        })
        self.consumer.subscribe([TOPIC], on_assign=self.on_assign, on_revoke=self.on_revoke)

    # ---- rebalance ---------------------------------------------------------------------------
    def current_generation(self):
        if GEN_MODE == "group":
            # librdkafka serialises its group metadata as b"CGMDv2:" + int32 generation (host order) + ...
            meta = self.consumer.consumer_group_metadata()
            if meta[:7] == b"CGMDv2:":
                return int.from_bytes(meta[7:11], sys.byteorder, signed=True)
            raise RuntimeError(f"unknown group metadata format {meta[:16]!r}")
        # epoch mode: any number that grows at each assignment does for idem_record_offset's fencing
        return self.db.execute("SELECT nextval('e2e.epoch')").fetchone()[0]

    def on_assign(self, consumer, partitions):
        self.generation = self.current_generation()
        stored = {(t, p): n for t, p, n in self.db.execute(
            "SELECT topic, partition, next_offset FROM idem_offsets(%s, %s)", (GROUP, TOPIC))}
        try:
            broker = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=5)}
        except KafkaException:
            broker = {}
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        event("assign", gen=self.generation, parts=[tp.partition for tp in partitions],
              db={tp.partition: tp.offset for tp in partitions}, broker=broker)
        chaos_point("in_assign")
        consumer.assign(partitions)

    def on_revoke(self, consumer, partitions):
        event("revoke", gen=self.generation, parts=[tp.partition for tp in partitions])
        consumer.unassign()

    # ---- the payment, outside the database (two-transaction mode) ----------------------------
    def pay(self, msgs):
        """Charge every message once at the provider; return {key: charge} from the provider or replay."""
        amounts = {}
        for m in msgs:
            amounts.setdefault(m["key"], m["amount"])
        charges, todo, st = {}, list(amounts), {"claimed": 0, "replayed": 0, "waited": 0, "takeover": 0,
                                                 "provider_dedup": 0, "fenced": 0, "heartbeats": 0}
        deadline = time.monotonic() + 120
        while todo:
            if time.monotonic() > deadline:
                raise RuntimeError(f"payment keys stuck in progress: {todo[:5]}")
            rows = self.db.execute(
                "SELECT key, outcome, token, attempts, payload FROM "
                "idem_claim_batch(%s, ttl => make_interval(secs => %s), scope => 'payment')",
                (todo, LEASE)).fetchall()
            mine, busy = [], []
            for key, outcome, token, attempts, payload in rows:
                if outcome == "claimed":
                    mine.append((key, token))
                    st["claimed"] += 1
                    st["takeover"] += attempts > 1
                elif outcome == "completed":  # done before (by us before a crash, or by another)
                    charges[key] = payload["charge"]
                    st["replayed"] += 1
                elif outcome == "in_progress":  # another holder's lease is live: retry after it ends
                    busy.append(key)
                else:
                    raise RuntimeError(f"payment {key}: {outcome} {payload}")
            done, last_beat, lost = [], time.monotonic(), set()
            for i, (key, token) in enumerate(mine):
                if key in lost:
                    continue
                if time.monotonic() - last_beat > LEASE / 3:  # a long batch: extend the leases left
                    lost |= self.heartbeat(mine[i:], st)
                    last_beat = time.monotonic()
                    if key in lost:  # taken over while we were slow: the new holder does it
                        continue
                body, dedup = self.provider.charge(key, amounts[key])
                st["provider_dedup"] += dedup
                chaos_point("after_http")
                done.append((key, token, body["charge"]))
            if done:
                try:
                    self.db.execute(
                        "SELECT idem_complete_batch(%s, %s::jsonb[], 'payment', %s::bigint[])",
                        ([k for k, _, _ in done], [Jsonb({"charge": c}) for _, _, c in done],
                         [t for _, t, _ in done]))
                    charges.update({k: c for k, _, c in done})
                except psycopg.errors.ObjectInUse:
                    # a lease was taken over (we were frozen past it): complete the others one by one;
                    # the lost keys go round again and replay the new holder's result
                    for key, token, charge in done:
                        try:
                            self.db.execute("SELECT idem_complete(%s, %s, 'payment', %s::bigint)",
                                            (key, Jsonb({"charge": charge}), token))
                            charges[key] = charge
                        except psycopg.errors.ObjectInUse:
                            st["fenced"] += 1
                            busy.append(key)
            busy += sorted(lost)
            todo = busy
            if busy:
                st["waited"] += len(busy)
                time.sleep(0.5)
        return charges, st

    def heartbeat(self, leases, st):
        """Extend the leases of [(key, token)]; return the keys whose lease was lost (55006)."""
        st["heartbeats"] += 1
        try:
            self.db.execute(
                "SELECT idem_heartbeat(k, make_interval(secs => %s), 'payment', t) "
                "FROM unnest(%s::text[], %s::bigint[]) AS u(k, t)",
                (LEASE, [k for k, _ in leases], [t for _, t in leases])).fetchall()
            return set()
        except psycopg.errors.ObjectInUse:  # one at least was taken over: find which, keep the others
            lost = set()
            for key, token in leases:
                try:
                    self.db.execute("SELECT idem_heartbeat(%s, make_interval(secs => %s), 'payment', %s)",
                                    (key, LEASE, token))
                except psycopg.errors.ObjectInUse:
                    lost.add(key)
            st["fenced"] += len(lost)
            return lost

    # ---- the ledger and the offset, inside the database (one transaction) -------------------
    def apply(self, msgs, charges):
        keys = [m["key"] for m in msgs]
        last = {}
        for m in msgs:
            last[m["partition"]] = max(last.get(m["partition"], -1), m["offset"])
        for attempt in range(10):
            try:
                with self.db.transaction():
                    outcome = self.db.execute(
                        "SELECT outcome FROM idem_claim_batch(%s, scope => 'ledger')", (keys,)).fetchall()
                    claimed = [m for m, (o,) in zip(msgs, outcome) if o == "claimed"]
                    if claimed:
                        with self.db.cursor() as cur:
                            cur.executemany(
                                "INSERT INTO e2e.ledger (msg_key, partition, kafka_offset, amount, charge,"
                                " consumer, generation) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                                [(m["key"], m["partition"], m["offset"], m["amount"], charges[m["key"]],
                                  CID, self.generation) for m in claimed])
                        self.db.execute("SELECT idem_complete_batch(%s, %s::jsonb[], 'ledger')",
                                        ([m["key"] for m in claimed],
                                         [Jsonb({"charge": charges[m["key"]]}) for m in claimed]))
                    for p, off in sorted(last.items()):
                        self.db.execute("SELECT idem_record_offset(%s, %s, %s, %s, %s)",
                                        (GROUP, TOPIC, p, off, self.generation))
                    chaos_point("mid_txn")
                return {"claimed": len(claimed),
                        "completed": sum(o == "completed" for (o,) in outcome),
                        "in_batch_repeat": sum(o == "in_progress" for (o,) in outcome)}, last
            except psycopg.errors.ObjectInUse as e:  # 55006: a newer generation owns a partition
                raise Fenced(str(e).splitlines()[0])
            except psycopg.Error as e:
                if e.sqlstate not in RETRY_SQLSTATES:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise RuntimeError("ledger transaction kept failing")

    # ---- the loop ---------------------------------------------------------------------------
    def run(self):
        event("start", gen_mode=GEN_MODE)
        while not STOP:
            records = self.consumer.consume(num_messages=BATCH, timeout=0.5)
            msgs = []
            for r in records:
                if r.error():
                    continue
                key = dict(r.headers() or [])["idempotency-key"].decode()
                msgs.append({"key": key, "partition": r.partition(), "offset": r.offset(),
                             "amount": json.loads(r.value())["amount"]})
            if not msgs:
                continue
            spans = {}
            for m in msgs:
                spans.setdefault(m["partition"], []).append(m["offset"])
            event("poll", gen=self.generation, offsets=spans)
            charges, pay_st = self.pay(msgs)
            event("paid", gen=self.generation, pay=pay_st)
            chaos_point("before_txn")
            try:
                ledger_st, last = self.apply(msgs, charges)
            except Fenced as e:
                event("fenced", gen=self.generation, error=e.args[0])
                self.consumer.close()  # a zombie: leave; the supervisor starts a fresh member
                sys.exit(3)
            event("applied", gen=self.generation, ledger=ledger_st)
            chaos_point("after_commit")
            try:  # the courtesy commit; the database holds the truth
                self.consumer.commit(offsets=[TopicPartition(TOPIC, p, o + 1) for p, o in last.items()],
                                     asynchronous=False)
            except KafkaException as e:
                event("broker_commit_failed", error=str(e))
        self.consumer.close()
        event("stop")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    Worker().run()

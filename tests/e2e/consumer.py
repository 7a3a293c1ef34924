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
import json
import os
import signal
import sys

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exactly_once import EventLog, Provider, apply_ledger, chaos_points, pay  # noqa: E402 - shared with tests/brokers

CID = sys.argv[1]
ENV = os.environ
RUN_DIR, TOPIC, GROUP = ENV["E2E_RUN_DIR"], ENV["E2E_TOPIC"], ENV["E2E_GROUP"]
LEASE = float(ENV.get("E2E_LEASE_S", "8"))
BATCH = int(ENV.get("E2E_POLL_MAX", "100"))
GEN_MODE = ENV.get("E2E_GENERATION", "group")  # group: Kafka's generation id; epoch: a DB sequence
STOP = False
event = EventLog(RUN_DIR, CID)
chaos_point = chaos_points(RUN_DIR, CID, event)


def on_sigterm(*_):
    global STOP
    STOP = True


class Fenced(Exception):
    pass


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
        return pay(self.db, self.provider, msgs, LEASE, chaos_point)

    # ---- the ledger and the offset, inside the database (one transaction) -------------------
    def apply(self, msgs, charges):
        last = {}
        for m in msgs:
            last[m["partition"]] = max(last.get(m["partition"], -1), m["offset"])

        def record_offsets(db):
            for p, off in sorted(last.items()):
                db.execute("SELECT idem_record_offset(%s, %s, %s, %s, %s)",
                           (GROUP, TOPIC, p, off, self.generation))

        try:
            st = apply_ledger(self.db, msgs, charges, CID, self.generation, also=record_offsets,
                              chaos_point=chaos_point)
        except psycopg.errors.ObjectInUse as e:  # 55006: a newer generation owns a partition
            raise Fenced(str(e).splitlines()[0])
        return st, last

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

#!/usr/bin/env python3
"""One consumer process of the end-to-end run: a Kafka consumer-group member that applies every payment
message exactly once, with both side effects, written with the client library idempotency_client
(clients/python) and its Kafka helper:

1. outside the database, a charge at the HTTP payment provider, in TWO-TRANSACTION mode, per key
   (exactly_once.pay_with_leases, shared with tests/brokers):
       with lease(db, key, scope="payment", ttl=8 s, heartbeat_conn=hb) as l:   -- claim committed, token
           if not l.replayed: POST /charges (Idempotency-Key: key)            -- heartbeats meanwhile
           l.result = {"charge": ...}                                          -- idem_complete with the token
   A key another holder leases (InProgress) is retried until that lease ends; a key already completed
   replays the stored charge; a lease taken over while we were frozen (LeaseLost, 55006) is given up and
   claimed again, to replay the new holder's result. A crash between the HTTP call and the completion
   makes the next holder call again, with the same key: the provider's deduplication, not the extension,
   makes that call harmless.
2. inside the database, the ledger rows and the offsets, in ONE transaction per poll:
       kafka.IdempotentConsumer.process(records, apply):
           idem_claim_batch(keys, scope => 'ledger'); apply() per claimed key (INSERT INTO e2e.ledger);
           idem_complete_batch; idem_record_offset(group, topic, p, last, generation) per partition; COMMIT
       then, best-effort, the broker commit.
   On assignment the helper seeks every partition to idem_offsets() and reads the group generation
   (kafka.group_generation: librdkafka's group metadata), which fences a zombie's offsets (Fenced).

Chaos hooks: the driver may write a point name into RUN_DIR/arm-<cid>; the consumer then kills itself
with SIGKILL when it reaches that point (in_assign, after_http, mid_txn, after_commit), or, for
freeze_after_http and freeze_before_txn, stops itself with SIGSTOP until the driver sends SIGCONT (a
zombie that wakes up after its session and its leases ended). in_assign is in the assignment callback,
after the helper positioned the partitions from the database; mid_txn in the ledger transaction, after a
ledger row was written; after_commit between the database's commit of a poll and the broker commit (the
helper's call of Consumer.commit, intercepted by ChaosConsumer). SIGTERM means leave the group cleanly.
Every event goes to RUN_DIR/c<cid>.<pid>.jsonl, one unbuffered line each, so nothing is lost to kill -9.

Usage: consumer.py CID   (the rest comes from the environment; see e2e.py)
"""
import collections
import json
import os
import signal
import sys

import psycopg
from confluent_kafka import Consumer, KafkaException

from idempotency_client import Fenced
from idempotency_client.kafka import IdempotentConsumer, group_generation, header_key

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exactly_once import EventLog, Provider, chaos_points, pay_with_leases  # noqa: E402 - shared with tests/brokers

CID = sys.argv[1]
ENV = os.environ
RUN_DIR, TOPIC, GROUP = ENV["E2E_RUN_DIR"], ENV["E2E_TOPIC"], ENV["E2E_GROUP"]
LEASE = float(ENV.get("E2E_LEASE_S", "8"))
BATCH = int(ENV.get("E2E_POLL_MAX", "100"))
GEN_MODE = ENV.get("E2E_GENERATION", "group")  # group: Kafka's generation id; epoch: a DB sequence
STOP = False
event = EventLog(RUN_DIR, CID)
chaos_point = chaos_points(RUN_DIR, CID, event)
key_of = header_key("idempotency-key", fallback_to_message_key=False)

LEDGER_INSERT = ("INSERT INTO e2e.ledger (msg_key, partition, kafka_offset, amount, charge, consumer, generation)"
                 " VALUES (%s, %s, %s, %s, %s, %s, %s)")


def on_sigterm(*_):
    global STOP
    STOP = True


class ChaosConsumer:
    """The confluent_kafka.Consumer as the helper sees it, with one chaos point: after_commit, in the
    broker commit that the helper calls once the database committed the poll. Everything else is the real
    consumer's (the rebalance callbacks get the real one)."""

    def __init__(self, consumer):
        self._consumer = consumer

    def commit(self, *args, **kwargs):
        chaos_point("after_commit")
        return self._consumer.commit(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._consumer, name)


class Worker:
    def __init__(self):
        dsn = dict(host=ENV["IDEM_SOCKDIR"], port=ENV["IDEM_PORT"], dbname=ENV["E2E_DB"], user="postgres",
                   autocommit=True)
        self.db = psycopg.connect(application_name=f"e2e-c{CID}", **dsn)
        # Under chaos a payment key can be taken over many times; the default (5) would make it terminal.
        self.db.execute("SET idempotency.max_attempts = 1000")
        # the payment leases' heartbeats: one connection for the process, not one per lease
        self.hb = psycopg.connect(application_name=f"e2e-c{CID}-heartbeats", **dsn)
        self.provider = Provider(int(ENV["E2E_PROVIDER_PORT"]))
        self.consumer = Consumer({
            "bootstrap.servers": ENV["E2E_BOOTSTRAP"], "group.id": GROUP,
            "client.id": f"e2e-c{CID}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": int(ENV.get("E2E_SESSION_MS", "6000")), "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": 60000, "partition.assignment.strategy": "range",
        })
        # group: Kafka's group generation id (the helper's default, group_generation); epoch: a number from
        # a database sequence drawn at each assignment, which grows at every rebalance as well
        generation = group_generation if GEN_MODE == "group" else self.next_epoch
        self.ic = IdempotentConsumer(ChaosConsumer(self.consumer), self.db, GROUP, scope="ledger", key=key_of,
                                     generation=generation)
        self.ic.subscribe([TOPIC], on_assign=self.on_assign, on_revoke=self.on_revoke)

    # ---- rebalance: the helper positions the partitions from idem_offsets and reads the generation ----
    def next_epoch(self, consumer):
        return self.db.execute("SELECT nextval('e2e.epoch')").fetchone()[0]

    def on_assign(self, consumer, partitions):
        """After the helper's own callback: the partitions carry the offsets it sought them to (the
        database's; none where the database has nothing yet: then the broker's committed offset or
        auto.offset.reset)."""
        try:
            broker = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=5)}
        except KafkaException:
            broker = {}
        event("assign", gen=self.ic.generation, parts=[tp.partition for tp in partitions],
              db={tp.partition: tp.offset for tp in partitions}, broker=broker)
        chaos_point("in_assign")

    def on_revoke(self, consumer, partitions):
        event("revoke", gen=self.ic.generation, parts=[tp.partition for tp in partitions])

    # ---- 1. the payment, outside the database (two-transaction mode: a lease per key) ------------
    def pay(self, msgs):
        """Charge every message once at the provider; return ({key: charge}, counters)."""
        return pay_with_leases(self.db, self.hb, self.provider, msgs, LEASE, event, chaos_point)

    # ---- 2. the ledger and the offsets, inside the database (one transaction: the helper) --------
    def apply(self, charges):
        def apply_one(conn, record):  # under the helper's savepoint, in the poll's transaction
            key = key_of(record)
            conn.execute(LEDGER_INSERT, (key, record.partition(), record.offset(),
                                         json.loads(record.value())["amount"], charges[key], CID,
                                         self.ic.generation))
            chaos_point("mid_txn")
            return {"charge": charges[key]}

        return apply_one

    # ---- the loop ---------------------------------------------------------------------------
    def run(self):
        event("start", gen_mode=GEN_MODE)
        while not STOP:
            poll_errors = self.ic.poll_errors
            records = self.ic.poll_batch(BATCH, timeout=0.5)
            if self.ic.poll_errors > poll_errors:
                event("poll_error", n=self.ic.poll_errors - poll_errors, error=str(self.ic.last_poll_error))
            if not records:
                continue
            msgs = [{"key": key_of(r), "partition": r.partition(), "offset": r.offset(),
                     "amount": json.loads(r.value())["amount"]} for r in records]
            spans = {}
            for m in msgs:
                spans.setdefault(m["partition"], []).append(m["offset"])
            event("poll", gen=self.ic.generation, offsets=spans)
            charges, pay_st = self.pay(msgs)
            event("paid", gen=self.ic.generation, pay=pay_st)
            chaos_point("before_txn")
            commit_errors = self.ic.commit_errors
            try:
                items = self.ic.process(records, self.apply(charges))
            except Fenced as e:  # 55006: a newer generation owns a partition; the helper sought back
                event("fenced", gen=self.ic.generation, error=str(e).splitlines()[0])
                self.consumer.close()  # a zombie: leave; the supervisor starts a fresh member
                sys.exit(3)
            n = collections.Counter(i.outcome for i in items)
            if n["failed"]:  # nothing here makes one; a run that sees one is broken
                raise RuntimeError(f"ledger items failed: {[i.error for i in items if i.outcome == 'failed'][:3]}")
            # a poll killed at after_commit has no "applied" event: its counters are not in the figures
            event("applied", gen=self.ic.generation,
                  ledger={"claimed": n["processed"], "completed": n["replayed"], "in_batch_repeat": n["duplicate"]})
            if self.ic.commit_errors > commit_errors:  # the helper's best-effort broker commit failed
                event("broker_commit_failed", error=str(self.ic.last_commit_error))
        self.consumer.close()
        event("stop")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    Worker().run()

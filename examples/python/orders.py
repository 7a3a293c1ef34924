#!/usr/bin/env python3
"""Python: the one-transaction pattern (psycopg 3 + confluent-kafka).

The classic "idempotency key" middleware of a Postgres-backed service, applied to a Kafka consumer: the
key's claim, the business write, the stored result and the consumer's offset all commit in ONE database
transaction. A duplicate (producer retry, redelivery after a crash, rebalance) finds the key completed and
gets the stored result back instead of a second order. The broker commit comes after, as a courtesy: on
(re)assignment the consumer seeks to the offsets stored in the database.

The decorator, the offset calls and the generation come from the package clients/python
(idempotency-client: `pip install ./clients/python[kafka]`, which examples/python/run does).

Run: examples/python/run  (produces its own input, consumes it twice, checks the orders table).
"""
import json
import os
import sys
import time

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from idempotency_client import idempotent, offsets, record_offset
from idempotency_client.kafka import group_generation

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:54376")
RUN = int(time.time())
TOPIC, GROUP = f"orders-{RUN}", f"order-service-{RUN}"  # fresh names: the example can run again


@idempotent("orders")
def place_order(conn, order):
    """The business write. Without the decorator, every duplicate would place a second order.

    Called as place_order(conn, key, order) -> (result, replayed): idem_claim the key; on `claimed` run this
    body and idem_complete the key with its result; on `completed` return the stored result instead."""
    (order_id,) = conn.execute(
        "INSERT INTO orders (customer, amount) VALUES (%(customer)s, %(amount)s) RETURNING id",
        order).fetchone()
    return {"order_id": order_id}


def consume(conn, stop_at, skip_last_broker_commit=False):
    """Consume until every partition is processed up to stop_at[p]; return (applied, replayed)."""
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": GROUP,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    state = {"generation": None, "assigned": False}

    def on_assign(c, partitions):
        # Seek from the database, not from the broker: the database commit is the truth.
        # the group generation (librdkafka's, read from its group metadata: see idempotency_client.kafka)
        state["generation"] = group_generation(c)
        stored = {p: n for (_t, p), n in offsets(conn, GROUP, TOPIC).items()}
        broker = {tp.partition: tp.offset for tp in c.committed(partitions, timeout=10)}
        for tp in partitions:
            tp.offset = stored.get(tp.partition, OFFSET_BEGINNING)
            print(f"  partition {tp.partition}: database says {stored.get(tp.partition, 'nothing')}, "
                  f"broker says {broker[tp.partition] if broker[tp.partition] >= 0 else 'nothing'} "
                  f"(generation {state['generation']})")
        c.assign(partitions)
        state["assigned"] = True

    consumer.subscribe([TOPIC], on_assign=on_assign)
    applied = replayed = 0
    done = {p: n for (_t, p), n in offsets(conn, GROUP, TOPIC).items()}
    while not state["assigned"] or any(done.get(p, 0) < end for p, end in stop_at.items()):
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        key = dict(msg.headers())["idempotency-key"].decode()
        with conn.transaction():  # ONE transaction: claim, order, stored result, offset
            result, was_dup = place_order(conn, key, json.loads(msg.value()))
            record_offset(conn, GROUP, TOPIC, msg.partition(), msg.offset(), state["generation"])
        replayed += was_dup
        applied += not was_dup
        done[msg.partition()] = msg.offset() + 1
        last = all(done.get(p, 0) >= end for p, end in stop_at.items())
        if not (last and skip_last_broker_commit):  # the courtesy commit, after the database's
            consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    return applied, replayed


def main():
    conn = psycopg.connect(host=os.environ["IDEM_SOCKDIR"], port=os.environ["IDEM_PORT"],
                           dbname="ex_python", user="postgres", autocommit=True)
    conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, customer text, amount int)")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result()

    # 40 orders; the producer "retries" every 4th one, so it is in the log twice.
    # one record per batch: tansu 0.6 cannot fetch from an offset inside a batch (see examples/README.md)
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "batch.num.messages": 1})
    ends = {0: 0, 1: 0}  # log end per partition, from the delivery reports

    def delivered(err, msg):
        assert err is None, err
        ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)

    for i in range(40):
        for _ in range(2 if i % 4 == 0 else 1):
            producer.produce(TOPIC, key=f"cust-{i % 7}", headers={"idempotency-key": f"order-{i}"},
                             value=json.dumps({"customer": f"cust-{i % 7}", "amount": 100 + i}),
                             on_delivery=delivered)
    producer.flush()

    print("first run (stops after its last database commit, before the broker commit: a crash there)")
    applied, replayed = consume(conn, ends, skip_last_broker_commit=True)
    print(f"  {applied} orders placed, {replayed} duplicates answered from the stored result")
    print("restart: the broker would redeliver the last message; the database offset skips it")
    applied2, replayed2 = consume(conn, ends)
    print(f"  {applied2} orders placed, {replayed2} duplicates")

    (orders,) = conn.execute("SELECT count(*) FROM orders").fetchone()
    ok = orders == 40 and applied == 40 and replayed == 10 and applied2 == replayed2 == 0
    print(f"python: {orders} orders for 40 messages in {sum(ends.values())} records: {'OK' if ok else 'WRONG'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Produces M payment messages over a topic's partitions, paced over a duration, with retry duplicates.

Each message: Kafka key "order-<i>" (so the default partitioner spreads them), header
`idempotency-key: pay-<run>-<i>`, value {"order": i, "amount": cents}. A fraction DUP_P of the messages
is sent a second time a little later, with the same key and payload: what an application-level producer
retry does after a lost acknowledgement. The duplicates therefore sit in the log at other offsets, often
in another poll, sometimes after a rebalance.

Writes OUT (a JSON file) when done: the list of (key, amount) produced, the count of records written and
the end of the log of each partition, from the delivery reports.
Usage: producer.py BOOTSTRAP TOPIC RUN M SECONDS DUP_P OUT
"""
import json
import random
import sys
import time

from confluent_kafka import Producer


def main():
    bootstrap, topic, run, m, seconds, dup_p, out = sys.argv[1:8]
    m, seconds, dup_p = int(m), float(seconds), float(dup_p)
    rnd = random.Random(run)
    # One record per batch: tansu 0.6.0 (memory storage) answers a fetch at an offset inside a
    # multi-record batch with the batches that start at or after it, skipping the rest of that batch, so a
    # consumer that seeks to a stored offset would miss records. See tests/e2e/README.md.
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 1,
                  "enable.idempotence": False, "message.timeout.ms": 120000})
    failures, ends = [], {}

    def on_delivery(err, msg):
        if err is not None:
            failures.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    messages, pending_dups, written = [], [], 0
    start = time.monotonic()
    for i in range(m):
        key, amount = f"pay-{run}-{i}", rnd.randint(100, 99999)
        messages.append((key, amount))
        record = dict(topic=topic, key=f"order-{i}", value=json.dumps({"order": i, "amount": amount}),
                      headers=[("idempotency-key", key.encode())], on_delivery=on_delivery)
        p.produce(**record)
        written += 1
        if rnd.random() < dup_p:  # the "retry": the same record again, 5-300 messages later
            pending_dups.append((i + rnd.randint(5, 300), record))
        for due in [d for d in pending_dups if d[0] <= i]:
            p.produce(**due[1])
            written += 1
            pending_dups.remove(due)
        p.poll(0)
        # pace: message i goes out at i/m of the duration
        ahead = start + seconds * (i + 1) / m - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    for _, record in pending_dups:
        p.produce(**record)
        written += 1
    left = p.flush(120)
    if left or failures:
        print(f"producer: {left} undelivered, {len(failures)} failed: {failures[:3]}", file=sys.stderr)
        sys.exit(1)
    with open(out, "w") as f:
        json.dump({"messages": messages, "records": written, "ends": ends}, f)
    print(f"producer: {m} messages, {written} records in {time.monotonic() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()

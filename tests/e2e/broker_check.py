#!/usr/bin/env python3
"""Reproduces the broker defect that forces one record per batch in this directory (see README.md).

Usage: broker_check.py BOOTSTRAP   e.g. tests/e2e/broker_check.py 127.0.0.1:54371 against a running tansu.
Produces 10 records in one batch, then 10 more, and fetches from offset 5. Kafka delivers 5..19; tansu
0.6.0 (memory storage) delivers 10..19. Also prints ListOffsets(latest), which should be 20.
Exit status 1 when the defect is there.
"""
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
topic = f"fetch-check-{int(time.time())}"
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
for batch in range(2):
    for i in range(10):
        producer.produce(topic, value=f"{batch * 10 + i}".encode())
    producer.flush()
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False})
latest = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
consumer.assign([TopicPartition(topic, 0, 5)])
got, deadline = [], time.monotonic() + 5
while time.monotonic() < deadline and len(got) < 15:
    m = consumer.poll(0.2)
    if m is not None and not m.error():
        got.append(m.offset())
consumer.close()
ok = got == list(range(5, 20)) and latest == 20
print(f"fetch from offset 5 delivered {got[:3]}...{got[-1:]} ({len(got)} records), "
      f"ListOffsets(latest) = {latest}: {'OK' if ok else 'DEFECT (expected 5..19 and 20)'}")
sys.exit(0 if ok else 1)

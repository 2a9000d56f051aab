"""DeleteRecords with confluent-kafka's AdminClient (librdkafka underneath), printing
each step as a JSON line. Used by tests/it/python_clients.rs.

usage: confluent_delete_records.py BOOTSTRAP TOPIC
"""
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

bootstrap, topic = sys.argv[1], sys.argv[2]
admin = AdminClient({"bootstrap.servers": bootstrap})
out = lambda **kv: print(json.dumps(kv), flush=True)


def error_name(f):
    try:
        return f.result(timeout=15)
    except KafkaException as e:
        return e.args[0].name()


producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
for i in range(100):
    producer.produce(topic, value=b"v%d" % i, partition=0)
    if i % 10 == 9:
        producer.flush(15)  # ten batches
producer.flush(15)

# DeleteRecords inside a batch: the log starts there at once.
tp = TopicPartition(topic, 0, 45)
deleted = admin.delete_records([tp])[tp].result(timeout=15)
out(low_watermark=deleted.low_watermark)
earliest = TopicPartition(topic, 0)
found = admin.list_offsets({earliest: OffsetSpec.earliest()})[earliest].result(timeout=15)
out(earliest=found.offset)
past = TopicPartition(topic, 0, 1000)
out(past_the_end=error_name(admin.delete_records([past])[past]))

# A consumer from the beginning starts at the new log start.
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cd-reader",
              "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, -2)])
m = None
deadline = time.time() + 20
while m is None and time.time() < deadline:
    m = c.poll(1)
out(first=[m.offset(), m.value().decode()])
c.close()

"""Reads one partition with kafka-python from offset FROM until its position reaches END, and prints
every record below END exactly as kafka-python delivered it, as JSON lines: {"offset", "key", "value",
"headers": [[name, value]], "timestamp", "timestamp_type"}, bytes as hex (null for null); then
{"position": ..}. Used by tests/it/read_replicas.rs.

usage: read_partition.py BOOTSTRAP TOPIC PARTITION FROM END TIMEOUT_S
"""
import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
partition, start, end, timeout = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])


def hex_or_none(b):
    return None if b is None else b.hex()


consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest", fetch_max_wait_ms=100,
                         request_timeout_ms=10000)
tp = TopicPartition(topic, partition)
consumer.assign([tp])
consumer.seek(tp, start)
deadline = time.time() + timeout
while consumer.position(tp) < end and time.time() < deadline:
    for batch in consumer.poll(timeout_ms=200).values():
        for m in batch:
            if m.offset >= end:
                break
            print(json.dumps({"offset": m.offset,
                              "key": hex_or_none(m.key),
                              "value": hex_or_none(m.value),
                              "headers": [[k, hex_or_none(v)] for k, v in m.headers],
                              "timestamp": m.timestamp,
                              "timestamp_type": m.timestamp_type}), flush=True)
print(json.dumps({"position": consumer.position(tp)}), flush=True)
consumer.close()

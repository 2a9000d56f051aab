"""Consumes one partition of a topic from the beginning with kafka-python and prints what it got as
JSON lines: {"offset": .., "key": .., "value": ..}. Used by tests/it/python_clients.rs.

usage: consume.py BOOTSTRAP TOPIC PARTITION COUNT TIMEOUT_S
"""
import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition

bootstrap, topic, partition, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         consumer_timeout_ms=500, request_timeout_ms=10000)
tp = TopicPartition(topic, partition)
consumer.assign([tp])
consumer.seek_to_beginning(tp)
got = 0
deadline = time.time() + timeout
while got < count and time.time() < deadline:
    for batch in consumer.poll(timeout_ms=200).values():
        for m in batch:
            print(json.dumps({"offset": m.offset,
                              "key": None if m.key is None else m.key.decode(),
                              "value": m.value.decode()}), flush=True)
            got += 1
print(json.dumps({"position": consumer.position(tp)}), flush=True)
consumer.close()

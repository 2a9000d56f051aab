"""kafka-python (which keeps a fetch session per broker, KIP-227) reads every partition of a topic
while a second, larger consumer takes the brokers' only session slots, then goes away. Prints one
JSON line: records read, duplicates and missing ones, how often the first consumer's session was
not found (evicted) and how many sessions it started after that. Used by tests/it/python_clients.rs.

usage: fetch_sessions.py BOOTSTRAP TOPIC PARTITIONS EXTRA_TOPIC EXTRA_PARTITIONS IDLE_S
"""
import json
import logging
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

bootstrap, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
extra, extra_partitions, idle = sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
PER_ROUND = 2  # records per partition per round

# Counts the fetcher's session messages per consumer (whichever is polling).
polling = ["a"]
counts = {"a": {"not_found": 0, "created": 0, "created_after_not_found": 0}}
counts["b"] = dict(counts["a"])


class Counter(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        c = counts[polling[0]]
        if "FetchSessionIdNotFound" in msg:
            c["not_found"] += 1
        elif "created a new incremental fetch session" in msg:
            c["created"] += 1
            if c["not_found"]:
                c["created_after_not_found"] += 1


fetch_log = logging.getLogger("kafka.consumer.fetcher")
fetch_log.setLevel(logging.DEBUG)
fetch_log.addHandler(Counter())
fetch_log.propagate = False

producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)


def produce(round_):
    for p in range(partitions):
        for i in range(PER_ROUND):
            producer.send(topic, value=f"{round_}-{p}-{i}".encode(), partition=p)
    producer.flush(30)


def consumer(tps):
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      request_timeout_ms=20000)
    c.assign(tps)
    c.seek_to_beginning(*tps)
    return c


seen = {}
duplicates = 0


def poll(c, who, ms=200):
    global duplicates
    polling[0] = who
    got = c.poll(timeout_ms=ms, max_records=100000)
    if who != "a":
        return
    for batch in got.values():
        for m in batch:
            key = (m.partition, m.offset)
            if key in seen:
                duplicates += 1
            seen[key] = m.value.decode()


def read_all(a, want, deadline_s, others=()):
    deadline = time.time() + deadline_s
    while len(seen) < want and time.time() < deadline:
        poll(a, "a")
        for b in others:
            poll(b, "b", 50)


mine = [TopicPartition(topic, p) for p in range(partitions)]
a = consumer(mine)
produce(0)
read_all(a, partitions * PER_ROUND, 60)
for _ in range(10):  # idle at the tail: incremental fetches with nothing new
    poll(a, "a")

# A larger consumer: its sessions take the only slots (evicting the first consumer's).
b = consumer(mine + [TopicPartition(extra, p) for p in range(extra_partitions)])
for _ in range(10):
    poll(b, "b")
produce(1)
read_all(a, 2 * partitions * PER_ROUND, 60, others=[b])

# It goes away; once its sessions are stale, the first consumer gets sessions again.
b.close()
time.sleep(idle)
produce(2)
read_all(a, 3 * partitions * PER_ROUND, 60)
for _ in range(10):
    poll(a, "a")
a.close()
producer.close()

want = {(p, r * PER_ROUND + i) for r in range(3) for p in range(partitions) for i in range(PER_ROUND)}
values = set(seen.values())
print(json.dumps({
    "records": len(seen),
    "distinct_values": len(values),
    "duplicates": duplicates,
    "missing": len(want - set(seen)),
    "a": counts["a"],
    "b": counts["b"],
}), flush=True)

"""What the consumer group protocol (KIP-848, group.protocol=consumer) offers besides sharing
partitions, with confluent-kafka: a regular expression subscription that picks up a topic created
later, a static member that comes back to the same partitions, a classic and a consumer group side
by side, and a classic group without members taken over by the consumer protocol (from its
committed offsets). Prints one JSON line per step. Used by tests/it/groups_kip848.rs.

usage: kip848_features.py BOOTSTRAP
"""
import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
admin = AdminClient({"bootstrap.servers": bootstrap})
out = lambda **kv: print(json.dumps(kv), flush=True)
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})


def create(*topics):
    fs = admin.create_topics([NewTopic(t, n, 1) for t, n in topics])
    for f in fs.values():
        f.result(timeout=15)


def produce(topic, n, partition=None):
    for i in range(n):
        kw = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=b"%s-%d" % (topic.encode(), i), **kw)
    producer.flush(15)


def consumer(group, protocol="consumer", **extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "classic":
        conf["session.timeout.ms"] = 6000
    conf.update(extra)
    return Consumer(conf)


def read(c, want, seconds=30):
    got = []
    deadline = time.time() + seconds
    while len(got) < want and time.time() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m)
    return got


def assignment(c, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        c.poll(0.2)
        a = c.assignment()
        if a:
            return sorted((tp.topic, tp.partition) for tp in a)
    return []


# A regular expression: a topic created while the member runs is assigned to it.
create(("rx-a", 2))
produce("rx-a", 4)
c = consumer("g-rx")
c.subscribe(["^rx-.*"])
first = read(c, 4)
create(("rx-b", 2))
produce("rx-b", 3)
later = read(c, 3, seconds=60)
out(regex=[len(first), sorted({m.topic() for m in later})])
c.close()

# Static members: one leaves and comes back (a new member, the same instance) to its partitions.
create(("st", 4))
s1 = consumer("g-static", **{"group.instance.id": "s1"})
s2 = consumer("g-static", **{"group.instance.id": "s2"})
s1.subscribe(["st"])
s2.subscribe(["st"])
deadline = time.time() + 30
while time.time() < deadline:
    s1.poll(0.1)
    s2.poll(0.1)
    if len(s1.assignment()) + len(s2.assignment()) == 4 and s1.assignment() and s2.assignment():
        break
before = sorted(tp.partition for tp in s1.assignment())
s1.close()
s1 = consumer("g-static", **{"group.instance.id": "s1"})
s1.subscribe(["st"])
after = [p for _, p in assignment(s1)]
out(static=[before == after, len(before)])
s1.close()
s2.close()

# A classic group and a consumer group read the same topic side by side.
create(("both", 3))
produce("both", 30)
classic = consumer("g-classic", protocol="classic")
modern = consumer("g-modern")
classic.subscribe(["both"])
modern.subscribe(["both"])
got = {"classic": 0, "consumer": 0}
deadline = time.time() + 60
while (got["classic"] < 30 or got["consumer"] < 30) and time.time() < deadline:
    for name, c in (("classic", classic), ("consumer", modern)):
        m = c.poll(0.1)
        if m is not None and not m.error():
            got[name] += 1
listed = admin.list_consumer_groups().result(timeout=15)
types = {g.group_id: str(getattr(g, "type", None)).split(".")[-1] for g in listed.valid
         if g.group_id in ("g-classic", "g-modern")}
out(side_by_side=[got["classic"], got["consumer"]], types=dict(sorted(types.items())))
classic.close()
modern.close()

# A classic group without members moves to the consumer protocol, from its committed offsets.
create(("conv", 1))
produce("conv", 10, partition=0)
old = consumer("g-conv", protocol="classic")
old.subscribe(["conv"])
read(old, 6)
old.commit(offsets=[TopicPartition("conv", 0, 6)], asynchronous=False)
old.close()
new = consumer("g-conv")
new.subscribe(["conv"])
rest = read(new, 4)
out(converted=[m.offset() for m in rest])
new.close()

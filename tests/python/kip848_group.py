"""A consumer group of the consumer group protocol (KIP-848, group.protocol=consumer) with
confluent-kafka (librdkafka underneath): members in processes of their own join, leave and die
while the group reads a topic, each committing every record before it reports it. Prints one
JSON line with what was read. Used by tests/it/groups_kip848.rs.

usage: kip848_group.py BOOTSTRAP TOPIC RECORDS GROUP
       kip848_group.py worker BOOTSTRAP TOPIC GROUP NAME MODE   (MODE: run, exit:N, leave:N)
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer


def worker(bootstrap, topic, group, name, mode):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    c.subscribe([topic])
    kind, _, limit = mode.partition(":")
    count = 0
    while not stop:
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        committed = False
        for _ in range(50):
            try:
                c.commit(message=m, asynchronous=False)
                committed = True
                break
            except KafkaException:
                time.sleep(0.1)
        if not committed:
            continue
        print(json.dumps({"w": name, "p": m.partition(), "o": m.offset(),
                          "v": m.value().decode()}), flush=True)
        count += 1
        if kind == "exit" and count >= int(limit):
            os._exit(0)  # no leave: the broker finds out by the session timeout
        if kind == "leave" and count >= int(limit):
            break
    c.close()


def main(bootstrap, topic, records, group):
    records = int(records)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(records):
        p.produce(topic, value=b"r%d" % i, key=b"k%d" % i)
    p.flush(30)
    seen = []
    lock = threading.Lock()
    procs = {}

    def start(name, mode):
        proc = subprocess.Popen([sys.executable, __file__, "worker", bootstrap, topic, group, name,
                                 mode], stdout=subprocess.PIPE, text=True)
        procs[name] = proc

        def read():
            for line in proc.stdout:
                with lock:
                    seen.append(json.loads(line))
        threading.Thread(target=read, daemon=True).start()

    start("w0", "run")
    start("w1", "leave:%d" % (records // 6))
    start("w2", "run")
    start("w3", "exit:%d" % (records // 8))
    joined = False
    deadline = time.time() + 120
    while time.time() < deadline:
        with lock:
            values = {r["v"] for r in seen}
        if not joined and len(values) >= records // 3:
            start("w4", "run")
            joined = True
        if len(values) >= records:
            break
        time.sleep(0.2)
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        proc.wait(timeout=30)
    values = [r["v"] for r in seen]
    by_worker = {}
    for r in seen:
        by_worker[r["w"]] = by_worker.get(r["w"], 0) + 1
    print(json.dumps({"records": len(values), "distinct": len(set(values)),
                      "missing": records - len(set(values) & {"r%d" % i for i in range(records)}),
                      "by_worker": by_worker}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(*sys.argv[2:7])
    else:
        main(*sys.argv[1:5])

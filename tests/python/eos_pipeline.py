"""An exactly-once consume-transform-produce loop (confluent-kafka): reads INPUT with
read_committed, writes "out-<value>" to OUTPUT and commits its input offsets in the same
transaction, PER records at a time. Runs until killed; survives the broker's restarts (a failed
transaction is aborted and the input rewound to the committed offsets) and exits 3 on a fatal
error (a newer instance fenced it).

usage: eos_pipeline.py BOOTSTRAP INPUT OUTPUT PARTITIONS
"""

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

bootstrap, inp, out, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
PER = 50

consumer = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": "eos-pipeline",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
)
producer = Producer(
    {
        "bootstrap.servers": bootstrap,
        "transactional.id": "eos-pipeline",
        "transaction.timeout.ms": 10000,
        "linger.ms": 5,
    }
)


def call(f, *args):
    """f(*args), retried while the error is retriable (the broker restarting)."""
    while True:
        try:
            return f(*args)
        except KafkaException as e:
            if e.args[0].retriable():
                time.sleep(0.2)
                continue
            raise


def rewind():
    """Reads the input again from the committed offsets (after an aborted transaction)."""
    parts = [TopicPartition(inp, p) for p in range(partitions)]
    while True:
        try:
            committed = consumer.committed(parts, timeout=10)
            break
        except KafkaException:
            time.sleep(0.2)
    consumer.assign(
        [TopicPartition(inp, tp.partition, tp.offset if tp.offset >= 0 else -2) for tp in committed]
    )


call(producer.init_transactions, 60)
rewind()
print("ready", flush=True)
while True:
    call(producer.begin_transaction)
    n = 0
    until = time.time() + 0.5
    while n < PER and time.time() < until:
        m = consumer.poll(0.1)
        if m is None or m.error():
            continue
        while True:
            try:
                producer.produce(out, key=m.key(), value=b"out-" + m.value())
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        time.sleep(0.002)
    try:
        positions = consumer.position(consumer.assignment())
        call(
            producer.send_offsets_to_transaction,
            positions,
            consumer.consumer_group_metadata(),
            30,
        )
        call(producer.commit_transaction, 30)
    except KafkaException as e:
        err = e.args[0]
        if err.fatal():
            print("fatal", err, flush=True)
            sys.exit(3)
        print("aborting", err, flush=True)
        call(producer.abort_transaction, 30)
        rewind()

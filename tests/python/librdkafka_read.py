"""Reads COUNT records of a topic, every partition from the beginning, with librdkafka
(confluent-kafka's wheel bundles it, with SSL, SCRAM and zstd), and prints one JSON line:
{"ok": true, "records": [{"partition", "offset", "key", "value", "headers": [[k, v], ...]}]}
or {"ok": false, "error": NAME, "message": TEXT} (NAME as librdkafka names it, e.g.
TOPIC_AUTHORIZATION_FAILED or _AUTHENTICATION). Used by tests/it/tools_io.rs and tests/it/tools_security.rs.

usage: librdkafka_read.py BOOTSTRAP TOPIC COUNT CONFIG_JSON
CONFIG_JSON: extra librdkafka settings (security.protocol, sasl.*, ssl.ca.location), or {}.
"""
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

bootstrap, topic, count, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
errors = []


def done(**kw):
    print(json.dumps(kw), flush=True)
    sys.exit(0)


def text(b):
    return None if b is None else b.decode("utf-8", "replace")


def auth_failed():
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if auth:
        done(ok=False, error="_AUTHENTICATION", message=auth[0].str())


conf = {"bootstrap.servers": bootstrap, "group.id": "librdkafka-read", "enable.auto.commit": False,
        "error_cb": errors.append, "socket.timeout.ms": 10000}
conf.update(extra)
c = Consumer(conf)
try:
    md = c.list_topics(topic, timeout=10)
except KafkaException as e:
    # An authentication failure reaches error_cb only when callbacks are served.
    for _ in range(10):
        c.poll(0.3)
        auth_failed()
    done(ok=False, error=e.args[0].name(), message=e.args[0].str())
auth_failed()
t = md.topics.get(topic)
if t is None or t.error is not None:
    done(ok=False, error=t.error.name() if t is not None else "UNKNOWN_TOPIC_OR_PART", message=str(t and t.error))
c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(t.partitions)])
records, deadline = [], time.time() + 20
while len(records) < count and time.time() < deadline:
    m = c.poll(0.5)
    auth_failed()
    if m is None:
        continue
    if m.error():
        if m.error().code() == KafkaError._PARTITION_EOF:
            continue
        done(ok=False, error=m.error().name(), message=m.error().str())
    records.append({"partition": m.partition(), "offset": m.offset(), "key": text(m.key()),
                    "value": text(m.value()),
                    "headers": [[k, text(v)] for k, v in (m.headers() or [])]})
c.close()
done(ok=True, records=records)

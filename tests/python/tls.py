"""Produces and consumes over TLS (optionally with a client certificate, optionally with SASL on top)
with an unmodified Python client, printing one JSON line: {"ok": true, "consumed": N, "same": B} or
{"ok": false, "error": NAME, "message": TEXT}. It produces 10 records to partition 0, then reads
from the first of them: N records came back, and B tells whether they are the 10 sent, in order.
Used by tests/it/tls.rs.

usage: tls.py CLIENT BOOTSTRAP TOPIC OPTIONS
CLIENT: kafka-python or confluent-kafka (librdkafka, with the OpenSSL its wheel bundles).
OPTIONS: JSON {"ca": PATH, "cert": PATH?, "key": PATH?, "sasl": [MECHANISM, USER, PASSWORD]?}
"""
import json
import sys
import time

client, bootstrap, topic, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sasl = options.get("sasl")
N = 10
SENT = [(b"k%d" % i, b"v%d" % i) for i in range(N)]


def done(**kw):
    print(json.dumps(kw), flush=True)
    sys.exit(0)


if client == "kafka-python":
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    conf = dict(security_protocol="SASL_SSL" if sasl else "SSL", ssl_cafile=options["ca"],
                ssl_certfile=options.get("cert"), ssl_keyfile=options.get("key"))
    if sasl:
        conf.update(sasl_mechanism=sasl[0], sasl_plain_username=sasl[1], sasl_plain_password=sasl[2])
    try:
        p = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, max_block_ms=5000,
                          retries=0, **conf)
        offsets = [p.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0).get(timeout=10).offset
                   for i in range(N)]
        p.close()
        c = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=4000, **conf)
        c.assign([TopicPartition(topic, 0)])
        c.seek(TopicPartition(topic, 0), offsets[0])
        got = [(m.key, m.value) for m in c]
        c.close()
        done(ok=True, consumed=len(got), same=got == SENT)
    except KafkaError as e:
        done(ok=False, error=type(e).__name__, message=str(e))
else:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    errors = []
    conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL" if sasl else "SSL",
            "ssl.ca.location": options["ca"], "error_cb": lambda e: errors.append(e)}
    if options.get("cert"):
        conf.update({"ssl.certificate.location": options["cert"], "ssl.key.location": options["key"]})
    if sasl:
        conf.update({"sasl.mechanism": sasl[0], "sasl.username": sasl[1], "sasl.password": sasl[2]})
    p = Producer(dict(conf, **{"message.timeout.ms": 8000}))
    delivered = []
    for i in range(N):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0,
                  on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    p.flush(12)
    if len(delivered) != N or any(err for err, _ in delivered):
        why = [e.str() for e in errors[:1]] or [str(e) for e, _ in delivered if e][:1]
        done(ok=False, error="delivery", message=str(why))
    c = Consumer(dict(conf, **{"group.id": "tls-test", "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, min(o for _, o in delivered))])
    got, deadline = [], time.time() + 12
    while len(got) < N and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append((m.key(), m.value()))
    c.close()
    done(ok=True, consumed=len(got), same=got == SENT)

"""Produces and consumes over SASL with an unmodified Python client and prints one JSON line:
{"ok": true, "consumed": N} or {"ok": false, "error": NAME, "message": TEXT}. Used by tests/it/sasl.rs.

usage: sasl.py CLIENT BOOTSTRAP MECHANISM USER PASSWORD TOPIC
CLIENT is kafka-python or confluent-kafka (librdkafka, as its wheel bundles it).
"""
import json
import sys
import time

client, bootstrap, mechanism, user, password, topic = sys.argv[1:7]
N = 20


def done(**kw):
    print(json.dumps(kw), flush=True)
    sys.exit(0)


if client == "kafka-python":
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    security = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                    sasl_plain_username=user, sasl_plain_password=password)
    try:
        p = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000,
                          max_block_ms=10000, **security)
        for i in range(N):
            p.send(topic, key=b"k%d" % i, value=b"v%d" % i).get(timeout=10)
        p.close()
        c = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                          consumer_timeout_ms=5000, **security)
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        got = [m for m in c]
        c.close()
        done(ok=True, consumed=len(got))
    except KafkaError as e:
        done(ok=False, error=type(e).__name__, message=str(e))
else:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    errors = []
    conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            "error_cb": lambda e: errors.append(e)}
    p = Producer(dict(conf, **{"message.timeout.ms": 10000}))
    delivered = []
    for i in range(N):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i,
                  on_delivery=lambda err, msg: delivered.append(err))
    p.flush(15)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if auth:
        done(ok=False, error="_AUTHENTICATION", message=auth[0].str())
    if len(delivered) != N or any(delivered):
        done(ok=False, error="delivery", message=str([str(e) for e in delivered if e][:1] or errors[:1]))
    c = Consumer(dict(conf, **{"group.id": "sasl-test", "auto.offset.reset": "earliest",
                               "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 0)])
    got, deadline = 0, time.time() + 15
    while got < N and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    c.close()
    done(ok=True, consumed=got)

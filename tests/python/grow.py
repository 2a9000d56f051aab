"""Grows a topic with kafka-python's admin client and prints what happened as JSON lines: the
result of asking for fewer partitions (an error), of a validate-only request, of the real one, and
the partitions kafka-python then sees. Used by tests/it/python_clients.rs.

usage: grow.py BOOTSTRAP TOPIC COUNT
"""
import json
import sys

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewPartitions
from kafka.errors import KafkaError

bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)


def ask(total, validate_only=False):
    try:
        r = admin.create_partitions({topic: NewPartitions(total_count=total)},
                                    validate_only=validate_only)
        errors = [list(t)[1] for t in r.topic_errors] if hasattr(r, "topic_errors") else []
        return {"ok": True, "errors": errors}
    except KafkaError as e:
        return {"ok": False, "error": type(e).__name__}


print(json.dumps({"fewer": ask(1)}), flush=True)
print(json.dumps({"validate_only": ask(count + 5, validate_only=True)}), flush=True)
print(json.dumps({"grow": ask(count)}), flush=True)
consumer = KafkaConsumer(bootstrap_servers=bootstrap)
print(json.dumps({"partitions": sorted(consumer.partitions_for_topic(topic))}), flush=True)
consumer.close()
admin.close()

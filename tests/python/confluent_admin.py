"""Grows a topic and reads and changes its configs with confluent-kafka's AdminClient (librdkafka
underneath), printing each step as a JSON line. Used by tests/it/python_clients.rs.

usage: confluent_admin.py BOOTSTRAP TOPIC
"""
import json
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions)

bootstrap, topic = sys.argv[1], sys.argv[2]
admin = AdminClient({"bootstrap.servers": bootstrap})
out = lambda **kv: print(json.dumps(kv), flush=True)


def outcome(futures):
    try:
        for f in futures.values():
            f.result(timeout=15)
        return "ok"
    except KafkaException as e:
        return e.args[0].name()


def configs():
    res = ConfigResource("topic", topic)
    entries = admin.describe_configs([res])[res].result(timeout=15)
    return {k: [v.value, v.source] for k, v in entries.items()}


out(grow=outcome(admin.create_partitions([NewPartitions(topic, 3)])))
out(shrink=outcome(admin.create_partitions([NewPartitions(topic, 2)])))
out(partitions=len(admin.list_topics(topic, timeout=15).topics[topic].partitions))
out(retention_at_start=configs()["retention.ms"])


def alter(key, value):
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    return outcome(admin.incremental_alter_configs([res]))


out(set=alter("retention.ms", "3600000"))
out(bad=alter("retention.ms", "soon"))
out(retention_after=configs()["retention.ms"])

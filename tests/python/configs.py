"""Reads and changes a topic's configs with kafka-python's admin client (IncrementalAlterConfigs,
AlterConfigs, DescribeConfigs) and prints each step as a JSON line. Used by tests/it/python_clients.rs.

usage: configs.py BOOTSTRAP TOPIC
"""
import json
import sys

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError

bootstrap, topic = sys.argv[1], sys.argv[2]
admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)


def topic_res(configs=None):
    return ConfigResource(ConfigResourceType.TOPIC, topic, configs)


def describe(config_filter):
    got = admin.describe_configs([topic_res()], config_filter=config_filter)
    return {k: v.get("value") for k, v in got["topic"][topic].items()}


def alter(configs, **kw):
    try:
        r = admin.alter_configs([topic_res(configs)], **kw)
        return {"ok": True, "result": str(r)}
    except KafkaError as e:
        return {"ok": False, "error": type(e).__name__}
    except ValueError as e:
        return {"ok": False, "error": "ValueError: %s" % e}


out = lambda **kv: print(json.dumps(kv), flush=True)
out(modified_at_start=describe("modified"))
out(all_at_start=describe("all"))
out(set=alter({"retention.ms": "3600000", "segment.bytes": "1048576"}, incremental=True))
out(modified_after_set=describe("modified"))
out(bad_value=alter({"retention.ms": "soon"}, incremental=True))
out(unknown_key=alter({"min.insync.replicas": "2"}, incremental=True, raise_on_unknown=False))
out(validate_only=alter({"retention.ms": "1"}, incremental=True, validate_only=True))
out(modified_after_refusals=describe("modified"))
out(reset=str(admin.reset_configs([topic_res({"segment.bytes": None})], incremental=True)))
out(modified_after_reset=describe("modified"))
out(legacy=alter({"max.message.bytes": "65536"}, incremental=False))
out(modified_after_legacy=describe("modified"))
broker = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
out(broker={k: v.get("read_only") for k, v in broker["broker"]["0"].items()})
admin.close()

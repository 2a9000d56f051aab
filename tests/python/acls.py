"""One ACL-related action with kafka-python over SASL/SCRAM-SHA-256, printing one JSON line. Used by
tests/it/acls.rs.

usage: acls.py BOOTSTRAP USER PASSWORD ACTION [ARGS...]
  produce TOPIC               -> {"ok": true} or {"ok": false, "error": NAME}
  consume TOPIC GROUP         -> {"ok": true, "consumed": N} or {"ok": false, "error": NAME}
  topics                      -> {"topics": [...]}
  create TOPIC...             -> {"errors": {topic: NAME or null}}
  add_acls JSON               -> {"ok": true} or {"ok": false, "error": ...}
  describe_acls               -> {"acls": [[type, name, pattern, principal, operation, permission], ...]}
  delete_acls JSON            -> {"deleted": N}
JSON: a list of [type, name, pattern, principal, operation, permission] (kafka-python's enum names).
"""
import json
import sys

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                         KafkaAdminClient, NewTopic, ResourcePattern, ResourcePatternFilter,
                         ResourceType)
from kafka.errors import KafkaError

bootstrap, user, password, action, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
security = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username=user, sasl_plain_password=password)


def out(**kw):
    print(json.dumps(kw), flush=True)


def acl(spec, cls=ACL, pattern_cls=ResourcePattern):
    t, name, pattern, principal, op, perm = spec
    return cls(principal=principal, host="*", operation=ACLOperation[op],
               permission_type=ACLPermissionType[perm],
               resource_pattern=pattern_cls(ResourceType[t], name, ACLResourcePatternType[pattern]))


def admin():
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000, **security)


try:
    if action == "produce":
        p = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, max_block_ms=5000,
                          retries=0, **security)
        p.send(args[0], key=b"k", value=b"v").get(timeout=10)
        p.close()
        out(ok=True)
    elif action == "consume":
        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=args[1], auto_offset_reset="earliest",
                          enable_auto_commit=False, consumer_timeout_ms=4000, **security)
        c.assign([TopicPartition(args[0], 0)])
        got = 0
        for batch in [c.poll(timeout_ms=3000) for _ in range(3)]:
            got += sum(len(v) for v in batch.values())
        c.commit()
        c.close()
        out(ok=True, consumed=got)
    elif action == "topics":
        out(topics=sorted(admin().list_topics()))
    elif action == "create":
        r = admin().create_topics({t: {"num_partitions": 1, "replication_factor": 1} for t in args},
                                  raise_errors=False)
        topics = r.get("topics", r.get("topic_errors", []))
        out(errors={t["name"]: (t["error_code"] or None) for t in topics})
    elif action == "add_acls":
        r = admin().create_acls([acl(s) for s in json.loads(args[0])])
        out(ok=not r["failed"], failed=[str(f) for f in r["failed"]])
    elif action == "describe_acls":
        flt = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                        permission_type=ACLPermissionType.ANY,
                        resource_pattern=ResourcePatternFilter(ResourceType.ANY, None,
                                                               ACLResourcePatternType.ANY))
        acls, err = admin().describe_acls(flt)
        out(acls=sorted([a.resource_pattern.resource_type.name, a.resource_pattern.resource_name,
                         a.resource_pattern.pattern_type.name, a.principal, a.operation.name,
                         a.permission_type.name] for a in acls))
    elif action == "delete_acls":
        r = admin().delete_acls([acl(s, ACLFilter, ResourcePatternFilter)
                                 for s in json.loads(args[0])])
        out(deleted=sum(len(matches) for _, matches, _ in r))
    else:
        raise SystemExit("unknown action " + action)
except KafkaError as e:
    out(ok=False, error=type(e).__name__, message=str(e))

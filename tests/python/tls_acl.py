"""Over mTLS with kafka-python's admin client: creates TOPIC and "public", and allows PRINCIPAL to
read and write TOPIC. Prints {"ok": true} or the error. Used by tests/it/tls.rs.

usage: tls_acl.py BOOTSTRAP OPTIONS PRINCIPAL TOPIC   (OPTIONS: JSON {"ca", "cert", "key"})
"""
import json
import sys

from kafka.admin import (ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                         KafkaAdminClient, ResourcePattern, ResourceType)
from kafka.errors import KafkaError

bootstrap, options, principal, topic = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, security_protocol="SSL",
                             ssl_cafile=options["ca"], ssl_certfile=options["cert"],
                             ssl_keyfile=options["key"], request_timeout_ms=10000)
    admin.create_topics({t: {"num_partitions": 1, "replication_factor": 1} for t in [topic, "public"]})
    pattern = ResourcePattern(ResourceType.TOPIC, topic, ACLResourcePatternType.LITERAL)
    r = admin.create_acls([ACL(principal=principal, host="*", operation=op,
                               permission_type=ACLPermissionType.ALLOW, resource_pattern=pattern)
                           for op in (ACLOperation.READ, ACLOperation.WRITE)])
    print(json.dumps({"ok": not r["failed"], "failed": [str(f) for f in r["failed"]]}))
except KafkaError as e:
    print(json.dumps({"ok": False, "error": type(e).__name__, "message": str(e)}))

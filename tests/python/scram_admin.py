"""SCRAM credentials through confluent-kafka's AdminClient (AlterUserScramCredentials,
DescribeUserScramCredentials), as a SASL/SCRAM-SHA-256 user. Prints one JSON line. Used by
tests/it/sasl.rs.

usage: scram_admin.py BOOTSTRAP USER PASSWORD ACTION [ARGS...]
  set NAME PASSWORD      -> {"ok": true} or {"ok": false, "error": TEXT}
  delete NAME            -> the same
  describe               -> {"users": {name: [[mechanism, iterations], ...]}} or {"error": TEXT}
"""
import json
import sys

from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)

bootstrap, user, password, action, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
admin = AdminClient({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                     "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                     "sasl.password": password})


def wait(futures):
    try:
        for f in futures.values():
            f.result(timeout=15)
        print(json.dumps({"ok": True}))
    except Exception as e:  # the client's KafkaException carries the broker's error
        print(json.dumps({"ok": False, "error": str(e)}))


if action == "set":
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    wait(admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(args[0], info, args[1].encode())]))
elif action == "delete":
    wait(admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion(args[0], ScramMechanism.SCRAM_SHA_512)]))
elif action == "describe":
    try:
        described = admin.describe_user_scram_credentials().result(timeout=15)
        print(json.dumps({"users": {
            name: sorted([i.mechanism.name, i.iterations] for i in d.scram_credential_infos)
            for name, d in described.items()}}))
    except Exception as e:
        print(json.dumps({"error": str(e)}))

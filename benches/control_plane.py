"""The control plane at scale, against a running shoal (see benches/control_plane.sh).

usage: control_plane.py BOOTSTRAP ADMIN_ADDRESS TOPICS PARTITIONS BATCH

Creates TOPICS topics of PARTITIONS partitions with confluent-kafka's AdminClient, BATCH topics per
CreateTopics request, one request at a time; then times a raw Metadata v1 request for all topics
(and its size), GET /v1/console and GET /metrics (best of 3 each).
"""
import socket
import struct
import sys
import time
import urllib.request

from confluent_kafka.admin import AdminClient, NewTopic


def metadata_of_all(bootstrap):
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        client = b"control_plane.py"
        # Metadata v1, correlation 7, topics null: all of them.
        body = struct.pack(">hhih", 3, 1, 7, len(client)) + client + struct.pack(">i", -1)
        started = time.time()
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", read(s, 4))[0]
        read(s, size)
        return time.time() - started, size + 4


def read(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError("connection closed")
        out += chunk
    return out


def get(admin, path):
    started = time.time()
    with urllib.request.urlopen(f"http://{admin}{path}", timeout=300) as r:
        body = r.read()
    return time.time() - started, len(body)


def main():
    bootstrap, admin = sys.argv[1], sys.argv[2]
    topics, partitions, batch = (int(a) for a in sys.argv[3:6])
    client = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300000})
    started, slowest = time.time(), 0.0
    for first in range(0, topics, batch):
        names = [f"t-{i:05d}" for i in range(first, min(topics, first + batch))]
        sent = time.time()
        new = [NewTopic(n, partitions, 1) for n in names]
        for f in client.create_topics(new, operation_timeout=300, request_timeout=300).values():
            f.result()
        slowest = max(slowest, time.time() - sent)
    took = time.time() - started
    print(f"create {topics} topics x {partitions} partitions, {batch} per request: "
          f"{took:.2f} s (slowest request {slowest:.2f} s)")
    runs = [metadata_of_all(bootstrap) for _ in range(3)]
    print(f"Metadata of all topics: {min(r[0] for r in runs) * 1000:.0f} ms, {runs[0][1]} bytes")
    for path in ["/v1/console", "/metrics"]:
        runs = [get(admin, path) for _ in range(3)]
        print(f"GET {path}: {min(r[0] for r in runs) * 1000:.0f} ms, {runs[0][1]} bytes")


if __name__ == "__main__":
    main()

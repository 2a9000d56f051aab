#!/bin/bash
# The control plane at scale: `benches/control_plane.sh TOPICS PARTITIONS BATCH` (from the
# repository root), e.g. `10000 1 100` (10,000 topics of one partition, 100 per CreateTopics
# request) or `1 10000 1` (one topic of 10,000 partitions).
#
# Starts `shoal serve --cores 2` on an empty data directory and runs `benches/control_plane.py`
# against it with confluent-kafka (librdkafka's admin client): the creation's time, then the time
# and size of Metadata for all topics, `GET /v1/console` and `GET /metrics`.
#
# Environment: SHOAL (default target/release/shoal, built here), DATA_PARENT (where the data
# directory is made; default: mktemp's), PORT (default 39092; admin on PORT + 552), SERVE_FLAGS
# (more `shoal serve` flags). The Python clients are those the tests install into
# target/python-deps (`cargo test --test it python_clients::` installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SHOAL:-}" ]; then
    cargo build --release --quiet
    SHOAL=target/release/shoal
fi
P=${PORT:-39092}
DIR=$(mktemp -d ${DATA_PARENT:+-p "$DATA_PARENT"})
"$SHOAL" serve --data-dir "$DIR" --cores 2 --listen 127.0.0.1:$P --admin 127.0.0.1:$((P + 552)) \
    ${SERVE_FLAGS:-} 2>"$DIR.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR" "$DIR.log"' EXIT
sleep 1
PYTHONPATH=target/python-deps python3 benches/control_plane.py 127.0.0.1:$P 127.0.0.1:$((P + 552)) "$@"
echo "topics.json: $(stat -c %s "$DIR/topics.json") bytes; broker $(grep VmRSS /proc/$PID/status)"

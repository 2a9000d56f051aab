#!/bin/bash
# Ingest against its floor, the disk and the wire, in one script: `benches/ingest.sh` from the
# repository root, after `cargo build --release`.
#
# 1. `cargo bench --bench ingest_floor`: the socket work alone of 4 producers x 5 in flight of 16 KiB
#    requests with one consumer per partition, and one bulk TCP stream (the wire), CPU-s per GB.
# 2. `shoal bench fanout --broker-process --consumers 1 --producers 4 --partitions 4 --acks 1|all
#    --disk-baseline --repeat N`: the same traffic through a `shoal serve` process of its own, with
#    the disk's own rate and latencies (`broker disk`) measured in the same run.
# Prints each run's summary; the JSON summaries are kept in OUT.
#
# Environment: B (target/release/shoal), REPEAT (3), DUR (8s), OUT (a directory; default a
# temporary one, kept), EXTRA (more `shoal bench fanout` flags, e.g. --broker-arg=--flush-ms=0).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-target/release/shoal}
REPEAT=${REPEAT:-3}
DUR=${DUR:-8s}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
echo "== floor (cargo bench --bench ingest_floor)"
cargo bench --bench ingest_floor 2>/dev/null | tee "$OUT/floor.txt"
for acks in 1 all; do
    echo "== shoal, acks=$acks"
    # shellcheck disable=SC2086
    "$B" bench fanout --broker-process --consumers 1 --producers 4 --partitions 4 --acks "$acks" \
        --disk-baseline --repeat "$REPEAT" --duration "$DUR" --json "$OUT/acks-$acks.json" ${EXTRA:-} |
        tee "$OUT/acks-$acks.txt"
done
echo "summaries in $OUT"

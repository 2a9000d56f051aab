#!/bin/bash
# The edge tier beside `serve`, in one run: `benches/edge.sh` (from the repository root).
#
# An upstream `shoal serve --cores 1` and the load generator share CPU 1; a `shoal edge --cores 1`
# in front of the upstream and, as the baseline, a `shoal serve --cores 1` serving the same
# workload itself share CPU 0. For each consumer count it runs the same paced fan-out against the
# edge (producers write upstream) and against the baseline, and prints, from the brokers' own
# metrics, the bytes the edge fetched from upstream against the bytes it served (the fan-out
# saving), and each broker's CPU-s per delivered GB with their ratio.
#
# Environment: CONSUMERS (default "64 256"), RATE (default 1MB/s; empty: unpaced), DUR (default
# 8s), BASE_PORT (default 19092: uses it and the next 20000 and 40000 above, and 552 above each
# for admin).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
B=target/release/shoal
CONSUMERS=${CONSUMERS:-64 256}
RATE=${RATE-1MB/s}
DUR=${DUR:-8s}
P=${BASE_PORT:-19092}
UP=127.0.0.1:$P EDGE=127.0.0.1:$((P + 10000)) BASE=127.0.0.1:$((P + 20000))
UP_ADMIN=127.0.0.1:$((P + 552)) EDGE_ADMIN=127.0.0.1:$((P + 10552)) BASE_ADMIN=127.0.0.1:$((P + 20552))
DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
on_cpu() { if command -v taskset >/dev/null; then exec taskset -c "$@"; else shift; exec "$@"; fi; }

for a in $UP_ADMIN $EDGE_ADMIN $BASE_ADMIN; do
    if curl -s -m 1 "http://$a/metrics" >/dev/null; then
        echo "benches/edge.sh: something already listens on $a (another run?); set BASE_PORT" >&2
        exit 1
    fi
done
mkdir -p "$DIR"/up "$DIR"/edge "$DIR"/base
on_cpu 1 $B serve --cores 1 --data-dir "$DIR"/up --listen $UP --admin $UP_ADMIN >/dev/null 2>"$DIR"/up.log &
PIDS+=($!)
sleep 1
on_cpu 0 $B edge --upstream $UP --cores 1 --data-dir "$DIR"/edge --listen $EDGE --admin $EDGE_ADMIN \
    --edge-metadata-refresh-ms 500 >/dev/null 2>"$DIR"/edge.log &
PIDS+=($!)
on_cpu 0 $B serve --cores 1 --data-dir "$DIR"/base --listen $BASE --admin $BASE_ADMIN >/dev/null 2>"$DIR"/base.log &
PIDS+=($!)
sleep 2

# A metric summed over cores.
metric() { curl -s "http://$1/metrics" | awk -v n="$2" '$1 ~ "^"n"[{ ]" || $1 == n {s+=$2} END {printf "%.0f\n", s+0}'; }

run() { # target, consumers -> prints the bench's lines; sets CPU_GB
    local args
    if [ "$1" = edge ]; then
        args="--bootstrap $EDGE --produce-bootstrap $UP --admin $EDGE_ADMIN"
    else
        args="--bootstrap $BASE --admin $BASE_ADMIN"
    fi
    local out
    out=$(on_cpu 1 $B bench fanout $args --consumers "$2" ${RATE:+--rate $RATE} --duration "$DUR" \
        --warmup 2s --topic "t-$1-$2-$RANDOM" 2>&1)
    echo "$out" | grep -E "^(produced|delivered|e2e|correctness|broker) " | sed 's/^/    /'
    CPU_GB=$(echo "$out" | sed -n 's/^broker .* \([0-9.]*\) CPU-s per delivered GB.*/\1/p')
}

echo "shoal edge vs serve: ${RATE:-unpaced}, $DUR measured per run"
for C in $CONSUMERS; do
    up0=$(metric $EDGE_ADMIN shoal_edge_upstream_bytes_total)
    rt0=$(metric $EDGE_ADMIN shoal_edge_read_through_bytes_total)
    out0=$(metric $EDGE_ADMIN shoal_fetch_response_bytes_total)
    echo "== edge, $C consumers"
    run edge "$C"
    edge_gb=$CPU_GB
    up=$(($(metric $EDGE_ADMIN shoal_edge_upstream_bytes_total) - up0))
    rt=$(($(metric $EDGE_ADMIN shoal_edge_read_through_bytes_total) - rt0))
    out=$(($(metric $EDGE_ADMIN shoal_fetch_response_bytes_total) - out0))
    streams=$(metric $UP_ADMIN shoal_fetch_connections)
    echo "== serve (baseline), $C consumers"
    run serve "$C"
    serve_gb=$CPU_GB
    echo "-- $C consumers: upstream read $up B by the fetcher + $rt B read-through, served $out B:" \
        "fan-out saving $(awk -v o="$out" -v u="$((up + rt))" 'BEGIN {printf "%.1f", (u > 0 ? o / u : 0)}')x;" \
        "upstream fetch connections now $streams"
    echo "-- edge $edge_gb CPU-s per delivered GB, serve $serve_gb:" \
        "ratio $(awk -v e="$edge_gb" -v s="$serve_gb" 'BEGIN {printf "%.2f", (s > 0 ? e / s : 0)}')x"
done

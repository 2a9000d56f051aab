#!/bin/bash
# Transactional produce against idempotent produce of the same batches: `benches/producer_modes.sh`
# (from the repository root, after `cargo build --release`).
#
# Ingest: `shoal bench fanout --broker-process` (a fresh broker process per run) with one consumer
# per partition, idempotent then transactional (commit every COMMIT_MS), alternating, REPEAT times
# each so that the machine's drift reaches both alike; prints each run and the medians of produced
# MB/s and broker CPU-s per delivered GB, with the transactional/idempotent ratio.
# Tail: 256 consumers of one partition fed at 1MB/s by a transactional producer, read_committed
# against read_uncommitted, and read_committed with fetch coalescing on and off (--compare).
#
# Environment: B (target/release/shoal), REPEAT (3), DUR (10s), COMMIT_MS (100), TAIL (1: also the tail runs; 0: ingest
# only), OUT (a directory for the JSON summaries; default a temporary one, kept).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-target/release/shoal}
REPEAT=${REPEAT:-3}
DUR=${DUR:-10s}
COMMIT_MS=${COMMIT_MS:-100}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
INGEST=(--broker-process --consumers 1 --producers 2 --partitions 4 --duration "$DUR" --quiet)
for i in $(seq 1 "$REPEAT"); do
    "$B" bench fanout "${INGEST[@]}" --idempotent --json "$OUT/idempotent-$i.json" >/dev/null
    "$B" bench fanout "${INGEST[@]}" --transactional --commit-interval-ms "$COMMIT_MS" \
        --isolation read_committed --json "$OUT/transactional-$i.json" >/dev/null
done
if [ "${TAIL:-1}" = 1 ]; then
    TAIL_RUN=(--broker-process --consumers 256 --producers 1 --partitions 1 --rate 1MB/s
        --duration "$DUR" --transactional --commit-interval-ms "$COMMIT_MS" --quiet)
    "$B" bench fanout "${TAIL_RUN[@]}" --isolation read_uncommitted \
        --json "$OUT/tail-read_uncommitted.json" >/dev/null
    "$B" bench fanout "${TAIL_RUN[@]}" --isolation read_committed --compare coalescing \
        --json "$OUT/tail-read_committed.json" >/dev/null
fi
python3 - "$OUT" "$REPEAT" <<'EOF'
import json, statistics, sys, os
out, repeat = sys.argv[1], int(sys.argv[2])
def runs(name):
    return json.load(open(os.path.join(out, name)))["runs"]
def fig(r):
    s, p = r["server"], r["producer_mode"]
    e2e = r["e2e_latency_us"] or {}
    return (r["produced"]["mb_per_s"], s["cpu_s_per_delivered_gb"], e2e.get("p50"), e2e.get("p99"),
            p.get("commits"), p.get("mean_end_txn_us"), r["errors"]["count"],
            r["correctness"]["all_received"], r["delivered"]["mb_per_s"])
def line(label, r):
    mb, cpu, p50, p99, commits, endtxn, errors, ok, delivered = fig(r)
    extra = f", {commits} commits, EndTxn mean {endtxn / 1000:.2f} ms" if commits else ""
    print(f"{label:<34} produced {mb:7.1f} MB/s, delivered {delivered:7.1f} MB/s, broker {cpu:.2f} CPU-s/GB, e2e p50 {p50 / 1000:.1f} ms"
          f" p99 {p99 / 1000:.1f} ms{extra}; errors {errors}, all received {ok}")
med = {}
for mode in ["idempotent", "transactional"]:
    rs = [runs(f"{mode}-{i}.json")[0] for i in range(1, repeat + 1)]
    for i, r in enumerate(rs, 1):
        line(f"{mode} {i}", r)
    med[mode] = (statistics.median(fig(r)[0] for r in rs), statistics.median(fig(r)[1] for r in rs))
for mode, (mb, cpu) in med.items():
    print(f"median {mode:<27} produced {mb:7.1f} MB/s, broker {cpu:.2f} CPU-s/GB")
print(f"transactional / idempotent         produced MB/s {med['transactional'][0] / med['idempotent'][0]:.2f}x,"
      f" broker CPU-s/GB {med['transactional'][1] / med['idempotent'][1]:.2f}x")
if os.path.exists(os.path.join(out, "tail-read_committed.json")):
    line("tail read_uncommitted", runs("tail-read_uncommitted.json")[0])
    on, off = runs("tail-read_committed.json")
    line(f"tail read_committed coalescing={'on' if on['coalescing'] else 'off'}", on)
    line(f"tail read_committed coalescing={'on' if off['coalescing'] else 'off'}", off)
print(f"(JSON summaries in {out})")
EOF

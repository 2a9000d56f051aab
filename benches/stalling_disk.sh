#!/usr/bin/env bash
# Publish latency on a disk that stalls behind its cache flushes, acks=1 against acks=all.
#
# What it shows: a VM disk may hold writes behind a cache flush for up to a second or more. shoal
# writes acks=0/1 appends through the page cache (acknowledged once the kernel holds the bytes) and
# acks=all appends with Direct I/O and O_DSYNC (acknowledged once on the device). On a disk whose
# every flush stalls STALL_MS, acks=1 publish latency should stay far below the stall, while acks=all
# (and a shoal from before the change, B_OLD, whose acks=1 appends were Direct I/O too) waits it out.
#
# The disk: tests/python/volatile_disk.py (a FUSE daemon serving one file, disk.img, over a sparse
# stable image in a temporary directory on the real disk) with VOLATILE_DISK_STALL_MS set, so that
# every fsync of disk.img sleeps that long first while every other request queues behind it; a loop
# device on disk.img (buffered: the loop driver turns the block layer's flushes and FUA writes into
# fsyncs of disk.img); ext4 on the loop device. The broker fdatasyncs its segments every --flush-ms
# (1000 ms by default) and ext4 commits its journal every 5 s, so a stall comes at least every
# second. Each binary runs `shoal bench fanout --broker-process` with its data directory on that
# ext4, once with acks=1 and once with acks=all; then the same again on a disk without stalls
# (STALL_MS=0) for reference (REFERENCE=0 skips that).
#
# Run (root: mounts, loop devices, FUSE), from the repository:
#   sudo benches/stalling_disk.sh
#   sudo B_OLD=/path/to/old/shoal benches/stalling_disk.sh
# Environment:
#   B_NEW        the shoal binary under test (default: target/release/shoal of this repository)
#   B_OLD        a second binary to compare with, e.g. one built before the change (default: none)
#   STALL_MS     the stall of each fsync, ms (default 500)
#   STALL_EVERY  stall only every Nth fsync (default 1: every one)
#   RATE         total produce rate (default 20MB/s; the Python daemon must sustain it: compare the
#                produced MB/s column with it)
#   DURATION     measured time of each run (default 10s; after a 2 s warm-up)
#   ACKS         the acks settings to run (default "1 all")
#   BENCH_ARGS   extra flags for every `shoal bench fanout`, e.g. "--broker-arg=--segment-bytes=32MiB"
#   IMAGE_GIB    size of the disk (default 2; the daemon holds it all in memory)
#   REFERENCE    1 (default): also run everything on the disk without stalls; 0: don't
#   WORK         where the stable image and mounts go (default: a new directory under /var/tmp,
#                which must be on a real disk, not tmpfs; removed at the end)
#   OUT          where the JSON summaries and bench outputs are kept (default: a new /tmp/stalling-disk.*)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DAEMON="$REPO/tests/python/volatile_disk.py"
B_NEW=${B_NEW:-$REPO/target/release/shoal}
B_OLD=${B_OLD:-}
STALL_MS=${STALL_MS:-500}
STALL_EVERY=${STALL_EVERY:-1}
RATE=${RATE:-20MB/s}
DURATION=${DURATION:-10s}
ACKS=${ACKS:-1 all}
IMAGE_GIB=${IMAGE_GIB:-2}
REFERENCE=${REFERENCE:-1}
read -r -a BENCH_ARGS <<<"${BENCH_ARGS:-}"
OUT=${OUT:-$(mktemp -d /tmp/stalling-disk.XXXXXX)}

if [[ $(id -u) != 0 ]]; then
    echo "stalling_disk.sh: run as root (mounts, loop devices, FUSE)" >&2
    exit 1
fi
for b in "$B_NEW" ${B_OLD:+"$B_OLD"}; do
    [[ -x $b ]] || { echo "stalling_disk.sh: no binary at $b" >&2; exit 1; }
done
mkdir -p "$OUT"
WORK=${WORK:-$(mktemp -d /var/tmp/stalling-disk.XXXXXX)}
mkdir -p "$WORK"

# The layers now up, torn down by teardown (in reverse order).
DAEMON_PID=""
FUSE_DIR=""
LOOP_DEV=""
EXT4_DIR=""

teardown() {
    if [[ -n $EXT4_DIR ]]; then
        umount "$EXT4_DIR" 2>/dev/null || umount -l "$EXT4_DIR" 2>/dev/null || true
        EXT4_DIR=""
    fi
    if [[ -n $LOOP_DEV ]]; then
        losetup -d "$LOOP_DEV" 2>/dev/null || true
        LOOP_DEV=""
    fi
    if [[ -n $FUSE_DIR ]]; then
        umount "$FUSE_DIR" 2>/dev/null || umount -l "$FUSE_DIR" 2>/dev/null || true
        FUSE_DIR=""
    fi
    if [[ -n $DAEMON_PID ]]; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$DAEMON_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
        DAEMON_PID=""
    fi
}

cleanup() {
    local rc=$?
    teardown
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# setup_disk STALL_MS: a new stable image, the daemon stalling each fsync STALL_MS, the loop
# device, ext4 formatted and mounted at $EXT4_DIR.
setup_disk() {
    local stall=$1
    local image="$WORK/stable.img"
    rm -f "$image"
    truncate -s "${IMAGE_GIB}G" "$image"
    FUSE_DIR="$WORK/fuse"
    mkdir -p "$FUSE_DIR"
    VOLATILE_DISK_STALL_MS=$stall VOLATILE_DISK_STALL_EVERY=$STALL_EVERY \
        python3 "$DAEMON" "$image" "$FUSE_DIR" >"$WORK/daemon.out" 2>"$WORK/daemon.err" &
    DAEMON_PID=$!
    for _ in $(seq 300); do
        grep -qx ready "$WORK/daemon.out" && break
        kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$WORK/daemon.err" >&2; return 1; }
        sleep 0.1
    done
    grep -qx ready "$WORK/daemon.out" || { echo "the FUSE daemon did not get ready" >&2; return 1; }
    LOOP_DEV=$(losetup --find --show --direct-io=off "$FUSE_DIR/disk.img")
    # As tests/it/common/volatile_disk.rs: no discards, inode tables and journal written now (no
    # kernel thread zeroing them later, during the runs).
    mkfs.ext4 -q -F -b 4096 -N 4096 -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$LOOP_DEV"
    EXT4_DIR="$WORK/ext4"
    mkdir -p "$EXT4_DIR"
    mount -t ext4 "$LOOP_DEV" "$EXT4_DIR"
}

ROWS="$OUT/rows.tsv"
: >"$ROWS"
N=0

# run_one STALL NAME BINARY ACKS
run_one() {
    local stall=$1 name=$2 bin=$3 acks=$4
    N=$((N + 1))
    local tag="run-$N-$name-acks$acks-stall$stall"
    local data="$EXT4_DIR/run-$N"
    mkdir -p "$data"
    echo "== $tag: $bin, acks=$acks, stall ${stall} ms every $STALL_EVERY fsync(s), $RATE for $DURATION ${BENCH_ARGS[*]}" >&2
    local rc=0
    "$bin" bench fanout --broker-process --data-dir "$data" --consumers 1 --producers 2 \
        --partitions 2 --acks "$acks" --rate "$RATE" --duration "$DURATION" --quiet ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} \
        --json "$OUT/$tag.json" >"$OUT/$tag.txt" 2>&1 || rc=$?
    grep -E '^(produced|publish latency|broker disk|errors|correctness) ' "$OUT/$tag.txt" >&2 || true
    if [[ $rc != 0 || ! -s $OUT/$tag.json ]]; then
        echo "   failed (exit $rc); its output: $OUT/$tag.txt" >&2
        tail -5 "$OUT/$tag.txt" >&2
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$stall" "$name" "$acks" "-" "FAILED (exit $rc)" "-" >>"$ROWS"
    else
        python3 - "$OUT/$tag.json" "$stall" "$name" "$acks" "$OUT/$tag.txt" >>"$ROWS" <<'EOF'
import json, sys
path, stall, name, acks, text = sys.argv[1:]
run = json.load(open(path))["runs"][0]
lat = run["publish_latency_us"]
ms = lambda us: f"{us / 1000:.1f}"
lats = " / ".join(ms(lat[k]) for k in ("p50", "p99", "p99_9", "max"))
disk = next((l[len("broker disk"):].strip() for l in open(text) if l.startswith("broker disk")), "-")
print(f"{stall}\t{name}\t{acks}\t{run['produced']['mb_per_s']:.1f}\t{lats}\t{disk}")
EOF
    fi
    rm -rf "$data"
}

# run_all STALL: every binary and acks on a fresh disk stalling STALL ms.
run_all() {
    local stall=$1
    setup_disk "$stall"
    for acks in $ACKS; do
        run_one "$stall" new "$B_NEW" "$acks"
        if [[ -n $B_OLD ]]; then
            run_one "$stall" old "$B_OLD" "$acks"
        fi
    done
    teardown
}

echo "binaries: new=$B_NEW${B_OLD:+ old=$B_OLD}; outputs in $OUT" >&2
run_all "$STALL_MS"
if [[ $REFERENCE == 1 && $STALL_MS != 0 ]]; then
    run_all 0
fi

echo
echo "Publish latency on ext4 over a disk stalling each flush (2 producers, 2 partitions, 1 consumer each, $RATE, $DURATION)"
printf '%-9s %-6s %-5s %-8s %-32s %s\n' "stall ms" binary acks "MB/s" "publish ms p50 / p99 / p99.9 / max" "broker disk"
while IFS=$'\t' read -r stall name acks mbs lats disk; do
    printf '%-9s %-6s %-5s %-8s %-32s %s\n' "$stall" "$name" "$acks" "$mbs" "$lats" "$disk"
done <"$ROWS"

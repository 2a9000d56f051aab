#!/usr/bin/env bash
# Makes docs/console.png, the picture of the console (docs/console.md, README): a 2-core release
# `shoal serve` under a real load for DURATION seconds (default 300), in three phases so the charts
# show changes: producers writing to "clicks" and to a hot one-partition "prices" read by 4
# consumers (read replicas on), and to "orders" that a stopped group lags behind; then 12 more
# consumers of "prices"; then twice the rate into "clicks". Then headless chromium opens
# http://ADMIN/console?topic=prices in real time (no virtual time, so the page's own rates are
# real too) and the screenshot is taken over the Chrome DevTools protocol once it has polled.
# Run from the repository root after `cargo build --release` (or with SHOAL=target/debug/shoal);
# needs chromium (apt-get install chromium) and python3.
set -euo pipefail
shoal=${SHOAL:-target/release/shoal}
duration=${DURATION:-300}
out=${OUT:-docs/console.png}
dir=$(mktemp -d)
pids=()
stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap stop EXIT
b=127.0.0.1:39092
admin=127.0.0.1:39644

# Lines of SIZE bytes at RATE a second on standard output, for SECONDS seconds.
lines() {
    python3 -u - "$@" <<'EOF'
import sys, time
rate, size, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    tick = time.monotonic()
    for _ in range(max(1, rate // 10)):
        n += 1
        print(("%d " % n).ljust(size, "x"))
    time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
EOF
}

# Writes LINES (a generator's output) to TOPIC in the background.
producing() {
    local topic=$1
    shift
    lines "$@" | $shoal produce "$topic" -b $b --batch-records 100 >/dev/null &
    pids+=($!)
}

reading() {
    for _ in $(seq 1 "$2"); do
        $shoal consume "$1" --offset beginning -b $b >/dev/null &
        pids+=($!)
    done
}

$shoal serve --cores 2 --data-dir "$dir/data" --listen $b --admin $admin \
    --read-replicas all --group-lag-interval-ms 1000 2>"$dir/log" &
pids+=($!)
sleep 2
$shoal topic create prices --partitions 1 -b $b
$shoal topic create clicks --partitions 6 -b $b
$shoal topic create orders --partitions 3 -b $b
seq 1 300 | $shoal produce orders -b $b >/dev/null
$shoal group seek billing --topic orders --to-earliest -b $b >/dev/null

phase=$((duration / 3))
left=$((duration + 60))
producing clicks 2000 1000 $left
producing prices 500 200 $left
producing orders 20 100 $left
reading prices 4
reading clicks 1
sleep $phase
reading prices 12
sleep $phase
producing clicks 2000 1000 $left
sleep $((duration - 2 * phase))

cat >"$dir/shot.py" <<'EOF'
# Opens URL in headless chromium, waits WAIT seconds of real time, saves a PNG of the whole page.
import base64, json, os, sys, time
url, out, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
to_r, to_w = os.pipe()
from_r, from_w = os.pipe()
pid = os.fork()
if pid == 0:
    # --remote-debugging-pipe: the browser reads the protocol on fd 3 and writes on fd 4.
    a, b = os.dup(to_r), os.dup(from_w)
    os.dup2(a, 3)
    os.dup2(b, 4)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.closerange(5, 1024)
    os.execvp("chromium", ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--window-size=1400,1000",
                           "--remote-debugging-pipe", url])
os.close(to_r)
os.close(from_w)
buf, next_id = b"", 0

def call(method, params=None, session=None):
    global buf, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    os.write(to_w, json.dumps(msg).encode() + b"\0")
    while True:
        while b"\0" not in buf:
            chunk = os.read(from_r, 1 << 20)
            if not chunk:
                sys.exit("chromium closed its pipe")
            buf += chunk
        line, buf = buf.split(b"\0", 1)
        m = json.loads(line)
        if m.get("id") == next_id:
            if "error" in m:
                sys.exit(f"{method}: {m['error']}")
            return m["result"]

try:
    page = next(t for t in call("Target.getTargets")["targetInfos"] if t["type"] == "page")
    s = call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
    time.sleep(wait)
    size = call("Page.getLayoutMetrics", {}, s)["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": 1400, "height": min(size["height"], 2400), "scale": 1}
    shot = call("Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip}, s)
    with open(out, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
finally:
    os.kill(pid, 15)
    os.waitpid(pid, 0)
EOF
python3 "$dir/shot.py" "http://$admin/console?topic=prices" "$out" 7
echo "wrote $out"

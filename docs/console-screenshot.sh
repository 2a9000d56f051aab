#!/usr/bin/env bash
# Makes docs/console.png, the README's picture of the console: a 2-core `shoal serve` with a hot
# partition read by 16 consumers (read replicas on), a wider topic being produced to, and a lagging
# group; then headless chromium's screenshot of http://ADMIN/console?topic=prices.
# Run from the repository root after `cargo build --release` (or with SHOAL=target/debug/shoal);
# needs chromium (apt-get install chromium).
set -euo pipefail
shoal=${SHOAL:-target/release/shoal}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
$shoal serve --cores 2 --data-dir "$dir/data" --listen 127.0.0.1:39092 --admin 127.0.0.1:39644 \
    --read-replicas all --group-lag-interval-ms 500 2>"$dir/log" &
sleep 2
b=127.0.0.1:39092
$shoal topic create prices --partitions 1 -b $b
$shoal topic create clicks --partitions 6 -b $b
$shoal topic create orders --partitions 3 -b $b
seq 1 2000 | sed 's/^/price /' | $shoal produce prices -b $b >/dev/null
seq 1 6000 | awk '{print "user" $1 % 97 "\tclick " $1}' | $shoal produce clicks --key-delimiter '\t' -b $b >/dev/null
seq 1 300 | $shoal produce orders -b $b >/dev/null
$shoal group seek billing --topic orders --to-earliest -b $b >/dev/null
for i in $(seq 1 16); do $shoal consume prices --offset beginning -b $b >/dev/null & done
(while true; do seq 1 200 | $shoal produce clicks -b $b >/dev/null; sleep 0.2; done) &
sleep 12
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
    --virtual-time-budget=5000 --screenshot=docs/console.png \
    "http://127.0.0.1:39644/console?topic=prices" 2>/dev/null
echo "wrote docs/console.png"

#!/usr/bin/env bash
# Memory under a burst of large request bodies: N clients (default 16) each
# send one body of SIZE (default 64MiB) at once through warmroute to a fast
# fake upstream, and the proxy's resident memory is printed before, at its
# peak during the burst, and 1 s and 10 s after it, with the status codes
# the clients got. -max-body-memory bounds the bodies held at once.
#   scripts/bodies.sh [N] [SIZE] [extra warmroute flags...]
# WARMROUTE_BIN=path measures a prebuilt warmroute. What it prints is
# written to benchmarks/results/bodies.md as well.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
n=${1:-16}; size=${2:-64MiB}; shift 2 || shift $# || true
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record bodies "WARMROUTE_BIN" "${args[@]}"
if [ -n "${WARMROUTE_BIN:-}" ]; then cp "$WARMROUTE_BIN" "$tmp/warmroute"; else go build -o "$tmp/warmroute" .; fi
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
up=127.0.0.1:19201 front=127.0.0.1:19280
"$tmp/fakeupstream" -listen $up & pids+=($!)
"$tmp/warmroute" -listen $front -admin-listen "" -upstream "http://$up" -max-body-size "$size" "$@" 2>"$tmp/warmroute.log" & wr=$!; pids+=($wr)
for _ in $(seq 50); do curl -fs -o /dev/null "http://$front/health" && break; sleep 0.1; done
bytes=$(numfmt --from=iec "${size%B}" 2>/dev/null || numfmt --from=iec "$(echo "$size" | sed 's/iB$//')")
python3 - "$bytes" >"$tmp/body.json" <<'PY'
import sys
n = int(sys.argv[1])
head, tail = '{"model":"m","messages":[{"role":"user","content":"', '"}]}'
sys.stdout.write(head + "x" * (n - len(head) - len(tail)) + tail)
PY
rss() { awk '/VmRSS/{print $2}' /proc/$wr/status; }
echo "before: $(( $(rss) / 1024 )) MiB resident"
peak=0 clients=()
for i in $(seq "$n"); do
  curl -s -o /dev/null -m 60 -w '%{http_code}\n' -H 'Content-Type: application/json' --data-binary @"$tmp/body.json" "http://$front/v1/chat/completions" >>"$tmp/codes" &
  clients+=($!)
done
alive() { local p; for p in "${clients[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do r=$(rss); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.02; done
wait "${clients[@]}" || true
echo "during: $(( peak / 1024 )) MiB resident at the peak; answers: $(sort "$tmp/codes" | uniq -c | awk '{printf "%s x%s  ", $2, $1}')"
sleep 1; echo "1 s after: $(( $(rss) / 1024 )) MiB resident"
sleep 9; echo "10 s after: $(( $(rss) / 1024 )) MiB resident"
record_end

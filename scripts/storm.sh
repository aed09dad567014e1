#!/usr/bin/env bash
# Memory after a storm of connections: warmroute in front of a fake
# upstream takes N slow connections (default 3000; each sends half a
# request head and waits) and S slow streams (default 100; an SSE event a
# second for 5 s) at once; when all have closed, its resident memory is
# read every second for 30 s. It passes when the memory comes back within
# 2x of what it was before the storm, and exits 1 otherwise.
#   scripts/storm.sh [N] [S] [extra warmroute flags...]
# WARMROUTE_BIN=path measures a prebuilt warmroute (one built before the
# change, say). What it prints is written to benchmarks/results/storm.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
n=${1:-3000}; s=${2:-100}; shift 2 || shift $# || true
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record storm "WARMROUTE_BIN" "${args[@]}"
if [ -n "${WARMROUTE_BIN:-}" ]; then cp "$WARMROUTE_BIN" "$tmp/warmroute"; else go build -o "$tmp/warmroute" .; fi
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/streams" ./benchmarks/cmd/streams
up=127.0.0.1:19301 front=127.0.0.1:19380
"$tmp/fakeupstream" -listen $up -chunks 5 -chunk-interval 1s & pids+=($!)
"$tmp/warmroute" -listen $front -admin-listen "" -upstream "http://$up" "$@" 2>"$tmp/warmroute.log" & wr=$!; pids+=($wr)
for _ in $(seq 50); do curl -fs -o /dev/null "http://$front/health" && break; sleep 0.1; done
rss() { awk '/VmRSS/{print $2}' /proc/$wr/status; }
for _ in $(seq 20); do curl -s -o /dev/null -H 'Content-Type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' "http://$front/v1/chat/completions"; done
sleep 2
base=$(rss)
echo "before: $(( base / 1024 )) MiB resident"
python3 - "$front" "$n" >"$tmp/slow.log" 2>&1 <<'PY' & slow=$!
import socket, sys, time
host, port = sys.argv[1].split(":"); n = int(sys.argv[2])
socks = []
for _ in range(n):
    c = socket.create_connection((host, int(port)))
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    socks.append(c)
time.sleep(5)
for c in socks:
    c.close()
PY
"$tmp/streams" -addr $front -n "$s" >"$tmp/streams.log" 2>&1 & st=$!
peak=0
while kill -0 $slow 2>/dev/null || kill -0 $st 2>/dev/null; do r=$(rss); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.1; done
wait $slow $st || true
echo "during: $(( peak / 1024 )) MiB resident at the peak ($n slow connections, $s slow streams)"
back=""
for i in $(seq 30); do
  sleep 1; r=$(rss)
  case $i in 1|5|10|20|30) echo "$i s after: $(( r / 1024 )) MiB resident";; esac
  [ -z "$back" ] && [ "$r" -le $(( 2 * base )) ] && back=$i
done
record_end
if [ -n "$back" ]; then echo "back within 2x of before after $back s"; else echo "not back within 2x of before in 30 s"; exit 1; fi

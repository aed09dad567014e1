#!/usr/bin/env bash
# CPU time that proxies spend on streams whose events come paced, as a
# model's tokens do: N streams (default 1000) opened at RATE a second
# (default 500), each of CHUNKS events (default 100) INTERVAL apart
# (default 20ms), from two fake upstreams that send each head at once.
# Most of such a stream's life is a wait for its next event, so what is
# measured is the cost of a wait and its wake.
#   scripts/paced.sh [proxies...]   (default: warmroute nginx; also base,
#                                    gorelay)
# Prints, for each proxy, its CPU seconds (user and system, from
# /proc/PID/stat) over the whole run, and per event. The proxies run one
# after the other, nothing pinned; run it twice and compare the proxies
# within each run. WARMROUTE_BIN=path measures a prebuilt warmroute;
# WARMROUTE_BASE=path adds the proxy "base", another warmroute binary.
# EXTRA holds more flags for warmroute and base. The figures are written to
# benchmarks/results/paced.md as well.
set -euo pipefail
cd "$(dirname "$0")/.."
proxies=${*:-warmroute nginx}
n=${N:-1000} rate=${RATE:-500} chunks=${CHUNKS:-100} interval=${INTERVAL:-20ms}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null; sleep 0.2; rm -rf "$tmp"; }
trap cleanup EXIT
. scripts/record.sh
record paced "N RATE CHUNKS INTERVAL EXTRA WARMROUTE_BIN WARMROUTE_BASE" "$@"
if [ -n "${WARMROUTE_BIN:-}" ]; then cp "$WARMROUTE_BIN" "$tmp/warmroute"; else go build -o "$tmp/warmroute" .; fi
if [ -n "${WARMROUTE_BASE:-}" ]; then cp "$WARMROUTE_BASE" "$tmp/base"; fi
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/streams" ./benchmarks/cmd/streams
go build -o "$tmp/gorelay" ./benchmarks/cmd/gorelay
u1=127.0.0.1:19401 u2=127.0.0.1:19402 front=127.0.0.1:19480
"$tmp/fakeupstream" -listen $u1 -chunks "$chunks" -chunk-interval "$interval" -head-first >/dev/null 2>&1 & pids+=($!)
"$tmp/fakeupstream" -listen $u2 -chunks "$chunks" -chunk-interval "$interval" -head-first >/dev/null 2>&1 & pids+=($!)
scripts/nginx-conf.sh "$tmp" $front $u1 $u2 >"$tmp/nginx.conf"
hz=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; } # ticks
up() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/${front%:*}/${front#*:}") 2>/dev/null && return; sleep 0.05; done; }
for proxy in $proxies; do
  case $proxy in
  warmroute|base)
    [ -x "$tmp/$proxy" ] || { echo "proxy base needs WARMROUTE_BASE=path" >&2; exit 2; }
    "$tmp/$proxy" -listen $front -admin-listen "" -log-level warn -drain-delay 0 -upstream "http://$u1,http://$u2" ${EXTRA:-} >/dev/null 2>&1 &
    pid=$!; m=$pid ;;
  gorelay)
    "$tmp/gorelay" -listen $front -upstream "$u1,$u2" >/dev/null 2>&1 & pid=$!; m=$pid ;;
  nginx)
    command -v nginx >/dev/null || { echo "paced.sh nginx needs nginx: apt-get install nginx" >&2; exit 2; }
    nginx -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" -p "$tmp" >/dev/null 2>&1 & pid=$!
    for _ in $(seq 50); do [ -f "$tmp/nginx.pid" ] && pgrep -P "$(cat "$tmp/nginx.pid")" >/dev/null && break; sleep 0.1; done
    m=$(pgrep -P "$(cat "$tmp/nginx.pid")" | head -1) ;;
  *) echo "unknown proxy $proxy" >&2; exit 2 ;;
  esac
  pids+=($pid)
  up
  "$tmp/streams" -addr $front -n 2 >/dev/null
  c0=$(cpu "$m")
  "$tmp/streams" -addr $front -n "$n" -rate "$rate" >"$tmp/out" 2>&1 || true
  c1=$(cpu "$m")
  case $proxy in nginx) kill "$(cat "$tmp/nginx.pid")"; sleep 0.5; rm -f "$tmp/nginx.pid" ;; *) kill $pid ;; esac
  wait $pid 2>/dev/null || true
  awk -v p="$proxy" -v c="$((c1 - c0))" -v hz="$hz" -v n="$n" -v k="$chunks" -v out="$(grep -o 'completed=[0-9]* failed=[0-9]*' "$tmp/out" | tail -1)" \
    'BEGIN{printf "%-10s cpu %.2f s, %.2f us an event (%d streams of %d events; %s)\n", p, c/hz, c/hz/(n*k)*1e6, n, k, out}'
done
record_end

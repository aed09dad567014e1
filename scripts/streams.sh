#!/usr/bin/env bash
# Holds N slow SSE streams open through warmroute at once (the fake
# upstream sends an event a second, 10 events), and reports warmroute's
# resident memory and goroutines per open stream, then checks that both
# return to baseline once the streams end.
#   scripts/streams.sh [N]   (default 9000: warmroute holds 2 sockets a
#                             stream, and this machine caps open files at 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-9000}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; sleep 0.2; rm -rf "$tmp"; }
trap cleanup EXIT
go build -o "$tmp/warmroute" .
go build -o "$tmp/fakeupstream" ./benchmarks/cmd/fakeupstream
go build -o "$tmp/streams" ./benchmarks/cmd/streams
"$tmp/fakeupstream" -listen 127.0.0.1:19201 -chunks 10 -chunk-interval 1s & pids+=($!)
"$tmp/fakeupstream" -listen 127.0.0.1:19202 -chunks 10 -chunk-interval 1s & pids+=($!)
"$tmp/warmroute" -listen 127.0.0.1:19280 -admin-listen 127.0.0.1:19281 -log-level warn \
  -upstream http://127.0.0.1:19201,http://127.0.0.1:19202 2>"$tmp/warmroute.log" & wr=$!; pids+=($wr)
for _ in $(seq 50); do curl -fs http://127.0.0.1:19280/health >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/{print $2}' /proc/$wr/status; }          # KiB
gor() { curl -fs 'http://127.0.0.1:19281/debug/pprof/goroutine?debug=1' | head -1 | sed 's/.*total //'; }
fds() { ls /proc/$wr/fd | wc -l; }
heap() { curl -fs http://127.0.0.1:19281/metrics | awk '/^go_memstats_heap_inuse_bytes/{printf "%.0f", $2/1024}'; }
# Warm up once so that the baseline includes the pools a first request makes.
"$tmp/streams" -addr 127.0.0.1:19280 -n 2 >/dev/null
sleep 1
rss0=$(rss); g0=$(gor); f0=$(fds); h0=$(heap)
"$tmp/streams" -addr 127.0.0.1:19280 -n "$n" >"$tmp/out" 2>&1 & client=$!
until grep -q '^open' "$tmp/out" 2>/dev/null; do
  kill -0 $client 2>/dev/null || { cat "$tmp/out"; exit 1; }
  sleep 0.1
done
sleep 1
rss1=$(rss); g1=$(gor); f1=$(fds); h1=$(heap)
wait $client || true
# Idle worker goroutines go within 10 s; a GC (pprof's heap?gc=1) returns
# the pooled per-connection objects.
sleep 12
curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
curl -fs -o /dev/null 'http://127.0.0.1:19281/debug/pprof/heap?gc=1'
rss2=$(rss); g2=$(gor); f2=$(fds); h2=$(heap)
echo "streams: $(cat "$tmp/out" | tr '\n' ' ')"
echo "baseline:     rss=${rss0} KiB heap_inuse=${h0} KiB goroutines=$g0 fds=$f0"
echo "all open:     rss=${rss1} KiB heap_inuse=${h1} KiB goroutines=$g1 fds=$f1"
echo "after (12 s): rss=${rss2} KiB heap_inuse=${h2} KiB goroutines=$g2 fds=$f2"
awk -v a="$rss0" -v b="$rss1" -v h0="$h0" -v h1="$h1" -v g0="$g0" -v g1="$g1" -v n="$n" 'BEGIN{printf "per open stream: %.1f KiB resident, %.1f KiB heap, %.2f goroutines\n", (b-a)/n, (h1-h0)/n, (g1-g0)/n}'
echo "back to baseline: goroutines $([ "$g2" -le $((g0 + 5)) ] && echo yes || echo NO)," \
  "fds $([ "$f2" -le $((f0 + 2*256 + 5)) ] && echo "yes (the idle pool keeps up to 256 connections per replica)" || echo NO)," \
  "heap in use $([ "$h2" -le $((h0 * 2 + 4096)) ] && echo yes || echo NO) (resident memory goes back to the OS as the Go runtime scavenges)"
